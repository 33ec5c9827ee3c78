"""Queue pressure's money, API and page (DESIGN.md §9.2): wanted while held priced at the
idle GPUs' hourly rate, GET /api/v1/queue (JSON, CSV, roles, bad parameters) and the Queue
page. Every figure is worked out by hand in the comments."""

from __future__ import annotations

import csv
import datetime as dt
import io
from decimal import Decimal
from typing import Any

import pytest

from billing.cost_model import money_round
from billing.selectors.queue import gpu_hour_rates, queue_cost_rows, queue_window
from fleet.models import Node
from fleet.services import ApplyResult
from telemetry.queue import queue_partitions_apply, queue_snapshot_apply
from telemetry.queue_wire import PendingJob, Snapshot
from tests.billing.conftest import FleetBuilder
from tests.billing.test_report import no_chart  # noqa: F401

T0 = dt.datetime(2026, 11, 30, 9, 0, tzinfo=dt.UTC)
HOUR = dt.timedelta(hours=1)
DAY = {"start": "2026-11-30", "end": "2026-12-01"}
# The owned profile of the worked example: 30,000.00 over 5 years + 0.10/h opex, so while
# depreciating 30000 / 43830 + 0.10 = 0.784462696783…/h.
RATE = Decimal(30000) / Decimal(43830) + Decimal("0.10")


def job(job_id: str, gpus: int, *, user: str = "alice", account: str = "nlp") -> PendingJob:
    return PendingJob(
        kind="slurm",
        job_id=job_id,
        user=user,
        account=account,
        partition="h100",
        gpus=gpus,
        gpu_model="",
        reason_class="capacity",
        reason="Resources",
        submitted=None,
        eligible=None,
    )


def wait(jobs: list[PendingJob], hours: int) -> None:
    """``jobs`` pending on cluster hpc from T0, a snapshot a minute, gone after ``hours``."""
    node = Node.objects.create(hostname="login-1")
    for k in range(60 * hours):
        at = T0 + dt.timedelta(minutes=k)
        queue_snapshot_apply(node_id=node.pk, snapshot=Snapshot("hpc", at, jobs), now=at)
    end = T0 + hours * HOUR
    queue_snapshot_apply(node_id=node.pk, snapshot=Snapshot("hpc", end, []), now=end)


def held_pool(fleet: FleetBuilder, name: str, gpus: int, hours: int) -> list[Any]:
    """A pool of ``gpus`` GPUs on one node, each held (air 0) all of the first ``hours``
    hours from T0; partition hpc/h100 runs on it."""
    site = fleet.site(f"site-{name}")
    pool = fleet.pool(name, site=site)
    node = fleet.node(f"{name}-1", pool=pool)
    bought = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    made = [
        fleet.gpu(f"GPU-{name}-{i}", node=node, index=i, in_service_at=bought) for i in range(gpus)
    ]
    fleet.save(
        [
            fleet.usage(g, T0 + h * HOUR, samples=60, observed_s=3600.0, held_s=3600.0)
            for g in made
            for h in range(hours)
        ]
    )
    queue_partitions_apply(
        document={"partitions": [{"cluster": "hpc", "name": "h100", "pools": [name]}]},
        result=ApplyResult(),
    )
    return made


@pytest.fixture
def example(fleet: FleetBuilder) -> None:
    """A job of 4 GPUs waits 2 h for capacity in hpc/h100 while its pool's 3 GPUs (owned,
    the worked example's profile) sit held: per hour min(4, 3) = 3 GPU hours wanted while
    held, 6 over the two hours; money 6 × RATE = 4.706776… → 4.71."""
    held_pool(fleet, "training", gpus=3, hours=2)
    fleet.owned("pool:training")
    wait([job("1", 4)], hours=2)


# --- money -------------------------------------------------------------------------------------
def test_six_wanted_gpu_hours_cost_six_hours_at_the_gpus_rate(example: None) -> None:
    (row,) = queue_cost_rows(start=T0, end=T0 + 2 * HOUR, group_by="partition")
    assert row["wanted_while_held_gpu_hours"] == pytest.approx(6.0)
    assert abs(row["wanted_while_held_cost"] - 6 * RATE) < Decimal("1e-20")
    assert money_round(row["wanted_while_held_cost"]) == Decimal("4.71")
    # Without money nothing is priced, and the hours are the same.
    (hours_only,) = queue_cost_rows(start=T0, end=T0 + 2 * HOUR, group_by="partition", money=False)
    assert "wanted_while_held_cost" not in hours_only
    assert hours_only["wanted_while_held_gpu_hours"] == pytest.approx(6.0)


