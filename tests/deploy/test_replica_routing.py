"""The read-replica router's rules (config/replica.py), against a stand-in replica.

The stand-in is a second, read-only connection to the test database, so every statement can be
attributed to one side; whether the stand-in is healthy is set by hand (``state_set``). The
real standby, its lag and its outage are in test_replica_standby.py. Figures are those of the
worked example (tests/billing/conftest.py), computed there by hand.
"""

from __future__ import annotations

import datetime as dt
import logging
import socket
from collections.abc import Iterator
from typing import Any

import pytest
import time_machine
from django.db import transaction
from django.test import Client

from billing.models import CostProfile
from config import replica as rep
from fleet.models import FleetSettings, Gpu
from fleet.services import api_token_issue
from tests.billing import conftest as billing
from tests.deploy.replica_support import (
    ROUTERS,
    USAGE_TABLES,
    alias_add,
    alias_remove,
    captured,
    cookie,
    state_set,
)

# The worked example's total, and the same day with opex 0.20/h in place of 0.10/h:
# (30,000 / (5 × 8,766) + 0.20) × 24 = 21.227105 fixed + 1.485 energy = 22.712105 → 22.71.
TOTAL_BEFORE, TOTAL_AFTER = "20.31", "22.71"
EXAMPLE_DAY, EXAMPLE_NOW = billing.EXAMPLE_DAY, billing.EXAMPLE_NOW
COSTS = f"/api/v1/costs?start={EXAMPLE_DAY}&end={EXAMPLE_DAY + dt.timedelta(days=1)}"
fleet, worked_example = billing.fleet, billing.worked_example  # the fixtures, here too

# The stand-in is one of this module's databases (so the test case allows it) and a mirror of
# the test database (so it is neither created nor flushed).
pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "replica"])


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module", autouse=True)
def _stand_in(django_db_setup: Any, django_db_blocker: Any) -> Iterator[None]:
    alias_add()
    yield
    alias_remove()


@pytest.fixture
def replica(worked_example: Any, postgres: Any, settings: Any) -> Iterator[None]:
    """The stand-in replica, healthy; checks never expire unless a test says so."""
    settings.DATABASE_ROUTERS = ROUTERS
    settings.REPLICA_CHECK_INTERVAL_S = 3600
    settings.REPLICA_MAX_LAG_S = 10
    settings.REPLICA_STICKY_S = 16
    FleetSettings.load()  # so that no page creates it (a write, which pins)
    state_set("ok")
    with time_machine.travel(EXAMPLE_NOW, tick=True):
        yield
    alias_remove()  # a test may have pointed it elsewhere
    alias_add()


def total(response: Any) -> str:
    assert response.status_code == 200, response.content
    (row,) = response.json()["results"]
    return str(row["total_cost"])


def test_pages_and_the_finance_api_read_the_replica(replica: None, role_client: Any) -> None:
    finance = role_client("finance")
    for url in ("/", "/fleet/", "/fleet/heatmap/", "/chargeback/", COSTS):
        with captured() as seen:
            response = finance.get(url)
        assert response.status_code == 200, url
        # Every table a page reads, it reads from the replica; the primary answers only
        # FleetSettings.load()'s get_or_create (Django sends it to the writer).
        assert seen.tables("primary") <= {"fleet_fleetsettings"}, (url, seen.primary)
        assert USAGE_TABLES & seen.tables("replica"), url
        assert cookie(response) is None, url  # reading pins nobody
    assert total(finance.get(COSTS)) == TOTAL_BEFORE


def test_a_streamed_csv_reads_the_replica_while_it_streams(replica: None, role_client: Any) -> None:
    finance = role_client("finance")
    with captured() as seen:
        response = finance.get(COSTS + "&format=csv")
        assert response.streaming  # its rows are computed while it is sent
        body = b"".join(response.streaming_content).decode()
    assert "GPU-example" in body and TOTAL_BEFORE in body
    assert USAGE_TABLES & seen.tables("replica")
    assert seen.tables("primary") <= {"fleet_fleetsettings"}, seen.primary


def test_raw_sql_reads_go_where_the_orm_reads(replica: None) -> None:
    # The stand-in's connection is read-only (as a standby's is), the primary's is not: that
    # tells the two apart.
    @rep.replica_reads
    def read() -> tuple[str, str]:
        with rep.read_cursor(atomic=True) as cursor:
            cursor.execute("SET LOCAL work_mem = '64MB'")  # as billing/selectors.py does
            cursor.execute(
                "SELECT current_setting('work_mem'), current_setting('transaction_read_only')"
            )
            return cursor.fetchone()

    assert read() == ("64MB", "on")
    with rep.read_cursor() as cursor:  # outside a read scope: the primary
        cursor.execute("SELECT current_setting('transaction_read_only')")
        assert cursor.fetchone() == ("off",)


def test_the_admin_and_probes_read_the_primary(replica: None, role_client: Any) -> None:
    admin = role_client("admin")
    for url in ("/admin/", "/admin/billing/costprofile/", "/readyz"):
        with captured() as seen:
            assert admin.get(url).status_code == 200, url
        assert seen.tables("replica") == set(), url


def test_whoever_writes_reads_the_primary_for_a_while(replica: None, make_user: Any) -> None:
    writer, reader = Client(), Client()
    writer.force_login(make_user("admin"))
    reader.force_login(make_user("finance"))
    profile = CostProfile.objects.get()
    changed = writer.patch(
        f"/api/v1/cost-profiles/{profile.pk}",
        {"opex_per_hour": "0.20"},
        content_type="application/json",
    )
    assert changed.status_code == 200, changed.content
    sticky = cookie(changed)
    assert sticky is not None and int(sticky["max-age"]) == 16 and sticky["httponly"]
    with captured() as seen:
        assert total(writer.get(COSTS)) == TOTAL_AFTER
    assert seen.replica == []  # the writer's next page: all from the primary
    with captured() as seen:
        assert total(reader.get(COSTS)) == TOTAL_AFTER
    assert seen.tables("replica")  # somebody else: the replica
    writer.cookies.pop(rep.STICKY_COOKIE)  # the cookie expired
    with captured() as seen:
        writer.get(COSTS)
    assert seen.tables("replica")


