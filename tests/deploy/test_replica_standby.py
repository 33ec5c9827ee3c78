"""Reads from a real PostgreSQL streaming standby of the test database (docs/deploy.md, "Read
replica"): built with pg_basebackup into a temporary folder and started on another port.

One test walks the whole life of a replica, because building it costs seconds: every dashboard
page and finance API read answers from the standby what it answers from the primary; a write
on the primary that the standby has not replayed yet (replay paused) is invisible to another
reader and visible to the writer; past ``REPLICA_MAX_LAG_S`` everyone reads the primary and
/readyz says the replica lags; replay resumes and reads go back; the standby stops and reads
fall back with no error.

Needs replication connections from loopback (``.ci/run`` allows them in CI). In CI a standby
that cannot be built fails the test; elsewhere it skips, saying why.
"""

from __future__ import annotations

import datetime as dt
import re
import time
from collections.abc import Iterator
from typing import Any

import pytest
import time_machine
from django.conf import settings
from django.db import connections
from django.test import Client

from billing.models import CostProfile
from config import replica as rep
from fleet.models import FleetSettings
from tests.billing import conftest as billing
from tests.conftest import service_missing
from tests.deploy.prometheus_tools import exposition_families, promtool_run
from tests.deploy.replica_support import (
    ROUTERS,
    USAGE_TABLES,
    Standby,
    StandbyError,
    alias_add,
    alias_remove,
    captured,
    cookie,
    standby_build,
    state_set,
)
from tests.deploy.test_prometheus_conventions import REPLICA_METRICS

EXAMPLE_DAY, EXAMPLE_NOW = billing.EXAMPLE_DAY, billing.EXAMPLE_NOW
COSTS = f"/api/v1/costs?start={EXAMPLE_DAY}&end={EXAMPLE_DAY + dt.timedelta(days=1)}"
fleet, worked_example = billing.fleet, billing.worked_example  # the fixtures, here too
# The worked example's total, and with opex 0.20/h in place of 0.10/h (test_replica_routing).
TOTAL_BEFORE, TOTAL_AFTER = "20.31", "22.71"

# Rows must be committed to reach the standby; the standby is a mirror (never flushed).
pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "replica"])


@pytest.fixture(scope="module", autouse=True)
def standby(django_db_setup: Any, django_db_blocker: Any) -> Iterator[Standby | None]:
    if not settings.IS_POSTGRES:
        alias_add()  # for the test case's list of databases; the test skips
        yield None
        alias_remove()
        return
    with django_db_blocker.unblock():
        try:
            built = standby_build()
        except StandbyError as exc:
            service_missing(f"a streaming standby of the test database ({exc})")
    alias_add(host="127.0.0.1", port=built.port)
    try:
        yield built
    finally:
        alias_remove()
        built.destroy()


# The dashboard pages and the finance API's reads (the money ones for finance).
READ_PATHS = [
    "/",
    "/fleet/",
    "/fleet/heatmap/",
    "/chargeback/",
    "/breakeven/",
    "/gpus/GPU-example/",
    "/alerts/",
    *(f"{COSTS}&group_by={g}" for g in ("gpu", "node", "pool", "team", "site", "model", "fleet")),
    *(f"{COSTS}&period={p}" for p in ("day", "week", "month")),
    f"{COSTS}&format=csv",
    f"/api/v1/breakeven?pool=inference&tokens_per_s=2000&api_price_per_mtok=0.6"
    f"&start={EXAMPLE_DAY}&end={EXAMPLE_DAY + dt.timedelta(days=1)}",
    "/api/v1/gpus",
    "/api/v1/cost-profiles",
    "/api/v1/alerts",
]


def normalised(response: Any) -> tuple[int, bytes]:
    """Status and body, less what differs on every request (the CSRF token's mask)."""
    body = b"".join(response.streaming_content) if response.streaming else response.content
    return response.status_code, re.sub(rb'(csrfmiddlewaretoken" value=")[^"]+', rb"\1", body)


def total(response: Any) -> str:
    assert response.status_code == 200, response.content
    (row,) = response.json()["results"]
    return str(row["total_cost"])


