"""The break-even's fleet-wide view and rented pools (issue 18, items 1 and 2): the API and the
page, against figures worked out by hand.

The fleet over 2026-03-02 (24 h, wholly past), 2,000 tokens/s per GPU, API 0.60 per M tokens:
- GPU A, pool inference (the worked example of docs/metrics.md): owned, fixed 30000 / 43830 +
  0.10 = 0.784463/h, fra1 (PUE 1.5, 0.20/kWh); 24 capacity h, 9 air h, 4.95 kWh (0.95 idle over
  36,000 s; 14,400,000 J active over 36,000 s). Model H100-SXM.
- GPU B, pool batch: owned at 1.00/h (opex only), ams1 (PUE 1.25, 0.16/kWh); 24 h at 50 %
  and 300 W: 12 air h, 25,920,000 J = 7.2 kWh, all active. Model A100-SXM.
- GPU C, pool burst: rented at 2.35/h, iad1 (PUE 1.2, 0.09/kWh); 24 h at 50 % and 300 W, all
  active. Model H100-SXM (nominal idle 69 W).

Whole fleet = A + B (C is rented), 48 capacity h:
- fixed = (0.784463 × 24 + 1.00 × 24) / 48 = 42.827105 / 48 = 0.892231/h;
- P_act = (14,400,000 + 25,920,000) J / (36,000 + 86,400) s = 329.4118 W; P_idle = 95 W;
- PUE and tariff weighted by the kWh drawn: PUE = (4.95 × 1.5 + 7.2 × 1.25) / 12.15 = 16.425 /
  12.15 = 1.351852; price = (7.425 × 0.20 + 9.0 × 0.16) / 16.425 = 2.925 / 16.425 = 0.178082;
  PUE × price = 2.925 / 12.15 = 0.240741 (the energy bill over the kWh);
- u* = (0.892231 + 0.095 × 0.240741) / (4.32 − 0.234412 × 0.240741) = 0.915102 / 4.263568
  = 0.214633; measured u = 21 / 48 = 0.4375;
- C(0.4375) = 0.892231 + (0.4375 × 0.329412 + 0.5625 × 0.095) × 0.240741 = 0.939791/h; per M
  tokens 0.939791 / (0.4375 × 7.2) = 0.298346; a month (48 h × 730 / 24 = 1,460 h): own
  0.939791 × 1460 = 1,372.09, tokens 0.4375 × 7,200,000 × 1460 = 4,599 M → API 2,759.40,
  savings 1,387.31; against renting on demand at 2.35: u*_rent = 0.915102 / (2.35 − 0.056432)
  = 0.398986.

Pool burst, rented: C(u) = 2.35 (energy included): u* = 2.35 / 4.32 = 0.543981; at u = 0.5,
2.35 / 3.6 = 0.652778 per M tokens; a month (730 h): renting 1,715.50, API 0.5 × 7.2 M × 730
× 0.60 = 1,576.80, savings −138.70 (the API is cheaper). Owning instead, as the fleet owns its
H100 (GPU A: 0.784463/h, PUE 1.5 × 0.20), at burst's 300 W active and 69 W nominal idle:
C(0.5) = 0.784463 + (0.15 + 0.0345) × 0.30 = 0.839813/h → 0.233281 per M tokens, 613.06 a
month, 1,102.44 less than renting; u* = (0.784463 + 0.0207) / (4.32 − 0.0693) = 0.189419.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import time_machine
from django.urls import reverse

from tests.billing.conftest import EXAMPLE_NOW, at

URL = "/api/v1/breakeven"
DAY = {"start": "2026-03-02", "end": "2026-03-03"}
WORKLOAD = {"tokens_per_s": "2000", "api_price_per_mtok": "0.60"}


@pytest.fixture
def pools(worked_example: Any, fleet: Any) -> Any:
    from fleet.models import Gpu

    h100 = fleet.model("H100-SXM")
    Gpu.objects.filter(pk=worked_example.pk).update(model=h100)
    ams = fleet.site("ams1", pue="1.25", price_per_kwh="0.16")
    iad = fleet.site("iad1", pue="1.2", price_per_kwh="0.09")
    team = worked_example.node.pool.team
    batch = fleet.pool("batch", site=ams, team=team)
    burst = fleet.pool("burst", site=iad, team=team)
    fleet.owned("pool:batch", purchase_price="0", opex_per_hour="1.00")
    fleet.rented("pool:burst", rental_rate_per_hour="2.35")
    b = fleet.gpu(
        "GPU-b",
        node=fleet.node("gpu-b", pool=batch),
        in_service_at=at("2026-03-02T00"),
        model=fleet.model("A100-SXM", max_power_w=400, idle_power_w=50),
    )
    c = fleet.gpu(
        "GPU-c", node=fleet.node("gpu-c", pool=burst), in_service_at=at("2026-03-02T00"), model=h100
    )
    fleet.save(
        [
            fleet.usage(
                gpu,
                at(f"2026-03-02T{h:02d}"),
                samples=60,
                observed_s=3600,
                air_s=1800,
                parked_s=1800,
                energy_j=1_080_000,  # 300 W
            )
            for gpu in (b, c)
            for h in range(24)
        ]
    )
    return fleet


@pytest.fixture
def finance(role_client: Any) -> Any:
    with time_machine.travel(EXAMPLE_NOW, tick=False):
        yield role_client("finance")


def _fleet_workload(**values: Any) -> None:
    from fleet.models import FleetSettings

    FleetSettings.objects.filter(pk=FleetSettings.load().pk).update(breakeven=values)


# --- the API ---------------------------------------------------------------------------------
FLEET_FIGURES = {
    "pool": None,
    "comparison": "owned",
    "gpus": 2,
    "owned_share": 1.0,
    "fixed_rate_per_hour": "0.892231",
    "p_active_kw": 0.329412,
    "p_idle_kw": 0.095,
    "pue": 1.351852,
    "price_per_kwh": "0.178082",
    "utilization": 0.4375,
    "breakeven_utilization": 0.214633,
    "own_cost_per_mtok": "0.298346",
    "own_cost_per_month": "1372.09",
    "api_cost_per_month": "2759.40",
    "savings_per_month": "1387.31",
    "rental_rate_per_hour": "2.350000",
    "rent_breakeven_utilization": 0.398986,
    "owning_instead": None,
}


def test_fleet_wide_without_a_pool(pools: Any, finance: Any) -> None:
    body = finance.get(URL, {**DAY, **WORKLOAD, "rental_rate_per_hour": "2.35"}).json()
    assert {k: body[k] for k in FLEET_FIGURES} == FLEET_FIGURES
    # ?pool= (the page's "Whole fleet" choice) is the same view.
    blank = finance.get(URL, {**DAY, **WORKLOAD, "pool": "", "rental_rate_per_hour": "2.35"})
    assert blank.json() == body


def test_fleet_wide_with_the_fleet_files_defaults(pools: Any, finance: Any) -> None:
    """No workload parameter: the fleet file's ``[breakeven]``, the rest the product's (2.35
    on-demand), as the page opens."""
    _fleet_workload(tokens_per_s_per_gpu=2000.0, api_price_per_mtok="0.60")
    body = finance.get(URL, DAY).json()
    assert {k: body[k] for k in FLEET_FIGURES} == FLEET_FIGURES
    assert body["tokens_per_s"] == 2000 and body["api_price_per_mtok"] == "0.600000"
    # Without a fleet table: the product's 0.20 / 0.80 with 25 % output = 0.35 per M tokens.
    _fleet_workload()
    body = finance.get(URL, DAY).json()
    assert body["api_price_per_mtok"] == "0.350000" and body["rental_rate_per_hour"] == "2.350000"
    # A pool's own table wins for that pool: its throughput, the fleet's (here product) price.
    from fleet.models import Pool

    Pool.objects.filter(name="batch").update(breakeven={"tokens_per_s_per_gpu": 500.0})
    assert finance.get(URL, {**DAY, "pool": "batch"}).json()["tokens_per_s"] == 500
    assert finance.get(URL, DAY).json()["tokens_per_s"] == 2000


def test_rented_pool_is_renting_against_the_api_and_owning(pools: Any, finance: Any) -> None:
    body = finance.get(URL, {**DAY, **WORKLOAD, "pool": "burst"}).json()
    assert body["comparison"] == "rented" and body["owned_share"] == 0.0 and body["gpus"] == 1
    assert body["fixed_rate_per_hour"] == "2.350000"  # the rent
    assert body["utilization"] == 0.5
    assert body["breakeven_utilization"] == 0.543981
    assert body["own_cost_per_mtok"] == "0.652778"
    assert body["own_cost_per_month"] == "1715.50"
    assert body["api_cost_per_month"] == "1576.80"
    assert body["savings_per_month"] == "-138.70"
    # No owning-against-renting-on-demand for GPUs that are rented already.
    assert body["rental_rate_per_hour"] is None and body["rent_breakeven_utilization"] is None
    instead = body["owning_instead"]
    assert {k: v for k, v in instead.items() if k != "curve"} == {
        "models": ["NVIDIA H100 SXM"],
        "gpus": 1,
        "fixed_rate_per_hour": "0.784463",
        "pue": 1.5,
        "price_per_kwh": "0.200000",
        "breakeven_utilization": 0.189419,
        "cost_per_mtok": "0.233281",
        "cost_per_month": "613.06",
        "rent_per_month": "1715.50",
        "savings_per_month": "1102.44",
    }
    # At u = 1: (0.784463 + 0.3 × 0.30) / 7.2 = 0.874463 / 7.2 = 0.121453 per M tokens.
    assert instead["curve"][-1] == {"utilization": 1.0, "own_cost_per_mtok": "0.121453"}


def test_rented_pool_of_a_model_the_fleet_does_not_own(pools: Any, finance: Any) -> None:
    from fleet.models import Gpu

    Gpu.objects.filter(uuid="GPU-c").update(model=pools.model("RTX-4090"))
    body = finance.get(URL, {**DAY, **WORKLOAD, "pool": "burst"}).json()
    assert body["comparison"] == "rented" and body["owning_instead"] is None
    assert body["own_cost_per_month"] == "1715.50"  # renting's figures stand


def test_owned_pool_is_unchanged(pools: Any, finance: Any) -> None:
    body = finance.get(URL, {**DAY, **WORKLOAD, "pool": "inference"}).json()
    assert body["comparison"] == "owned" and body["owning_instead"] is None
    assert body["breakeven_utilization"] == 0.192258  # the worked example
    assert body["savings_per_month"] == "564.09"


# --- the page --------------------------------------------------------------------------------
def _page(client: Any, **query: str) -> str:
    params = "&".join(
        f"{k}={v}" for k, v in {"from": "2026-03-02", "to": "2026-03-02", **query}.items()
    )
    response = client.get(f"{reverse('breakeven')}?{params}")
    assert response.status_code == 200
    return response.content.decode()


def _text(html: str) -> str:
    return " ".join(re.sub(r"<[^>]+>", "", html).split())


def _kpi(html: str, ident: str) -> tuple[str, str]:
    """(label, value) of one card."""
    card = re.search(rf'id="{ident}">\s*<h3>([^<]+)</h3>\s*<p class="value"[^>]*>([^<]+)', html)
    assert card, f"{ident} missing"
    return card.group(1), card.group(2).strip()


def _figures(html: str) -> dict[str, Any]:
    found = re.findall(r'<script id="([\w-]+)" type="application/json">(.*?)</script>', html, re.S)
    return {k: json.loads(v) for k, v in found if k.startswith("chart-")}


def test_page_opens_on_the_whole_fleet(pools: Any, finance: Any) -> None:
    _fleet_workload(tokens_per_s_per_gpu=2000.0, api_price_per_mtok="0.60")
    html = _page(finance)
    assert "Whole fleet: all 2 GPUs not rented, as one pool: owning against the API" in _text(html)
    assert re.search(r'<option value="" selected>Whole fleet \(owned GPUs\)</option>', html)
    assert _kpi(html, "kpi-ustar") == ("Break-even u*: owning vs API", "21.5 %")
    assert _kpi(html, "kpi-measured") == ("Measured utilisation", "43.8 %")
    assert _kpi(html, "kpi-own-mtok") == ("Owning cost / M tokens", "0.298")
    assert _kpi(html, "kpi-savings") == ("Savings / month (API − owning)", "1,387.31")
    assert _kpi(html, "kpi-rent") == ("Owning vs renting u*", "39.9 %")
    assert "1,372.09" in html and "2,759.40" in html  # own and API a month
    # A pool chosen in the filter bar opens on that pool.
    assert "Pool inference (1 GPU, owned): owning" in _text(_page(finance, pool="inference"))


def test_page_for_a_rented_pool_says_renting(pools: Any, finance: Any) -> None:
    html = _page(
        finance,
        pool="burst",
        tokens_per_s="2000",
        price_mode="blended",
        api_price_per_mtok="0.60",
        rental_rate_per_hour="2.35",
    )
    assert (
        "Pool burst (1 GPU, rented): renting against the API and against owning these GPUs"
        in _text(html)
    )
    assert "<h1>Rent or API?</h1>" in html
    assert _kpi(html, "kpi-ustar") == ("Break-even u*: renting vs API", "54.4 %")
    assert _kpi(html, "kpi-own-mtok") == ("Renting cost / M tokens", "0.653")
    assert _kpi(html, "kpi-savings") == ("Savings / month (API − renting)", "-138.70")
    assert _kpi(html, "kpi-owning-instead") == ("Owning instead / month", "613.06")
    assert "renting 1,715.50" in html and "API 1,576.80" in html
    assert "the API is cheaper" in html and "owning would be cheaper" in html
    # Nothing calls renting "own", and no on-demand comparison for rented GPUs.
    cards = html[
        html.index('<section class="cards"') : html.index(
            "</section>", html.index('<section class="cards"')
        )
    ]
    assert "Own " not in cards and "own " not in cards.replace("Owning", "")
    assert "kpi-rent" not in html
    figures = _figures(html)
    assert "chart-rent" not in figures
    assert figures["chart-breakeven-month"]["data"][0]["x"] == ["Renting", "API", "Owning instead"]
    assert figures["chart-breakeven-month"]["data"][0]["y"] == [1715.5, 1576.8, 613.06]
    names = [trace["name"] for trace in figures["chart-breakeven"]["data"]]
    assert names == ["Renting (this pool)", "API price", "Owning instead"]


def test_page_for_a_rented_pool_of_a_model_not_owned(pools: Any, finance: Any) -> None:
    from fleet.models import Gpu

    Gpu.objects.filter(uuid="GPU-c").update(model=pools.model("RTX-4090"))
    html = _page(finance, pool="burst")
    assert "Pool burst (1 GPU, rented): renting against the API." in _text(html)
    assert _kpi(html, "kpi-owning-instead") == ("Owning instead", "unknown")
    assert "the fleet owns no GPU of this model in this period" in html


def test_weekly_email_says_renting_for_a_rented_pool(pools: Any) -> None:
    """At 4,000 tokens/s and 0.60: burst's u* = 2.35 / 8.64 = 0.271991 < 0.5, so renting
    beats the API; inference (owned) keeps "owning pays off" (u* = 0.812963 / (8.64 −
    0.0915) = 0.095104 < 0.375)."""
    import datetime as dt

    from billing.report import _pool_statuses

    _fleet_workload(tokens_per_s_per_gpu=4000.0, api_price_per_mtok="0.60")
    statuses, _ = _pool_statuses(
        start=dt.date(2026, 3, 2), end=dt.date(2026, 3, 3), now=EXAMPLE_NOW
    )
    by_pool = {s.pool: (s.status, s.verdict, s.breakeven) for s in statuses}
    assert by_pool["burst"] == ("rent", "renting beats the API", "27.2 %")
    assert by_pool["inference"] == ("own", "owning pays off", "9.5 %")


def test_page_names_a_mixed_pool_and_an_empty_fleet(pools: Any, finance: Any) -> None:
    # GPU D, rented at 1.00/h, joins pool batch beside the owned GPU B for the same 24 hours:
    # half of batch's capacity is owned, so it is compared as owned (energy scaled by 0.5).
    from fleet.models import Pool

    d = pools.gpu(
        "GPU-d",
        node=pools.node("gpu-d", pool=Pool.objects.get(name="batch")),
        in_service_at=at("2026-03-02T00"),
    )
    pools.rented("gpu:GPU-d", rental_rate_per_hour="1.00")
    pools.save([pools.usage(d, at(f"2026-03-02T{h:02d}"), observed_s=3600) for h in range(24)])
    text = _text(_page(finance, pool="batch"))
    assert "Pool batch (2 GPUs, 50.0 % of its capacity owned): owning against the API" in text
    # A day before anything was in service: the whole fleet has no GPU to show.
    empty = _text(_page(finance, **{"from": "2026-03-01", "to": "2026-03-01"}))
    assert "Whole fleet: no GPU that is not rented was in service in this period" in empty
