"""What the tests of /metrics against Prometheus's own tools share: finding promtool and the
server, the shipped Grafana dashboard's queries, the docs' alert rules, and an exposition with
every family filled in.

Prometheus's tools come from Debian's ``prometheus`` package, which ``dev.py test`` installs
when it runs as root with apt-get (as on a fresh CI machine). Without them these tests skip
locally and fail in CI (``service_missing``).
"""

from __future__ import annotations

import datetime as dt
import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from tests.conftest import service_missing

ROOT = Path(__file__).resolve().parents[2]
DEPLOY_DOC = ROOT / "docs" / "deploy.md"
DASHBOARDS = sorted((ROOT / "docs").glob("grafana-*.json"))
METRICS_TOKEN = "m3trics-t0ken"
# Grafana's variables, as the tests evaluate the dashboard's queries: a rate window that a
# one-second scrape fills, and the job name the tests scrape under.
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$job": "gpufleet"}
_METRIC = re.compile(r"\bgpufleet_[a-z0-9_]+\b")


def prometheus_tool(name: str) -> str:
    """The path of ``promtool`` or ``prometheus``; skips the test (fails it in CI) without it."""
    path = shutil.which(name)
    if path is None:
        service_missing(f"{name} (Debian package prometheus: apt-get install prometheus)")
        raise AssertionError("unreachable")  # service_missing raises
    return path


def promtool_run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [prometheus_tool("promtool"), *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


# --- the Grafana dashboards -------------------------------------------------------------------
def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels", []))  # a collapsed row holds its panels


def dashboard_queries(path: Path) -> list[str]:
    """Every PromQL expression the dashboard's panels and variables run, variables filled in."""
    dashboard = json.loads(path.read_text())
    exprs = [
        target["expr"]
        for panel in _panels(dashboard["panels"])
        for target in panel.get("targets", [])
    ]
    for variable in dashboard.get("templating", {}).get("list", []):
        if variable["type"] == "query":
            # label_values(METRIC, label) is Grafana's, not PromQL: the series it reads.
            found = re.fullmatch(r"label_values\((\w+), *\w+\)", variable["query"]["query"])
            assert found, variable
            exprs.append(found.group(1))
    filled = []
    for expr in exprs:
        for name, value in GRAFANA_VARIABLES.items():
            expr = expr.replace(name, value)
        assert "$" not in expr, f"a Grafana variable the tests do not know: {expr}"
        filled.append(expr)
    return filled


# --- the docs ---------------------------------------------------------------------------------
def docs_alert_rules() -> list[dict[str, Any]]:
    """The alerting rules docs/deploy.md suggests (its YAML block of ``- alert:`` entries)."""
    text = DEPLOY_DOC.read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", text, flags=re.S)
    rules = [rule for block in blocks if "- alert:" in block for rule in yaml.safe_load(block)]
    assert rules, "no alert rules found in docs/deploy.md"
    return rules


def docs_table(header: str) -> list[list[str]]:
    """The rows of the Markdown table in docs/deploy.md whose header row starts with
    ``header``, each as its cells."""
    lines = DEPLOY_DOC.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def metric_names(text: str) -> set[str]:
    """The gpufleet metric names written in a PromQL expression or a doc cell."""
    return set(_METRIC.findall(text))


def rules_file(path: Path, *, recording: list[str], alerting: list[dict[str, Any]]) -> Path:
    """A Prometheus rules file that records each expression in ``recording`` and holds the
    alerting rules, so ``promtool check rules`` parses every one as PromQL."""
    rules: list[dict[str, Any]] = [
        {"record": f"gpufleet_test:expr_{i}", "expr": expr} for i, expr in enumerate(recording)
    ]
    rules += alerting
    path.write_text(json.dumps({"groups": [{"name": "gpufleet-tests", "rules": rules}]}))
    return path


# --- an exposition with every family filled in ------------------------------------------------
def exposition_filled(client: Any, now: dt.datetime) -> str:
    """/metrics after a little of everything: counters, nodes (one with a name that needs
    escaping, one never seen), a GPU, a waiting rollup and one set aside. Needs the database."""
    from config.metrics import counters_incr
    from fleet.models import Gpu, Node
    from telemetry.models import RollupPending

    counters_incr(
        {
            "ingest_requests": 2,
            "ingest_samples_accepted": 10,
            "ingest_samples_duplicate": 1,
            "ingest_samples_rejected": 1,
        }
    )
    node = Node.objects.create(
        hostname="gpu-lint",
        last_seen_at=now - dt.timedelta(seconds=42),
        spool_dropped_total=3,
        agent_version="1.0.0",
        driver_version="550.54.15",
    )
    Node.objects.create(hostname='odd "name"\\ with\nnewline')
    Gpu.objects.create(uuid="GPU-lint", node=node)
    hour = now.replace(minute=0, second=0, microsecond=0)
    RollupPending.objects.create(hour=hour)
    RollupPending.objects.create(hour=hour - dt.timedelta(hours=5), failures=5, set_aside_at=now)
    response = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {METRICS_TOKEN}")
    assert response.status_code == 200, response.content
    return str(response.content.decode())


def exposition_families(text: str) -> set[str]:
    """The metric names an exposition declares (its ``# TYPE`` lines) and the names of its
    samples (``_info``, ``_total``)."""
    names = set(re.findall(r"^# TYPE (\S+) ", text, flags=re.M))
    names |= set(re.findall(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)[{ ]", text, flags=re.M))
    return names
