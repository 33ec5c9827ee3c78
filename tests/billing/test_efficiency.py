"""Job efficiency with money (billing/efficiency.py) and GET /api/v1/efficiency: the cost per
million tokens worked out by hand to the cent, JSON and CSV, viewers without money, bad
parameters answered 400 naming the field. Who may call it: tests/reliability/test_url_matrix.py.

The example (hour 2026-03-02 05 UTC, report time zone UTC):
- site fra1: PUE 1.5, 0.20 per kWh; pool "training" (fra1, team research), node gpu-07, GPUs A
  and B (H100 SXM), owned: 8,766.00 over 1 year + opex 0.50 → 1.00 + 0.50 = 1.50 per hour;
- pool "rented" (fra1, team research), node gpu-08, GPU C (RTX 4090), rented at 2.00 per hour
  (energy in the rent);
- job 48213 (model llama-8b) reports 3,600 s on A and 1,800 s on B; its hourly rollups: 3,600
  GPU s and 1,800,000 J on A, 3,600 GPU s and 3,600,000 J on B. Energy of the reported
  seconds: A 1,800,000 J = 0.5 kWh; B 3,600,000 × 1,800 / 3,600 = 1,800,000 J = 0.5 kWh.
  Cost: A 1 h × 1.50 + 0.5 × 1.5 × 0.20 = 1.65; B 0.5 h × 1.50 + 0.15 = 0.90; 2.55 in all.
  Tokens 1,000,000 + 500,000 → 2.55 / 1.5 = 1.70 per million;
- job 7 (model bert) reports 1,800 s on C, no workload rollup (the GPU's: 3,600 s observed,
  3,600,000 J): 0.5 h × 2.00 = 1.00 (no energy: rented); 400,000 tokens → 2.50 per million.
- by team (both research): 3.55 / 1.9 = 1.868421… per million.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
from decimal import Decimal
from typing import Any

import pytest

from billing.efficiency import efficiency_figures
from tests.billing.conftest import FleetBuilder, at

HOUR = at("2026-03-02T05")
DAY = {"start": "2026-03-02", "end": "2026-03-03"}
CENT = Decimal("0.01")


@pytest.fixture
def jobs(fleet: FleetBuilder) -> dict[str, Any]:
    from telemetry.models import JobHour, Workload, WorkloadHourlyUsage

    site = fleet.site("fra1", pue="1.5", price_per_kwh="0.20")
    team = fleet.team("research")
    training = fleet.pool("training", site=site, team=team)
    rented = fleet.pool("rented", site=site, team=team)
    since = at("2026-01-01T00")
    a = fleet.gpu("GPU-A", node=fleet.node("gpu-07", pool=training), in_service_at=since)
    b = fleet.gpu("GPU-B", node=a.node, index=1, in_service_at=since)
    c = fleet.gpu("GPU-C", node=fleet.node("gpu-08", pool=rented), in_service_at=since)
    for gpu, name in ((a, "NVIDIA H100 80GB HBM3"), (b, "NVIDIA H100 80GB HBM3")):
        gpu.name = name
        gpu.save(update_fields=["name"])
    c.name = "NVIDIA GeForce RTX 4090"
    c.save(update_fields=["name"])
    fleet.owned(
        "pool:training", purchase_price="8766.00", depreciation_years="1", opex_per_hour="0.50"
    )
    fleet.rented("pool:rented", rental_rate_per_hour="2.00")
    job = Workload.objects.create(kind="slurm", key="48213", account="nlp", created_at=HOUR)
    other = Workload.objects.create(kind="slurm", key="7", account="vision", created_at=HOUR)
    now = HOUR + dt.timedelta(hours=2)
    for gpu, energy_j in ((a, 1_800_000.0), (b, 3_600_000.0)):
        WorkloadHourlyUsage.objects.create(
            workload=job,
            gpu=gpu,
            hour=HOUR,
            gpu_s=3600,
            air_s=3000,
            energy_j=energy_j,
            computed_at=now,
            node=gpu.node,
            pool=training,
            team=team,
            site=site,
        )
    fleet.save([fleet.usage(c, HOUR, samples=60, observed_s=3600, energy_j=3_600_000)])
    # 989e12 × 3,600 × 0.4 flops on A: MFU 0.4 over A's seconds (B gave no flops)
    JobHour.objects.create(
        gpu=a,
        hour=HOUR,
        workload=job,
        model="llama-8b",
        steps=100,
        tokens=1_000_000,
        flops=989e12 * 3600 * 0.4,
        wall_s=3600,
        data_wait_s=360,
        ckpt_s=180,
        flops_wall_s=3600,
    )
    JobHour.objects.create(
        gpu=b, hour=HOUR, workload=job, model="llama-8b", steps=50, tokens=500_000, wall_s=1800
    )
    JobHour.objects.create(
        gpu=c, hour=HOUR, workload=other, model="bert", steps=10, tokens=400_000, wall_s=1800
    )
    return {"a": a, "b": b, "c": c}


def test_cost_per_million_tokens_to_the_cent(jobs: dict[str, Any]) -> None:
    start, end = dt.date(2026, 3, 2), dt.date(2026, 3, 3)
    by_workload = {
        f.row.key: f for f in efficiency_figures(start=start, end=end, group_by="workload")
    }
    job, other = by_workload["48213"], by_workload["7"]
    assert job.cost.quantize(CENT) == Decimal("2.55")
    assert job.cost_per_mtok is not None and job.cost_per_mtok.quantize(CENT) == Decimal("1.70")
    assert job.priced and job.currency == "USD"
    assert job.row.gpu_hours == 1.5 and job.row.tokens == 1_500_000
    # MFU over the seconds that gave flops: 0.4; shares over all 5,400 s
    assert job.row.mfu == pytest.approx(0.4)
    assert job.row.data_starved_share == pytest.approx(360 / 5400)
    assert job.row.checkpoint_share == pytest.approx(180 / 5400)
    assert other.cost.quantize(CENT) == Decimal("1.00")
    assert other.cost_per_mtok is not None and other.cost_per_mtok.quantize(CENT) == Decimal("2.50")
    assert other.row.mfu is None  # an RTX 4090: no peak known
    (team,) = efficiency_figures(start=start, end=end, group_by="team")
    assert team.row.key == "research"
    assert team.cost_per_mtok is not None
    assert team.cost_per_mtok.quantize(Decimal("0.000001")) == Decimal("1.868421")
    # Outside the day: nothing
    assert efficiency_figures(start=end, end=end + dt.timedelta(days=1), group_by="pool") == []


def test_fleet_file_peaks_change_mfu(jobs: dict[str, Any]) -> None:
    """``[[peaks]]`` (FleetSettings.peaks, TFLOP/s): an H100 SXM at 800 TF → MFU 0.4 × 989 /
    800; bert gave no flops → MFU null whatever the peaks."""
    from fleet.models import FleetSettings

    FleetSettings.objects.update_or_create(
        pk=1, defaults={"peaks": {"H100-SXM": 800, "RTX-4090": 165}}
    )
    rows = efficiency_figures(start=dt.date(2026, 3, 2), end=dt.date(2026, 3, 3), group_by="model")
    by = {f.row.key: f.row for f in rows}
    assert by["llama-8b"].mfu == pytest.approx(0.4 * 989 / 800)
    assert by["bert"].mfu is None


def _get(client: Any, **params: str) -> Any:
    return client.get("/api/v1/efficiency", params)


def test_api_rows_json_and_csv(jobs: dict[str, Any], role_client: Any) -> None:
    finance = role_client("finance")
    response = _get(finance, **DAY, group_by="pool")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["count"] == 2
    assert body["results"][0] == {
        "key": "training",
        "kind": None,
        "gpu_hours": 1.5,
        "steps": 150.0,
        "samples": 0.0,
        "tokens": 1_500_000.0,
        "mfu": 0.4,
        "data_starved_share": 0.0667,
        "checkpoint_share": 0.0333,
        "tokens_per_gpu_hour": 1_000_000.0,
        "cost_per_mtok": "1.700000",
        "currency": "USD",
        "priced": True,
    }
    assert body["results"][1]["key"] == "rented"
    assert body["results"][1]["cost_per_mtok"] == "2.500000"

    response = _get(finance, **DAY, group_by="team", format="csv")
    assert response["Content-Type"].startswith("text/csv")
    text = b"".join(response.streaming_content).decode()
    assert text.splitlines()[0] == (
        "key,kind,gpu_hours,steps,samples,tokens,mfu,data_starved_share,checkpoint_share,"
        "tokens_per_gpu_hour,cost_per_mtok,currency,priced"
    )
    (line,) = csv.DictReader(io.StringIO(text))
    assert (line["key"], line["gpu_hours"], line["cost_per_mtok"]) == (
        "research",
        "2.0",
        "1.868421",
    )


def test_viewers_get_rows_without_money(jobs: dict[str, Any], role_client: Any) -> None:
    viewer = role_client("viewer")
    rows = _get(viewer, **DAY).json()["results"]
    assert [r["key"] for r in rows] == ["48213", "7"]
    assert rows[0]["kind"] == "slurm" and rows[0]["mfu"] == 0.4
    assert all(not {"cost_per_mtok", "currency", "priced"} & r.keys() for r in rows)
    response = _get(viewer, **DAY, format="csv")
    header = b"".join(response.streaming_content).decode().splitlines()[0]
    assert header.endswith(",tokens_per_gpu_hour") and "cost" not in header


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"group_by": "gpu"}, "group_by"),
        ({"start": "2026-13-01"}, "start"),
        ({"start": "2026-03-02", "end": "2026-03-01"}, "end"),
        ({"groupby": "team"}, "groupby"),
        ({"limit": "-1"}, "limit"),
    ],
)
def test_bad_parameters_are_400_naming_the_field(
    db: Any, role_client: Any, params: dict[str, str], field: str
) -> None:
    finance = role_client("finance")
    response = _get(finance, **params)
    assert response.status_code == 400, response.content
    assert field in response.json()
    csv_too = _get(finance, **params, format="csv")
    assert csv_too.status_code == 400 and field in csv_too.json()


def _html(client: Any, url: str) -> str:
    response = client.get(url)
    assert response.status_code == 200, response.content[:500]
    return response.content.decode()


def test_workload_pages_show_the_training_loop(jobs: dict[str, Any], role_client: Any) -> None:
    """The Workloads page's table and a workload's page carry MFU, data-starved and
    checkpoint shares where the workload's loop reported (48213: 40.0 %, 360 / 5,400 s =
    6.7 %, 180 / 5,400 s = 3.3 %); the cost per million tokens for finance only."""
    from telemetry.models import Workload

    span = "from=2026-03-02&to=2026-03-02"
    html = _html(role_client("finance"), f"/workloads/?{span}")
    table = html[html.index('id="workload-table"') :]
    row = table[table.index(">48213<") :]
    row = row[: row.index("</tr>")]
    assert 'data-label="MFU">40.0 %<' in row
    assert 'data-label="Data wait">6.7 %<' in row and 'data-label="Ckpt">3.3 %<' in row

    job = Workload.objects.get(key="48213")
    html = _html(role_client("finance"), f"/workloads/{job.pk}/?{span}")
    cards = html[html.index('id="training-loop"') :]
    for ident, value in (
        ("kpi-mfu", "40.0 %"),
        ("kpi-data-starved", "6.7 %"),
        ("kpi-checkpoint", "3.3 %"),
        ("kpi-tokens-per-gpu-hour", "1,000,000"),
        ("kpi-cost-per-mtok", "1.7000 USD"),
    ):
        card = cards[cards.index(f'id="{ident}"') :]
        assert value in card[: card.index("</p>", card.index('class="value"'))], ident
    viewer = _html(role_client("viewer"), f"/workloads/{job.pk}/?{span}")
    assert 'id="kpi-mfu"' in viewer and 'id="kpi-cost-per-mtok"' not in viewer


# --- the break-even with the jobs' own tokens per second --------------------------------------
# Pool training: 1,500,000 tokens over 5,400 s of reports, 360 s of them waiting for data and
# 180 s checkpointing: 1,500,000 / 4,860 s computing = 308.641975… → 308.6 tokens/s per GPU.
# Pool rented: 400,000 / 1,800 = 222.2. Every pool: 1,900,000 / 6,660 = 285.285… → 285.3.
BE_DAY = {"start": "2026-03-02", "end": "2026-03-03"}


def test_measured_tokens_per_second_of_a_pool_and_of_the_fleet(jobs: dict[str, Any]) -> None:
    from telemetry.efficiency import measured_tokens_per_s

    day = dict(start=HOUR - dt.timedelta(hours=5), end=HOUR + dt.timedelta(hours=19))
    training = measured_tokens_per_s(pool="training", **day)
    assert training is not None
    assert training.tokens_per_s == pytest.approx(1_500_000 / 4_860)
    assert training.gpu_hours == pytest.approx(1.5)
    rented = measured_tokens_per_s(pool="rented", **day)
    assert rented is not None and rented.tokens_per_s == pytest.approx(400_000 / 1_800)
    fleet = measured_tokens_per_s(pool=None, **day)
    assert fleet is not None and fleet.tokens_per_s == pytest.approx(1_900_000 / 6_660)
    # No report in the range: nothing measured.
    later = dict(start=day["end"], end=day["end"] + dt.timedelta(days=1))
    assert measured_tokens_per_s(pool="training", **later) is None


def test_the_break_even_api_uses_the_measured_tokens_unless_asked_otherwise(
    jobs: dict[str, Any], role_client: Any
) -> None:
    finance = role_client("finance")
    body = finance.get("/api/v1/breakeven", {**BE_DAY, "pool": "training"}).json()
    assert (body["tokens_per_s"], body["tokens_per_s_source"]) == (308.6, "measured")
    asked = finance.get(
        "/api/v1/breakeven", {**BE_DAY, "pool": "training", "tokens_per_s": "1000"}
    ).json()
    assert (asked["tokens_per_s"], asked["tokens_per_s_source"]) == (1000.0, "query")
    # A day without reports: the fleet file's default (the product's 2,000 here).
    quiet = finance.get(
        "/api/v1/breakeven", {"start": "2026-03-04", "end": "2026-03-05", "pool": "training"}
    ).json()
    assert (quiet["tokens_per_s"], quiet["tokens_per_s_source"]) == (2000.0, "fleet file")


def test_the_break_even_page_and_the_weekly_email_say_measured(
    jobs: dict[str, Any], role_client: Any
) -> None:
    import re
    from html import unescape

    from billing.report import weekly_report_build

    html = (
        role_client("finance")
        .get("/breakeven/", {"from": "2026-03-02", "to": "2026-03-02", "pool": "training"})
        .content.decode()
    )
    assert re.search(r'name="tokens_per_s"[^>]*value="308.6"', html), "the form's default"
    said = re.search(r'id="breakeven-measured">([^<]*)<', html)
    assert said is not None and unescape(said.group(1)) == (
        "Measured: 308.6 tokens/s per GPU while computing, from 1.5 GPU-hours of the jobs' "
        "own reports; used above."
    )
    # The same pool with another figure typed in the form: the form's is used, and said.
    typed = (
        role_client("finance")
        .get(
            "/breakeven/",
            {
                "from": "2026-03-02",
                "to": "2026-03-02",
                "pool": "training",
                "tokens_per_s": "1000",
                "price_mode": "blended",
                "api_price_per_mtok": "1.50",
            },
        )
        .content.decode()
    )
    assert "; the form's 1,000.0 is used above." in unescape(typed)
    # The weekly email of that week (Monday 2 March 2026): the same default, said measured.
    data = weekly_report_build(week_start=dt.date(2026, 3, 2), now=HOUR + dt.timedelta(days=8))
    (training,) = [p for p in data.pools if p.pool == "training"]
    assert training.workload.startswith("309 tokens/s per GPU (measured by its jobs), API ")


def test_the_overview_has_the_fleet_s_job_efficiency(
    jobs: dict[str, Any], role_client: Any
) -> None:
    """The fleet of the example over its day: MFU 0.4 over the one report with flops; data
    wait 360 s and checkpoint 180 s of 7,200 s of reports (5.0 %, 2.5 %); 1,900,000 tokens over
    2 GPU-hours (950,000 per GPU-hour); money 3.55 over 1.9 M tokens = 1.868 per M tokens.
    The workloads most starved for data: 48213 (360 of its 5,400 s: 6.7 %), then 7 (0.0 %)."""
    import re
    from html import unescape

    day = {"from": "2026-03-02", "to": "2026-03-02"}
    html = unescape(role_client("finance").get("/", day).content.decode())
    card = html[
        html.index('id="kpi-efficiency"') : html.index(
            "</article>", html.index('id="kpi-efficiency"')
        )
    ]
    assert '<p class="value" title="2 GPU-hours of training loops reporting">40.0 %' in card
    assert (
        "data-starved 5.0 %, checkpointing 2.5 %, 950,000 tokens per GPU-hour, "
        "1.868 USD per M tokens"
    ) in card
    panel = html[html.index('id="efficiency-panel"') :]
    found = r"<li><a href=\"/workloads/\d+/[^\"]*\">([^<]+)</a>: waited for data ([\d.]+ %)"
    assert re.findall(found, panel)[:2] == [("slurm 48213", "6.7 %"), ("slurm 7", "0.0 %")]
    viewer = unescape(role_client("viewer").get("/", day).content.decode())
    assert 'id="kpi-efficiency"' in viewer and "per M tokens" not in viewer
    # another day: no training loop reported, no card, no panel
    other = role_client("finance").get("/", {"from": "2026-03-04", "to": "2026-03-04"})
    assert 'id="kpi-efficiency"' not in other.content.decode()