def test_the_wanted_hours_take_the_idle_gpus_rates_pro_rata(fleet: FleetBuilder) -> None:
    """Two GPUs held an hour, rented at 2.00 and 4.00 an hour (each its own profile); one GPU
    waited for: 1 GPU hour wanted at their held-weighted mean rate 3.00 → 3.00. Split by
    user: alice waited for 0.75 of it (3 of 4 GPU-waits), bob 0.25 → 2.25 and 0.75."""
    cheap, dear = held_pool(fleet, "burst", gpus=2, hours=1)
    fleet.rented(f"gpu:{cheap.uuid}", rental_rate_per_hour="2.00")
    fleet.rented(f"gpu:{dear.uuid}", rental_rate_per_hour="4.00")
    assert gpu_hour_rates(gpu_hours=[(cheap.pk, T0), (dear.pk, T0)]) == {
        (cheap.pk, T0): Decimal("2.00"),
        (dear.pk, T0): Decimal("4.00"),
    }
    # alice waits for 3 GPUs, bob for 1, for the first 15 minutes of the hour.
    node = Node.objects.create(hostname="login-1")
    for k in range(60):
        at = T0 + dt.timedelta(minutes=k)
        jobs = [job("1", 3), job("2", 1, user="bob")] if k < 15 else []
        queue_snapshot_apply(node_id=node.pk, snapshot=Snapshot("hpc", at, jobs), now=at)
    # 15 min × 4 GPUs = 1 GPU hour waited, 2 idle: min = 1 wanted, at 3.00.
    (row,) = queue_cost_rows(start=T0, end=T0 + HOUR, group_by="partition")
    assert row["wanted_while_held_gpu_hours"] == pytest.approx(1.0)
    assert money_round(row["wanted_while_held_cost"]) == Decimal("3.00")
    by_user = {
        r["key"]: money_round(r["wanted_while_held_cost"])
        for r in queue_cost_rows(start=T0, end=T0 + HOUR, group_by="user")
    }
    assert by_user == {"alice": Decimal("2.25"), "bob": Decimal("0.75")}


def test_a_gpu_without_profile_costs_nothing(fleet: FleetBuilder) -> None:
    held_pool(fleet, "free", gpus=1, hours=1)
    wait([job("1", 1)], hours=1)
    (row,) = queue_cost_rows(start=T0, end=T0 + HOUR, group_by="partition")
    assert (row["wanted_while_held_gpu_hours"], row["wanted_while_held_cost"]) == (
        pytest.approx(1.0),
        Decimal(0),
    )


def test_the_window_is_the_report_zones_days(db: Any) -> None:
    assert queue_window(
        start=dt.date(2026, 11, 30), end=dt.date(2026, 12, 1), zone_name="Europe/Berlin"
    ) == (
        dt.datetime(2026, 11, 29, 23, tzinfo=dt.UTC),
        dt.datetime(2026, 11, 30, 23, tzinfo=dt.UTC),
    )


# --- GET /api/v1/queue -------------------------------------------------------------------------
ROW = {
    "key": "hpc/h100",
    # 4 GPUs × 2 h, all capacity; one job, gone after 7,200 s.
    "waited_gpu_hours": 8.0,
    "waited_gpu_hours_capacity": 8.0,
    "waited_gpu_hours_policy": 0.0,
    "waited_gpu_hours_user": 0.0,
    "jobs": 1,
    "wait_p50_s": 7200.0,
    "wait_p95_s": 7200.0,
    "wanted_while_held_gpu_hours": 6.0,
}


def test_finance_gets_the_rows_with_money(example: None, role_client: Any) -> None:
    body = role_client("finance").get("/api/v1/queue", DAY).json()
    assert body["count"] == 1
    assert body["results"] == [{**ROW, "wanted_while_held_cost": "4.71"}]


