"""GET /api/v1/breakeven against docs/metrics.md's worked example, computed by hand."""

from __future__ import annotations

from typing import Any

import pytest
import time_machine

from tests.billing.conftest import EXAMPLE_NOW

URL = "/api/v1/breakeven"
QUERY = {
    "pool": "inference",
    "start": "2026-03-02",
    "end": "2026-03-03",
    "tokens_per_s": "2000",
    "api_price_per_mtok": "0.60",
    "rental_rate_per_hour": "2.35",
}


@pytest.fixture
def finance(role_client: Any) -> Any:
    with time_machine.travel(EXAMPLE_NOW, tick=False):
        yield role_client("finance")


def test_breakeven_equals_the_worked_example(worked_example: Any, finance: Any) -> None:
    response = finance.get(URL, QUERY)
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["pool"] == "inference" and body["currency"] == "USD"
    assert body["window_start"] == "2026-03-02T00:00:00+00:00"
    assert body["window_end"] == "2026-03-03T00:00:00+00:00"
    # fixed_rate = 30000 / 43830 + 0.10 = 0.784463; P_act 0.400 kW, P_idle 0.095 kW.
    assert body["fixed_rate_per_hour"] == "0.784463"
    assert body["p_active_kw"] == 0.4 and body["p_idle_kw"] == 0.095
    assert body["pue"] == 1.5 and body["price_per_kwh"] == "0.200000"
    assert body["utilization"] == 0.375
    # u* = 0.812963 / 4.2285 = 0.192258; C(0.375) / (0.375 × 2000 × 3600) × 1e6 = 0.313806.
    assert body["breakeven_utilization"] == 0.192258
    assert body["own_cost_per_mtok"] == "0.313806"
    assert body["own_cost_per_month"] == "618.51"
    assert body["api_cost_per_month"] == "1182.60"
    assert body["savings_per_month"] == "564.09"
    assert body["rent_breakeven_utilization"] == 0.359957
    assert body["api_price_per_mtok"] == "0.600000"
    assert [p["utilization"] for p in body["curve"]] == [round(0.05 * i, 2) for i in range(1, 21)]
    assert body["curve"][-1]["own_cost_per_mtok"] is not None


def test_breakeven_split_prices(worked_example: Any, finance: Any) -> None:
    query = {k: v for k, v in QUERY.items() if k != "api_price_per_mtok"}
    query |= {
        "api_input_price_per_mtok": "0.40",
        "api_output_price_per_mtok": "1.20",
        "output_share": "0.25",
    }
    body = finance.get(URL, query).json()
    assert body["api_price_per_mtok"] == "0.600000"  # 0.75 × 0.40 + 0.25 × 1.20
    assert body["breakeven_utilization"] == 0.192258


def test_breakeven_unknown_pool_is_404(worked_example: Any, finance: Any) -> None:
    response = finance.get(URL, {**QUERY, "pool": "nope"})
    assert response.status_code == 404
    assert "pool" in response.json()


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"tokens_per_s": "0"}, "tokens_per_s"),
        ({"tokens_per_s": "NaN"}, "tokens_per_s"),
        ({"tokens_per_s": "inf"}, "tokens_per_s"),
        ({"tokens_per_s": "1e301"}, "tokens_per_s"),  # found by the fuzz test: was a 500
        ({"api_price_per_mtok": "-1"}, "api_price_per_mtok"),
        ({"api_price_per_mtok": ""}, "api_price_per_mtok"),
        ({"api_price_per_mtok": None, "output_share": "0.3"}, "api_input_price_per_mtok"),
        ({"output_share": "0.3"}, "api_price_per_mtok"),
        ({"rental_rate_per_hour": "cheap"}, "rental_rate_per_hour"),
        ({"rental_rate_per_hour": ""}, "rental_rate_per_hour"),  # blank is not "left out"
        ({"tokens_per_s": ""}, "tokens_per_s"),
        ({"end": "2026-03-01"}, "end"),
    ],
)
def test_breakeven_bad_parameters_are_400(
    worked_example: Any,
    finance: Any,
    change: Any,
    field: Any,
) -> None:
    query = {k: v for k, v in {**QUERY, **change}.items() if v is not None}
    response = finance.get(URL, query)
    assert response.status_code == 400, response.content
    assert field in response.json()


def test_breakeven_at_the_largest_inputs_is_answered(worked_example: Any, finance: Any) -> None:
    # The most tokens per second and the highest prices the parameters take: every money
    # figure still rounds to cents (28 digits), so an answer, not a 500.
    most = "99999999.999999"
    query = {**QUERY, "tokens_per_s": "1e9", "api_price_per_mtok": most}
    response = finance.get(URL, {**query, "rental_rate_per_hour": most})
    assert response.status_code == 200, response.content
    assert len(response.json()["api_cost_per_month"].split(".")[0]) > 15


def test_breakeven_missing_split_price_names_it(worked_example: Any, finance: Any) -> None:
    query = {k: v for k, v in QUERY.items() if k != "api_price_per_mtok"}
    query |= {"api_input_price_per_mtok": "0.40", "output_share": "0.25"}
    body = finance.get(URL, query).json()
    assert list(body) == ["api_output_price_per_mtok"]
