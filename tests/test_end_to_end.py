"""The whole chain on docs/metrics.md's worked example: raw samples pushed over HTTP with a node
token → ingest → the rollup command → the finance API and the dashboard, to the cent.

Every other test checks one link; this one checks that the links agree. The expected figures
are the ones worked out by hand in docs/metrics.md.
"""

from __future__ import annotations

import datetime as dt
import json

import pytest
import time_machine
from django.core.management import call_command

from fleet.services import api_token_issue, node_token_issue

pytestmark = [pytest.mark.django_db, pytest.mark.smoke]

DAY = dt.datetime(2026, 11, 20, tzinfo=dt.UTC)
UUID = "GPU-2f6e8a1c-0000-4000-8000-0000000000e2"
MEMORY = 85_899_345_920

FLEET = f"""
currency = "USD"
report_time_zone = "UTC"
[[sites]]
name = "fra1"
pue = 1.5
price_per_kwh = "0.20"
grid_g_per_kwh = 400
[[pools]]
name = "training"
site = "fra1"
[[nodes]]
hostname = "gpu-07"
pool = "training"
[[gpus]]
uuid = "{UUID}"
node = "gpu-07"
in_service = "{DAY.isoformat()}"
[[cost_profiles]]
scope = "pool:training"
kind = "owned"
purchase_price = "30000.00"
depreciation_years = 5
opex_per_hour = "0.10"
"""


def _samples() -> list[dict[str, object]]:
    """1,200 one-minute samples: 600 busy (90 %, 400 W, a process), 300 held (0 %, 120 W,
    a process), 300 parked (0 %, 70 W, no process); the last 240 minutes send nothing."""
    samples: list[dict[str, object]] = []
    for minute in range(1200):
        if minute < 600:
            util, power, procs = 90.0, 400.0, 1
        elif minute < 900:
            util, power, procs = 0.0, 120.0, 1
        else:
            util, power, procs = 0.0, 70.0, 0
        sample: dict[str, object] = {
            "gpu": UUID,
            "start": (DAY + dt.timedelta(minutes=minute)).isoformat().replace("+00:00", "Z"),
            "seconds": 60,
            "util_pct": util,
            "procs": procs,
            "power_w": power,
        }
        # Half the samples carry the energy counter's delta, half leave energy to the
        # power × seconds fallback: both must give the same kWh.
        if minute % 2 == 0:
            sample["energy_j"] = power * 60
        samples.append(sample)
    return samples


def test_worked_example_from_http_push_to_finance_api(client, tmp_path):
    fleet_file = tmp_path / "fleet.toml"
    fleet_file.write_text(FLEET)
    with time_machine.travel(DAY + dt.timedelta(days=1), tick=False):
        call_command("fleet_apply", str(fleet_file))
        _, node_token = node_token_issue(hostname="gpu-07")
        samples = _samples()
        for i in range(0, len(samples), 400):
            body = {
                "node": {"hostname": "gpu-07", "agent_version": "1.0.0"},
                "gpus": [
                    {
                        "uuid": UUID,
                        "index": 0,
                        "name": "NVIDIA H100 80GB HBM3",
                        "memory_total_bytes": MEMORY,
                        "power_limit_w": 700.0,
                    }
                ],
                "samples": samples[i : i + 400],
            }
            response = client.post(
                "/api/v1/ingest",
                json.dumps(body),
                content_type="application/json",
                HTTP_AUTHORIZATION=f"Bearer {node_token}",
            )
            assert response.status_code == 200, response.content
            assert response.json()["accepted"] == 400
        # A replay of the first batch stores nothing new.
        replay = client.post(
            "/api/v1/ingest",
            json.dumps({"node": {"hostname": "gpu-07"}, "gpus": [], "samples": samples[:400]}),
            content_type="application/json",
            HTTP_AUTHORIZATION=f"Bearer {node_token}",
        )
        assert replay.json()["duplicates"] == 400

        call_command("rollup")

        _, api_token = api_token_issue(username="fin", role="finance")
        auth = {"HTTP_AUTHORIZATION": f"Bearer {api_token}"}
        costs = client.get("/api/v1/costs", {"start": "2026-11-20", "end": "2026-11-21"}, **auth)
        assert costs.status_code == 200, costs.content
        (row,) = costs.json()["results"]
        assert row["key"] == UUID
        assert (row["air_hours"], row["held_hours"], row["parked_hours"]) == (9.0, 6.0, 5.0)
        assert (row["offline_hours"], row["capacity_hours"]) == (4.0, 24.0)
        assert row["utilization"] == 0.375 and row["hours_in_air_per_day"] == 9.0
        assert (row["energy_kwh"], row["idle_energy_kwh"]) == (4.95, 0.95)
        assert row["total_cost"] == "20.31" and row["idle_cost"] == "12.05"
        assert row["cost_per_air_hour"] == "2.26" and row["co2e_kg"] == 2.97
        assert row["currency"] == "USD" and row["priced"] is True

        breakeven = client.get(
            "/api/v1/breakeven",
            {
                "pool": "training",
                "tokens_per_s": 2000,
                "api_price_per_mtok": "0.60",
                "rental_rate_per_hour": "2.35",
                "start": "2026-11-20",
                "end": "2026-11-21",
            },
            **auth,
        ).json()
        assert breakeven["p_active_kw"] == 0.4 and breakeven["p_idle_kw"] == 0.095
        assert breakeven["breakeven_utilization"] == 0.192258
        assert breakeven["own_cost_per_month"] == "618.51"
        assert breakeven["api_cost_per_month"] == "1182.60"
        assert breakeven["savings_per_month"] == "564.09"
        assert breakeven["rent_breakeven_utilization"] == 0.359957

        # The dashboard shows the same money (finance sees it), from the same selectors.
        client.force_login(api_token_user("fin"))
        page = client.get("/", {"from": "2026-11-20", "to": "2026-11-20"})
        assert page.status_code == 200
        assert "20.31" in page.content.decode()


def api_token_user(username: str):
    from django.contrib.auth import get_user_model

    return get_user_model().objects.get(username=username)