def test_a_get_that_writes_reads_the_primary_after_its_write(
    replica: None, role_client: Any
) -> None:
    finance = role_client("finance")
    # The first visit creates the user's subscription row (get_or_create): an INSERT.
    with captured() as seen:
        response = finance.get("/reports/weekly/subscription/")
    assert response.status_code == 200
    assert any(sql.startswith("INSERT") for sql in seen.primary)
    assert cookie(response) is not None
    # The second visit writes nothing and pins nothing (its cookie aside).
    finance.cookies.pop(rep.STICKY_COOKIE)
    assert cookie(finance.get("/reports/weekly/subscription/")) is None


def test_token_clients_are_pinned_by_their_credential(replica: None) -> None:
    _, admin_token = api_token_issue(username="ops", role="admin")
    _, other_token = api_token_issue(username="fin", role="finance")
    admin = Client(HTTP_AUTHORIZATION=f"Bearer {admin_token}")
    other = Client(HTTP_AUTHORIZATION=f"Bearer {other_token}")
    profile = CostProfile.objects.get()
    changed = admin.patch(
        f"/api/v1/cost-profiles/{profile.pk}",
        {"opex_per_hour": "0.20"},
        content_type="application/json",
    )
    assert changed.status_code == 200 and cookie(changed) is None  # no cookie for a token
    with captured() as seen:
        assert total(admin.get(COSTS)) == TOTAL_AFTER
    assert seen.replica == []
    with captured() as seen:
        assert total(other.get(COSTS)) == TOTAL_AFTER
    assert seen.tables("replica")


def test_reads_in_a_transaction_on_the_primary_stay_there(replica: None) -> None:
    @rep.replica_reads
    def where() -> tuple[str, str]:
        outside = Gpu.objects.all().db
        with transaction.atomic():
            inside = Gpu.objects.all().db
        return outside, inside

    assert where() == ("replica", "default")
    # Outside any read scope (a task, a command) everything reads the primary.
    assert Gpu.objects.all().db == "default"


def test_objects_read_from_the_replica_are_saved_on_the_primary(replica: None) -> None:
    @rep.replica_reads
    def read() -> Any:
        return Gpu.objects.get(uuid="GPU-example")

    gpu = read()
    assert gpu._state.db == "replica"
    gpu.index = 5
    gpu.save()  # the replica connection is read-only: this only works on the primary
    assert Gpu.objects.get(uuid="GPU-example").index == 5
    assert rep.ReplicaRouter().allow_migrate("replica", "fleet") is False


def test_a_lagging_or_missing_replica_leaves_reads_on_the_primary(
    replica: None, role_client: Any, client: Any
) -> None:
    finance = role_client("finance")
    state_set("lagging", 42.0)
    with captured() as seen:
        assert total(finance.get(COSTS)) == TOTAL_BEFORE
    assert seen.replica == []
    # /readyz checks anew: the stand-in answers but is no standby, so reads stay put, and the
    # service is ready all the same (the primary serves them).
    body = client.get("/readyz").json()
    assert (body["status"], body["replica"], body["reads"]) == ("ok", "not_standby", "primary")
    alias_remove()
    alias_add(port=closed_port())
    response = client.get("/readyz")
    body = response.json()
    assert response.status_code == 200
    assert (body["replica"], body["replica_lag_s"], body["reads"]) == (
        "error: OperationalError",
        None,
        "primary",
    )
    assert total(finance.get(COSTS)) == TOTAL_BEFORE  # the check just said down


def test_metrics_say_where_reads_go(replica: None, client: Any, settings: Any) -> None:
    settings.METRICS_TOKEN = "m3trics-t0ken"
    auth = {"HTTP_AUTHORIZATION": "Bearer m3trics-t0ken"}
    text = client.get("/metrics", **auth).content.decode()
    # The stand-in answers but is no standby: reads stay on the primary, lag unknown. (A real
    # standby's figures: test_replica_standby.py.)
    assert "gpufleet_replica_reads 0.0" in text and "gpufleet_replica_lag_seconds" not in text


def test_a_replica_that_fails_mid_request_is_answered_from_the_primary(
    replica: None, role_client: Any, caplog: Any
) -> None:
    finance = role_client("finance")
    alias_remove()
    alias_add(port=closed_port())
    state_set("ok")  # the last check was fine; the replica went away since
    caplog.set_level(logging.WARNING, logger="config.replica")
    assert total(finance.get(COSTS)) == TOTAL_BEFORE
    assert rep.replica_state().state == "down"
    assert "read again from the primary" in caplog.text
    state_set("ok")
    page = finance.get("/")
    assert page.status_code == 200 and b"GPU" in page.content


def test_the_weekly_report_reads_the_replica_and_falls_back(replica: None) -> None:
    from billing.report import weekly_report_build

    week = EXAMPLE_DAY - dt.timedelta(days=EXAMPLE_DAY.weekday())
    with captured() as seen:
        data = weekly_report_build(week_start=week)
    assert seen.tables("replica") and seen.tables("primary") <= {"fleet_fleetsettings"}
    alias_remove()
    alias_add(port=closed_port())
    state_set("ok")
    again = weekly_report_build(week_start=week)
    assert again.row.total_cost == data.row.total_cost and data.row.total_cost > 0
    assert rep.replica_state().state == "down"