def test_a_viewer_gets_the_hours_without_money(example: None, role_client: Any) -> None:
    body = role_client("viewer").get("/api/v1/queue", DAY).json()
    assert body["results"] == [ROW]
    response = role_client("viewer").get("/api/v1/queue", {**DAY, "format": "csv"})
    text = b"".join(response.streaming_content).decode()
    assert "wanted_while_held_cost" not in text and "4.71" not in text
    header, line = list(csv.reader(io.StringIO(text)))
    assert header == list(ROW)


def test_csv_has_the_columns_of_the_design(example: None, role_client: Any) -> None:
    response = role_client("admin").get("/api/v1/queue", {**DAY, "format": "csv"})
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/csv")
    assert "queue_2026-11-30_2026-12-01_partition.csv" in response["Content-Disposition"]
    rows = list(csv.reader(io.StringIO(b"".join(response.streaming_content).decode())))
    assert rows == [
        [*ROW, "wanted_while_held_cost"],
        ["hpc/h100", "8.0", "8.0", "0.0", "0.0", "1", "7200.0", "7200.0", "6.0", "4.71"],
    ]


def test_csv_cells_are_neutralised(fleet: FleetBuilder, role_client: Any) -> None:
    """An account an agent sent as a formula is text in the spreadsheet."""
    held_pool(fleet, "training", gpus=1, hours=1)
    wait([job("1", 1, account="=HYPERLINK(1)")], hours=1)
    response = role_client("finance").get(
        "/api/v1/queue", {**DAY, "group_by": "account", "format": "csv"}
    )
    rows = list(csv.reader(io.StringIO(b"".join(response.streaming_content).decode())))
    assert rows[1][0] == "'=HYPERLINK(1)"


def test_groups_by_user_and_cluster(example: None, role_client: Any) -> None:
    client = role_client("finance")
    for group_by, key in (("user", "alice"), ("account", "nlp"), ("cluster", "hpc")):
        (row,) = client.get("/api/v1/queue", {**DAY, "group_by": group_by}).json()["results"]
        assert (row["key"], row["wanted_while_held_gpu_hours"], row["wanted_while_held_cost"]) == (
            key,
            6.0,
            "4.71",
        )


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ({"group_by": "pool"}, "group_by"),
        ({"start": "2026-12-02", "end": "2026-12-01"}, "end"),
        ({"start": "30.11.2026"}, "start"),
        ({"pool": "training"}, "pool"),
        ({"format": "xml"}, "format"),
        ({"limit": "0"}, "limit"),
    ],
)
def test_bad_parameters_are_400_naming_the_field(
    db: Any, role_client: Any, query: dict[str, str], field: str
) -> None:
    response = role_client("viewer").get("/api/v1/queue", query)
    assert response.status_code == 400
    assert field in response.json()


def test_post_is_still_a_node_push(db: Any, role_client: Any) -> None:
    """A session cannot push a snapshot: POST takes a node token only."""
    response = role_client("admin").post(
        "/api/v1/queue", data="{}", content_type="application/json"
    )
    assert response.status_code == 401


# --- the Queue page ----------------------------------------------------------------------------
PAGE = {"from": "2026-11-30", "to": "2026-11-30"}


def test_the_page_shows_the_worked_example(example: None, role_client: Any) -> None:
    page = role_client("finance").get("/queue/", PAGE)
    assert page.status_code == 200
    html = page.content.decode()
    assert 'id="queue-table"' in html
    for text in ("h100", "hpc", "8.0", "6.0", "4.71", "2.0 h", 'id="kpi-queue-wanted-cost"'):
        assert text in html, text
    assert "/api/v1/queue?start=2026-11-30&amp;end=2026-12-01&amp;group_by=partition" in html
    assert 'href="/queue/' in html  # the navigation links it


def test_the_page_shows_a_viewer_no_money(example: None, role_client: Any) -> None:
    html = role_client("viewer").get("/queue/", PAGE).content.decode()
    assert "6.0" in html and "8.0" in html
    assert "4.71" not in html and "kpi-queue-wanted-cost" not in html


