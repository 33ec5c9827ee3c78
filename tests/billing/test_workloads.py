"""Workload figures (docs/metrics.md, "Workloads"): the worked example to the cent, from raw
samples through the rollup, on both dialects; groups as sums; team rules; filters; a GPU whose
depreciation ends inside the period.

The worked example, by hand. One owned profile: 30,000.00 over 5 years (43,830 h) + opex
0.10/h = 0.684462697… + 0.10 = 0.784462697…/h; site PUE 1.5, 0.20/kWh (0.30 per kWh drawn).
GPU A, one hour of 60 samples × 60 s at 80 %, 400 W (24,000 J each), jobs 101 and 102 each
share_s 30, air_s 24 per sample:
  each: GPU hours 60 × 30 / 3600 = 0.5; air 60 × 24 / 3600 = 0.4; held 0.1; util 0.8;
        energy 60 × 24,000 × 30 / 60 = 720,000 J = 0.2 kWh;
        cost = 0.5 × 0.784462697 + 0.2 × 0.30 = 0.392231348 + 0.06 = 0.452231348 → 0.45;
        idle = cost × held / GPU hours = 0.452231348 × 0.2 = 0.090446270 → 0.09.
GPU B, the same hour, 60 samples at 0 %, 70 W (4,200 J each), job 103 holding its allocation
(share_s 60, air_s 0):
  GPU hours 1.0; air 0; held 1.0; energy 60 × 4,200 = 252,000 J = 0.07 kWh;
  cost = 0.784462697 + 0.07 × 0.30 = 0.805462697 → 0.81; idle = cost → 0.81.
Account nlp (101 and 103): cost 0.452231348 + 0.805462697 = 1.257694045 → 1.26; idle
0.090446270 + 0.805462697 = 0.895908967 → 0.90; GPU hours 1.5, air 0.4, utilisation 0.4 / 1.5.
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

import pytest
from django.utils import timezone

from billing.cost_model import money_round
from billing.workloads import TeamRule, WorkloadFilters, team_rule_match, workload_figures
from telemetry.models import Workload, WorkloadHourlyUsage
from tests.billing.conftest import FleetBuilder
from tests.billing.conftest import workload_span as _span


@pytest.fixture
def hour(workload_hour: dt.datetime) -> dt.datetime:
    return workload_hour


RATE = Decimal(30000) / Decimal(43830) + Decimal("0.10")


def _money(rows: list[Any]) -> dict[str, tuple[Decimal, Decimal]]:
    return {r.key: (money_round(r.cost), money_round(r.idle_cost)) for r in rows}


@pytest.mark.smoke
def test_the_worked_example_per_workload_to_the_cent(
    workload_example: dict[str, Any], hour: dt.datetime
) -> None:
    rows = workload_figures(**_span(hour), group_by="workload")
    assert [r.key for r in rows] == ["103", "101", "102"]  # worst idle cost first
    by = {r.key: r for r in rows}
    assert _money(rows) == {
        "101": (Decimal("0.45"), Decimal("0.09")),
        "102": (Decimal("0.45"), Decimal("0.09")),
        "103": (Decimal("0.81"), Decimal("0.81")),
    }
    # Unrounded, against the hand computation in full precision (floats of the rollup: 1e-9).
    assert abs(by["101"].cost - (RATE / 2 + Decimal("0.06"))) < Decimal("1e-9")
    assert abs(by["101"].idle_cost - (RATE / 2 + Decimal("0.06")) / 5) < Decimal("1e-9")
    assert abs(by["103"].idle_cost - (RATE + Decimal("0.021"))) < Decimal("1e-9")
    one = by["101"]
    assert (one.gpu_hours, one.air_hours) == pytest.approx((0.5, 0.4))
    assert one.held_hours == pytest.approx(0.1)
    assert one.utilization == pytest.approx(0.8)
    assert one.energy_kwh == pytest.approx(0.2)
    assert (one.kind, one.name, one.user, one.account, one.team, one.site, one.gpus) == (
        "slurm", "job-101", "alice", "nlp", "research", "fra1", 1,
    )  # fmt: skip
    assert one.currency == "EUR" and one.priced
    assert one.first_seen == hour and one.last_seen == hour + dt.timedelta(hours=1)
    assert by["103"].utilization == 0.0 and by["103"].held_hours == pytest.approx(1.0)


@pytest.mark.smoke
def test_the_worked_example_per_account_is_the_sum_of_its_workloads(
    workload_example: dict[str, Any], hour: dt.datetime
) -> None:
    rows = workload_figures(**_span(hour), group_by="account")
    assert _money(rows) == {
        "nlp": (Decimal("1.26"), Decimal("0.90")),
        "vision": (Decimal("0.45"), Decimal("0.09")),
    }
    nlp = rows[0]
    assert (nlp.key, nlp.gpus, nlp.workloads, nlp.user, nlp.account) == ("nlp", 2, 2, None, "nlp")
    assert nlp.gpu_hours == pytest.approx(1.5) and nlp.air_hours == pytest.approx(0.4)
    assert nlp.utilization == pytest.approx(0.4 / 1.5)  # a ratio of the sums
    assert nlp.energy_kwh == pytest.approx(0.27)
    users = _money(workload_figures(**_span(hour), group_by="user"))
    assert users == {
        "carol": (Decimal("0.81"), Decimal("0.81")),
        "alice": (Decimal("0.45"), Decimal("0.09")),
        "bob": (Decimal("0.45"), Decimal("0.09")),
    }
    teams = workload_figures(**_span(hour), group_by="team")
    # All three on the pool's team: 2 × 0.452231348 + 0.805462697 = 1.709925393.
    assert _money(teams) == {"research": (Decimal("1.71"), Decimal("0.99"))}


def test_team_rules_first_match_wins_else_the_pools_team(
    workload_example: dict[str, Any], fleet: FleetBuilder, hour: dt.datetime
) -> None:
    from billing.models import WorkloadTeamRule

    nlp_team = fleet.team("nlp-team")
    other = fleet.team("other")
    WorkloadTeamRule.objects.create(position=0, match_field="account", pattern="nl*", team=nlp_team)
    WorkloadTeamRule.objects.create(position=1, match_field="user", pattern="alice", team=other)
    teams = _money(workload_figures(**_span(hour), group_by="team"))
    assert teams == {
        "nlp-team": (Decimal("1.26"), Decimal("0.90")),  # 101 and 103 (the first rule wins)
        "research": (Decimal("0.45"), Decimal("0.09")),  # 102: no rule, its pool's team
    }
    only = workload_figures(
        **_span(hour), group_by="workload", filters=WorkloadFilters(teams=("research",))
    )
    assert [r.key for r in only] == ["102"]


def test_team_rule_match_by_field_and_prefix() -> None:
    rules = [
        TeamRule("id", "48*", 1),
        TeamRule("kind", "k8s", 2),
        TeamRule("user", "alice", 3),
        TeamRule("account", "nlp", 4),
    ]
    match = team_rule_match
    assert match(rules, kind="slurm", key="4821", user="x", account="y") == 1
    assert match(rules, kind="k8s", key="ns/pod", user="alice", account="nlp") == 2
    assert match(rules, kind="slurm", key="9", user="alice", account="nlp") == 3
    assert match(rules, kind="slurm", key="9", user="bob", account="nlp") == 4
    assert match(rules, kind="slurm", key="9", user="bob", account="nlpx") is None


def test_filters_and_the_pages_groupings(
    workload_example: dict[str, Any], hour: dt.datetime
) -> None:
    span = _span(hour)
    f = WorkloadFilters
    assert [r.key for r in workload_figures(**span, filters=f(users=("bob",)))] == ["102"]
    assert [r.key for r in workload_figures(**span, filters=f(accounts=("nlp",)))] == [
        "103",
        "101",
    ]
    assert workload_figures(**span, filters=f(kinds=("k8s",))) == []
    assert len(workload_figures(**span, filters=f(sites=("fra1",)))) == 3
    on_a = workload_figures(**span, filters=f(gpus=("GPU-A",)))
    assert sorted(r.key for r in on_a) == ["101", "102"]
    job = workload_example["jobs"]["101"]
    per_gpu = workload_figures(**span, group_by="gpu", filters=f(workloads=(job.pk,)))
    assert [(r.gpu_uuid, r.gpu_label, money_round(r.cost)) for r in per_gpu] == [
        ("GPU-A", "gpu-01#0", Decimal("0.45"))
    ]
    per_day = workload_figures(**span, group_by="day", filters=f(workloads=(job.pk,)))
    assert [(r.day, r.gpu_hours) for r in per_day] == [(hour.date(), pytest.approx(0.5))]
    with pytest.raises(ValueError, match="^group_by"):
        workload_figures(**span, group_by="pool")
    with pytest.raises(ValueError, match="^end"):
        workload_figures(start=span["end"], end=span["start"])


def test_the_rate_changes_where_depreciation_ends_inside_the_period(
    fleet: FleetBuilder,
) -> None:
    """Bought for 8,766.00 over 1 year: 1.00/h + opex 0.10 while depreciating, 0.10 after.
    In service 2025-03-01 00:00 UTC, so depreciation ends 8,766 h later: 2026-03-01 06:00 UTC.
    One workload held the GPU 05:00–07:00 on that day, idle (air 0), no energy: hour 05 at
    1.10, hour 06 at 0.10 → cost = idle = 1.20 (a single rate over both would say 2.20 or
    0.20)."""
    site = fleet.site("fra1", pue="1.0", price_per_kwh="0")
    pool = fleet.pool("p", site=site)
    node = fleet.node("n1", pool=pool)
    gpu = fleet.gpu("GPU-D", node=node, in_service_at=dt.datetime(2025, 3, 1, tzinfo=dt.UTC))
    fleet.owned("pool:p", purchase_price="8766.00", depreciation_years="1", opex_per_hour="0.10")
    job = Workload.objects.create(site=site, kind="user", key="dora", created_at=timezone.now())
    for h in (5, 6):
        WorkloadHourlyUsage.objects.create(
            workload=job, gpu=gpu, hour=dt.datetime(2026, 3, 1, h, tzinfo=dt.UTC), site=site,
            pool=pool, samples=60, gpu_s=3600.0, air_s=0.0, energy_j=0.0,
            computed_at=timezone.now(),
        )  # fmt: skip
    (row,) = workload_figures(start=dt.date(2026, 3, 1), end=dt.date(2026, 3, 2))
    assert (row.cost, row.idle_cost) == (Decimal("1.2"), Decimal("1.2"))
    assert row.team == "(none)"  # no rule, no pool team


# --- [[workload_teams]] in the fleet file -----------------------------------------------------
def _document(rules: Any) -> dict[str, Any]:
    return {
        "currency": "EUR",
        "teams": [{"name": "research"}, {"name": "platform"}],
        "workload_teams": rules,
    }


def test_workload_teams_are_applied_in_file_order_and_replaced(db: Any) -> None:
    from billing.models import WorkloadTeamRule
    from billing.services import fleet_document_apply

    rules = [
        {"match": "account:nlp", "team": "research"},
        {"match": "id:48*", "team": "platform"},
    ]
    result = fleet_document_apply(document=_document(rules))
    assert result.updated["workload_teams"] == 2
    got = [(r.match, r.team.name) for r in WorkloadTeamRule.objects.select_related("team")]
    assert got == [("account:nlp", "research"), ("id:48*", "platform")]
    again = fleet_document_apply(document=_document(rules))
    assert "workload_teams" not in again.updated  # the same file twice changes nothing
    fleet_document_apply(document=_document(list(reversed(rules))))
    assert [r.match for r in WorkloadTeamRule.objects.all()] == ["id:48*", "account:nlp"]
    fleet_document_apply(document=_document([]))
    assert not WorkloadTeamRule.objects.exists()


@pytest.mark.parametrize(
    ("rules", "message"),
    [
        ([{"match": "group:x", "team": "research"}], r"workload_teams\[0\]\.match: expected"),
        ([{"match": "account:", "team": "research"}], r"workload_teams\[0\]\.match: expected"),
        ([{"match": "user:*", "team": "research"}], r"workload_teams\[0\]\.match: expected"),
        ([{"match": 3, "team": "research"}], r"workload_teams\[0\]\.match: expected"),
        ([{"match": "user:a\x07", "team": "research"}], r"workload_teams\[0\]\.match: must"),
        ([{"match": "user:a"}], r"workload_teams\[0\]\.team: required"),
        ([{"match": "user:a", "team": "nobody"}], r"workload_teams\[0\]\.team: no team named"),
        (
            [{"match": "user:a", "team": "research"}, {"match": "kind:k8s", "tema": "x"}],
            r"workload_teams\[1\]\.tema: unknown",
        ),
        ({"match": "user:a"}, r"workload_teams: must be an array of tables"),
    ],
)
def test_workload_teams_reject_naming_the_field(db: Any, rules: Any, message: str) -> None:
    from billing.services import fleet_document_apply
    from fleet.services import FleetFileError

    with pytest.raises(FleetFileError, match=message):
        fleet_document_apply(document=_document(rules))


def test_workload_accounts_sum_per_account_as_the_full_path(
    workload_example: dict[str, Any], fleet: FleetBuilder, hour: dt.datetime
) -> None:
    """The overview's lean per-account sums: the same hours and money as the accounts of
    workload_figures (1.26 / 0.90 for nlp), without the per-workload fields."""
    from billing.workloads import workload_accounts

    lean = workload_accounts(**_span(hour))
    full = workload_figures(**_span(hour), group_by="account")
    assert (
        _money(lean)
        == _money(full)
        == {
            "nlp": (Decimal("1.26"), Decimal("0.90")),
            "vision": (Decimal("0.45"), Decimal("0.09")),
        }
    )
    assert [(r.key, r.gpus, r.gpu_hours, r.held_hours) for r in lean] == [
        (r.key, r.gpus, r.gpu_hours, r.held_hours) for r in full
    ]
    assert (lean[0].cost, lean[0].idle_cost) == (full[0].cost, full[0].idle_cost)
    with pytest.raises(ValueError, match="^team"):
        workload_accounts(**_span(hour), filters=WorkloadFilters(teams=("research",)))


def test_a_window_of_hours(workload_example: dict[str, Any], hour: dt.datetime) -> None:
    """Aware datetimes select the hours that start in [start, end) (an alert's window)."""
    rows = workload_figures(start=hour, end=hour + dt.timedelta(hours=1))
    assert _money(rows)["103"] == (Decimal("0.81"), Decimal("0.81"))
    assert (
        workload_figures(start=hour + dt.timedelta(hours=1), end=hour + dt.timedelta(hours=5)) == []
    )
    with pytest.raises(ValueError, match="^start"):
        workload_figures(start=hour.replace(tzinfo=None), end=hour.replace(tzinfo=None, hour=5))


def test_workload_teams_in_the_admin_read_only(db: Any, role_client: Any) -> None:
    from billing.services import fleet_document_apply

    fleet_document_apply(document=_document([{"match": "account:nlp", "team": "research"}]))
    admin = role_client("admin")
    page = admin.get("/admin/billing/workloadteamrule/")
    assert page.status_code == 200 and "account:nlp" in page.content.decode()
    assert admin.get("/admin/billing/workloadteamrule/add/").status_code == 403


def test_limits_keep_the_worst_rows(workload_example: dict[str, Any], hour: dt.datetime) -> None:
    from billing.workloads import workload_figures_by

    got = workload_figures_by(**_span(hour), group_bys=("workload", "user"), limits={"workload": 1})
    assert [r.key for r in got["workload"]] == ["103"]  # idle 0.81
    assert len(got["user"]) == 3  # no limit there
    held = workload_figures_by(
        **_span(hour), group_bys=("workload",), limits={"workload": 2}, worst="held_hours"
    )
    assert [r.key for r in held["workload"]] == ["103", "101"]  # 1.0 h, then 0.1 h (by key)
    with pytest.raises(ValueError, match="^worst"):
        workload_figures_by(**_span(hour), group_bys=("workload",), worst="cost")


# --- the daily pre-aggregate (telemetry.WorkloadDailyUsage) ---------------------------------
def _daily_vs_hourly() -> tuple[dict[Any, tuple[Any, ...]], dict[Any, tuple[Any, ...]]]:
    """The daily rows, and the hourly rows summed per (workload, GPU, UTC day) in Python (the
    example's report time zone is UTC)."""
    from telemetry.models import WorkloadDailyUsage

    daily = {
        (r.workload_id, r.gpu_id, r.day): (r.hours, r.gpu_s, r.air_s, r.energy_j, r.held_energy_j)
        for r in WorkloadDailyUsage.objects.all()
    }
    summed: dict[Any, list[Any]] = {}
    for r in WorkloadHourlyUsage.objects.all():
        acc = summed.setdefault((r.workload_id, r.gpu_id, r.hour.date()), [0, 0.0, 0.0, 0.0, 0.0])
        held = r.energy_j * (r.gpu_s - r.air_s) / r.gpu_s if r.gpu_s > 0 else 0.0
        for i, value in enumerate((1, r.gpu_s, r.air_s, r.energy_j, held)):
            acc[i] += value
    return daily, {k: tuple(v) for k, v in summed.items()}


def test_the_daily_rows_are_the_hourly_sums_after_late_data(
    workload_example: dict[str, Any], hour: dt.datetime
) -> None:
    """The rollup keeps the daily rows: after the example's hour, job 101's row on GPU A is
    1,800 GPU s (60 × 30), 1,440 air s (60 × 24), 720,000 J, held 144,000 J (720,000 × 6/30).
    Late samples for the next hour (job 101 alone on GPU A, share 60, air 48, 24,000 J) add
    3,600 s, 2,880 s, 1,440,000 J and 288,000 J held; re-rolling both hours changes nothing."""
    from telemetry.models import WorkloadDailyUsage
    from telemetry.rollup import rollup_hours, rollup_run
    from tests.telemetry.conftest import sample, samples_ingest

    jobs, a = workload_example["jobs"], workload_example["a"]
    day = hour.date()
    row = WorkloadDailyUsage.objects.get(workload=jobs["101"], gpu=a, day=day)
    assert (row.hours, row.gpu_s, row.air_s, row.energy_j) == (1, 1800.0, 1440.0, 720_000.0)
    assert row.held_energy_j == pytest.approx(144_000.0)
    late = [
        sample(a, hour + dt.timedelta(hours=1, minutes=m), util=80.0, energy_j=24_000.0,
               procs=1, workload_ids=[jobs["101"].pk], workload_share_s=[60.0],
               workload_air_s=[48.0])
        for m in range(60)
    ]  # fmt: skip
    samples_ingest(late)
    rollup_run()
    row = WorkloadDailyUsage.objects.get(workload=jobs["101"], gpu=a, day=day)
    assert (row.hours, row.gpu_s, row.air_s, row.energy_j) == (2, 5400.0, 4320.0, 2_160_000.0)
    assert row.held_energy_j == pytest.approx(432_000.0)
    rollup_hours([hour, hour + dt.timedelta(hours=1)])
    rollup_run()
    daily, summed = _daily_vs_hourly()
    assert daily.keys() == summed.keys() and len(daily) == 3
    for key, sums in summed.items():
        assert daily[key] == pytest.approx(sums)


def _every_grouping(hour: dt.datetime) -> dict[str, list[Any]]:
    from billing.workloads import PAGE_GROUP_BY, workload_accounts, workload_figures_by

    out = workload_figures_by(**_span(hour), group_bys=PAGE_GROUP_BY)
    out["accounts"] = workload_accounts(**_span(hour))
    # Money to 1e-12: a day's rate over the whole window and the same rate over each of its
    # hours differ in Decimal's 28th digit.
    for rows in out.values():
        for r in rows:
            r.cost, r.idle_cost = (
                r.cost.quantize(Decimal("1e-12")),
                r.idle_cost.quantize(Decimal("1e-12")),
            )
    return out


def test_the_daily_and_the_hourly_path_give_the_same_figures(
    workload_example: dict[str, Any], hour: dt.datetime, role_client: Any
) -> None:
    """Every grouping, the accounts' panel and the Workloads page itself, read from the daily
    rows (the rollup set them up), then from the hourly rows (the daily table out of use)."""
    from telemetry.models import WorkloadDailyState, WorkloadDailyUsage

    assert WorkloadDailyState.objects.get().zone == "UTC"
    assert WorkloadDailyUsage.objects.count() == 3
    span = _span(hour)
    url = f"/workloads/?from={span['start']}&to={span['start']}"
    client = role_client("finance")
    daily, daily_page = _every_grouping(hour), client.get(url).content
    assert _money(daily["workload"])["103"] == (Decimal("0.81"), Decimal("0.81"))
    WorkloadDailyState.objects.all().delete()
    hourly, hourly_page = _every_grouping(hour), client.get(url).content
    assert daily == hourly
    assert _main(daily_page) == _main(hourly_page)
    assert "0.81" in _main(daily_page)


def _main(page: bytes) -> str:
    """A page's content, less its head and nav (a fresh CSRF token and nonce each time)."""
    html = page.decode()
    return html[html.index('id="kpi-workloads"') : html.index("</main>")]


def test_a_rate_change_inside_the_period_on_the_daily_path(fleet: FleetBuilder) -> None:
    """test_the_rate_changes_where_depreciation_ends_inside_the_period's GPU beside one whose
    rate does not change, with the daily table in use: the first is still priced per hour
    (1.20), the second from its daily row (2 h × 0.10 = 0.20)."""
    from telemetry.rollup import workload_daily_rebuild

    site = fleet.site("fra1", pue="1.0", price_per_kwh="0")
    pool = fleet.pool("p", site=site)
    node = fleet.node("n1", pool=pool)
    gpu = fleet.gpu("GPU-D", node=node, in_service_at=dt.datetime(2025, 3, 1, tzinfo=dt.UTC))
    old = fleet.gpu("GPU-E", node=node, in_service_at=dt.datetime(2020, 3, 1, tzinfo=dt.UTC))
    fleet.owned("pool:p", purchase_price="8766.00", depreciation_years="1", opex_per_hour="0.10")
    job = Workload.objects.create(site=site, kind="user", key="dora", created_at=timezone.now())
    other = Workload.objects.create(site=site, kind="user", key="eve", created_at=timezone.now())
    for held, on in ((job, gpu), (other, old)):
        for h in (5, 6):
            WorkloadHourlyUsage.objects.create(
                workload=held, gpu=on, hour=dt.datetime(2026, 3, 1, h, tzinfo=dt.UTC),
                site=site, pool=pool, samples=60, gpu_s=3600.0, air_s=0.0, energy_j=0.0,
                computed_at=timezone.now(),
            )  # fmt: skip
    assert workload_daily_rebuild() == 1
    rows = workload_figures(start=dt.date(2026, 3, 1), end=dt.date(2026, 3, 2))
    assert {r.key: (r.cost, r.idle_cost, r.gpus) for r in rows} == {
        "dora": (Decimal("1.2"), Decimal("1.2"), 1),
        "eve": (Decimal("0.2"), Decimal("0.2"), 1),
    }


def test_the_daily_rows_follow_the_report_time_zone(
    workload_example: dict[str, Any], hour: dt.datetime
) -> None:
    """The example's hour, 02:00 UTC, is 21:00 the day before in New York (UTC−5 in winter,
    −4 in summer): the next rollup rebuilds the daily rows in New York's days."""
    from fleet.models import FleetSettings
    from telemetry.models import WorkloadDailyState, WorkloadDailyUsage
    from telemetry.rollup import rollup_run

    assert set(WorkloadDailyUsage.objects.values_list("day", flat=True)) == {hour.date()}
    FleetSettings.objects.update(report_time_zone="America/New_York")
    rollup_run()
    assert WorkloadDailyState.objects.get().zone == "America/New_York"
    before = hour.date() - dt.timedelta(days=1)
    assert set(WorkloadDailyUsage.objects.values_list("day", flat=True)) == {before}
    rows = workload_figures(start=before, end=hour.date(), group_by="workload")
    assert _money(rows)["103"] == (Decimal("0.81"), Decimal("0.81"))
