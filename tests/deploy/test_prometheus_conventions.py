"""/metrics as Prometheus's own tools see it (issue 21): ``promtool check metrics`` accepts the
exposition, the renamed names are documented, and the shipped Grafana dashboard and the docs'
alert rules query only metrics that exist, in PromQL that promtool parses.

A real Prometheus scraping a real server is tests/reliability/test_prometheus_scrape.py.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import time_machine
from django.core.cache import cache
from django.test import override_settings

from config.metrics import COUNTER_PREFIX, COUNTERS, RENAMED
from tests.deploy.prometheus_tools import (
    DASHBOARDS,
    METRICS_TOKEN,
    dashboard_queries,
    docs_alert_rules,
    docs_table,
    exposition_families,
    exposition_filled,
    metric_names,
    promtool_run,
    rules_file,
)

NOW = dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.UTC)
REPLICA_METRICS = {"gpufleet_replica_reads", "gpufleet_replica_lag_seconds"}
# The operational figures issue 21 asks the dashboard for, by the metric that carries each.
DASHBOARD_MUST_SHOW = {
    "ingest rate": "gpufleet_ingest_samples_accepted_total",
    "rejects": "gpufleet_ingest_samples_rejected_total",
    "rollup lag": "gpufleet_rollup_lag_seconds",
    "node last seen": "gpufleet_node_last_seen_timestamp_seconds",
    "spool drops": "gpufleet_node_spool_dropped_samples_total",
}


@pytest.fixture
def exposition(client: Any, db: Any) -> Iterator[str]:
    cache.delete_many([COUNTER_PREFIX + c.name for c in COUNTERS])
    with override_settings(METRICS_TOKEN=METRICS_TOKEN), time_machine.travel(NOW, tick=False):
        yield exposition_filled(client, NOW)


def test_promtool_accepts_the_exposition(exposition: str) -> None:
    assert "gpufleet_node_info{" in exposition and "\\n" in exposition  # every family, escaping
    result = promtool_run("check", "metrics", stdin=exposition)
    assert (result.returncode, result.stdout + result.stderr) == (0, "")

    # The same linter on the name this replaced: it is really linting, and that name is why
    # the rename was needed.
    old = "\n".join(
        line.replace("gpufleet_rollups_pending", "gpufleet_rollup_pending_hours")
        for line in exposition.splitlines()
    )
    result = promtool_run("check", "metrics", stdin=old + "\n")
    assert result.returncode != 0
    assert 'gpufleet_rollup_pending_hours use base unit "seconds"' in result.stdout + result.stderr


def test_every_exposed_metric_is_documented_and_every_rename_listed(exposition: str) -> None:
    exposed = exposition_families(exposition)
    documented: set[str] = set()
    for row in docs_table("| Metric | Type |"):
        documented |= metric_names(row[0])
    # Only with a read replica (test_replica_routing.py checks those two).
    assert documented - REPLICA_METRICS == exposed

    renames = {
        next(iter(metric_names(old))): next(iter(metric_names(new)))
        for old, new, *_ in docs_table("| Old name | New name |")
    }
    assert renames == RENAMED
    for old, new in renames.items():
        assert old not in exposed and new in exposed


@pytest.mark.parametrize("dashboard", DASHBOARDS, ids=lambda p: p.name)
def test_dashboard_queries_only_metrics_that_exist(dashboard: Path, exposition: str) -> None:
    queries = dashboard_queries(dashboard)
    queried = set().union(*(metric_names(expr) for expr in queries))
    missing = queried - exposition_families(exposition)
    assert not missing, f"{dashboard.name} queries metrics /metrics does not have: {missing}"
    if dashboard.name == "grafana-operations.json":
        assert set(DASHBOARD_MUST_SHOW.values()) <= queried


def test_dashboard_and_docs_alerts_are_promql_promtool_parses(
    tmp_path: Path, exposition: str
) -> None:
    assert DASHBOARDS, "no docs/grafana-*.json"
    queries = [expr for path in DASHBOARDS for expr in dashboard_queries(path)]
    alerts = docs_alert_rules()
    for rule in alerts:
        names = metric_names(rule["expr"])
        assert names <= exposition_families(exposition), rule  # blackbox's probe_* aside
    path = rules_file(tmp_path / "rules.yml", recording=queries, alerting=alerts)
    result = promtool_run("check", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(queries) + len(alerts)} rules found" in result.stdout

    # And a broken expression is refused: promtool really parses them.
    broken = rules_file(tmp_path / "broken.yml", recording=["max(rate(x[5m])"], alerting=[])
    assert promtool_run("check", "rules", str(broken)).returncode != 0