def test_the_page_groups_by_user_worst_first(fleet: FleetBuilder, role_client: Any) -> None:
    """bob waits for 2 GPUs, alice for 1, an hour: bob (2 h) comes before alice (1 h)."""
    held_pool(fleet, "training", gpus=1, hours=1)
    wait([job("1", 1), job("2", 2, user="bob")], hours=1)
    html = role_client("viewer").get("/queue/", {**PAGE, "group_by": "user"}).content.decode()
    table = html[html.index('id="queue-table"') :]
    assert table.index(">bob<") < table.index(">alice<")
    bad = role_client("viewer").get("/queue/", {**PAGE, "group_by": "pool"}).content.decode()
    assert "group_by (one of partition, account, user)" in bad


def test_a_user_without_a_role_is_refused(db: Any, make_user: Any, client: Any) -> None:
    client.force_login(make_user(None))
    assert client.get("/api/v1/queue").status_code == 403
    assert client.get("/queue/").status_code == 403


# --- the overview ------------------------------------------------------------------------------
def _card(html: str, ident: str) -> str:
    start = html.index(f'id="{ident}"')
    return html[start : html.index("</article>", start)]


def test_the_overview_says_what_waiting_while_gpus_sat_held_cost(
    example: None, role_client: Any
) -> None:
    """The worked example on the overview: 8 GPU-h waited for capacity, 6.0 of them while the
    pool's GPUs sat held, 4.71 of those GPUs' money; the day's chart has the same 8 and 6 and
    the fleet's 6 held GPU-hours (3 GPUs × 2 h) as its line."""
    from tests.billing.test_first_minutes import _figures

    html = role_client("finance").get("/", PAGE).content.decode()
    card = _card(html, "kpi-queue")
    assert "Waited for GPUs" in card and '<p class="value">8 <span class="unit">GPU-h' in card
    assert "6.0 GPU-h of it while GPUs sat held or parked: 4.71 USD of idle GPUs" in card
    chart = _figures(html)["chart-queue"]["data"]
    assert [t["x"] for t in chart] == [["2026-11-30"]] * 3
    assert [t["y"] for t in chart] == [[8.0], [6.0], [6.0]]
    # A viewer sees the hours, not the money.
    viewer = _card(role_client("viewer").get("/", PAGE).content.decode(), "kpi-queue")
    assert "6.0 GPU-h of it while GPUs sat held or parked" in viewer and "4.71" not in viewer
    # The queue is every cluster's: with a pool chosen the overview does not show it.
    pool = role_client("finance").get("/", {**PAGE, "pool": "training"}).content.decode()
    assert 'id="kpi-queue"' not in pool and "chart-queue" not in pool


def test_the_overview_shows_no_queue_without_a_collector(
    fleet: FleetBuilder, role_client: Any
) -> None:
    held_pool(fleet, "training", gpus=3, hours=2)
    html = role_client("finance").get("/", PAGE).content.decode()
    assert 'id="kpi-queue"' not in html and "chart-queue" not in html
    assert 'id="kpi-utilization"' in html  # the overview itself is there


# --- the weekly email --------------------------------------------------------------------------
def test_the_weekly_email_has_a_queue_line(
    example: None,
    no_chart: None,  # noqa: F811
) -> None:
    from billing.report import weekly_report_build, weekly_report_render

    week = dt.date(2026, 11, 30)  # the Monday of the worked example
    data = weekly_report_build(week_start=week, now=T0 + dt.timedelta(days=8))
    assert data.queue == (
        "Queue: jobs waited 8.0 GPU-hours for capacity, 6.0 of them while as many GPUs of "
        "their partitions sat held or parked (cost 4.71 USD)."
    )
    rendered = weekly_report_render(data, with_chart=False)
    assert f"- {data.queue}\n" in rendered.text
    assert 'id="queue-line"' in rendered.html and "(cost 4.71 USD)" in rendered.html


def test_the_weekly_email_has_no_queue_line_without_a_collector(
    fleet: FleetBuilder,
    no_chart: None,  # noqa: F811
) -> None:
    from billing.report import weekly_report_build, weekly_report_render

    held_pool(fleet, "training", gpus=1, hours=1)
    data = weekly_report_build(week_start=dt.date(2026, 11, 30), now=T0 + dt.timedelta(days=8))
    assert data.queue == ""
    rendered = weekly_report_render(data, with_chart=False)
    assert "Queue:" not in rendered.text and "queue-line" not in rendered.html