def test_reads_follow_a_real_standby_its_lag_and_its_outage(
    standby: Standby | None,
    postgres: Any,
    worked_example: Any,
    make_user: Any,
    settings: Any,
) -> None:
    assert standby is not None
    settings.DATABASE_ROUTERS = ROUTERS
    settings.REPLICA_CHECK_INTERVAL_S = 3600  # each step below decides when to check
    settings.REPLICA_MAX_LAG_S = 3600
    FleetSettings.load()
    writer, reader, probe = Client(), Client(), Client()
    writer.force_login(make_user("admin"))
    reader.force_login(make_user("finance"))
    standby.wait_replayed()  # the example and both sessions are on the standby now
    rep.replica_forget()
    # 0. Every read path answers from the standby exactly what it answers from the primary.
    with time_machine.travel(EXAMPLE_NOW, tick=False):
        for url in READ_PATHS:
            state_set("down")  # the primary
            expected = normalised(reader.get(url))
            state_set("ok")
            with captured() as seen:
                answer = normalised(reader.get(url))
            assert answer == expected and expected[0] == 200, url
            assert seen.tables("replica") and seen.tables("primary") <= {"fleet_fleetsettings"}
    with time_machine.travel(EXAMPLE_NOW, tick=True):
        # 1. The replica alias is the standby, a server in recovery on its own port.
        with connections["replica"].cursor() as cursor:
            cursor.execute("SELECT pg_is_in_recovery(), inet_server_port()")
            assert cursor.fetchone() == (True, standby.port)
        with captured() as seen:
            assert total(reader.get(COSTS)) == TOTAL_BEFORE
        assert USAGE_TABLES & seen.tables("replica")
        assert seen.tables("primary") <= {"fleet_fleetsettings"}

        # 2. Replay paused: the writer's change is on the primary only.
        standby.sql("SELECT pg_wal_replay_pause()")
        profile = CostProfile.objects.get()
        changed = writer.patch(
            f"/api/v1/cost-profiles/{profile.pk}",
            {"opex_per_hour": "0.20"},
            content_type="application/json",
        )
        assert changed.status_code == 200 and cookie(changed) is not None
        assert total(reader.get(COSTS)) == TOTAL_BEFORE  # another reader: the standby, stale
        assert total(writer.get(COSTS)) == TOTAL_AFTER  # the writer: the primary

        # 3. Behind by more than the limit: everyone reads the primary; /readyz says why.
        settings.REPLICA_MAX_LAG_S = 0.5
        time.sleep(1.0)  # the last transaction the standby replayed is older than that now
        rep.replica_forget()
        with captured() as seen:
            assert total(reader.get(COSTS)) == TOTAL_AFTER
        assert seen.tables("replica") == set()
        ready = probe.get("/readyz")
        body = ready.json()
        assert ready.status_code == 200, body
        assert (body["replica"], body["reads"]) == ("lagging", "primary")
        assert body["replica_lag_s"] >= 0.5

        # 4. Replay resumes: the standby has the change, and reads go back to it.
        standby.sql("SELECT pg_wal_replay_resume()")
        standby.wait_replayed()
        settings.REPLICA_MAX_LAG_S = 10
        rep.replica_forget()
        with captured() as seen:
            assert total(reader.get(COSTS)) == TOTAL_AFTER
        assert USAGE_TABLES & seen.tables("replica")
        body = probe.get("/readyz").json()
        assert (body["replica"], body["reads"]) == ("ok", "replica")
        assert 0 <= body["replica_lag_s"] <= 10
        settings.METRICS_TOKEN = "m3trics-t0ken"
        text = probe.get("/metrics", HTTP_AUTHORIZATION="Bearer m3trics-t0ken").content.decode()
        assert "gpufleet_replica_reads 1.0" in text
        assert REPLICA_METRICS <= exposition_families(text)
        result = promtool_run("check", "metrics", stdin=text)
        assert (result.returncode, result.stdout + result.stderr) == (0, "")

        # 5. The standby stops between two checks: the page is answered from the primary,
        # the replica counts as down, and /readyz still says ready (the primary serves reads).
        standby.stop()
        assert rep.replica_state().usable  # the last check has not seen it go
        assert total(reader.get(COSTS)) == TOTAL_AFTER
        assert rep.replica_state().state == "down"
        page = reader.get("/")
        assert page.status_code == 200
        ready = probe.get("/readyz")
        body = ready.json()
        assert ready.status_code == 200, body
        assert (body["status"], body["replica"], body["reads"]) == (
            "ok",
            "error: OperationalError",
            "primary",
        )
