"""A real Prometheus (Debian's package) scrapes a real server's /metrics on loopback (issue 21).

Prometheus listens on 127.0.0.1 only, keeps its data in the test's temporary directory and
scrapes gunicorn every second with the metrics token, as docs/deploy.md configures it. The
test pushes a batch to the server and waits, bounded, until Prometheus's own query API shows
the ingest counters moved by exactly what the push did; then it runs every query of the
shipped Grafana dashboard against that Prometheus.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from fleet.services import node_token_issue
from tests.deploy.prometheus_tools import (
    DASHBOARDS,
    GRAFANA_VARIABLES,
    dashboard_queries,
    prometheus_tool,
)
from tests.reliability.conftest import (
    INGEST,
    LOOPBACK,
    Gunicorn,
    free_port,
    good_sample,
    gpu_block,
    post,
    push_body,
    recent_minute,
    wait_for,
)

METRICS_TOKEN = "prom-scrape-t0ken"
JOB = GRAFANA_VARIABLES["$job"]
# Bounds, not speeds: a scrape a second, so each wait normally ends within a few seconds.
READY_TIMEOUT_S = 60.0
SCRAPE_TIMEOUT_S = 60.0


class Prometheus:
    """``prometheus`` on 127.0.0.1:``port`` scraping ``target`` (host:port) every second."""

    def __init__(self, workdir: Path, target: str, token: str) -> None:
        self.port = free_port()
        self.workdir = workdir
        workdir.mkdir()
        token_file = workdir / "token"
        token_file.write_text(token)
        token_file.chmod(0o600)
        config = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
            "scrape_configs": [
                {
                    "job_name": JOB,
                    "metrics_path": "/metrics",
                    # As docs/deploy.md §6 configures it.
                    "authorization": {"type": "Bearer", "credentials_file": str(token_file)},
                    "static_configs": [{"targets": [target]}],
                }
            ],
        }
        (workdir / "prometheus.yml").write_text(json.dumps(config))  # JSON is YAML
        self.log = workdir / "prometheus.log"
        self.proc = subprocess.Popen(
            [
                prometheus_tool("prometheus"),
                f"--config.file={workdir / 'prometheus.yml'}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address={LOOPBACK}:{self.port}",
                "--log.level=warn",
            ],
            stdout=self.log.open("ab"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]

    def ready(self) -> bool:
        assert self.proc.poll() is None, f"prometheus exited:\n{self.output()}"
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as r:  # noqa: S310
                return bool(r.status == 200)
        except OSError:
            return False

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The instant vector (or scalar, as one row) ``expr`` evaluates to now."""
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(url, timeout=5) as r:  # noqa: S310
            body = json.loads(r.read())
        assert body["status"] == "success", (expr, body)
        data = body["data"]
        if data["resultType"] in ("scalar", "string"):
            return [{"metric": {}, "value": data["result"]}]
        assert data["resultType"] == "vector", (expr, data)
        return list(data["result"])

    def value(self, expr: str) -> float | None:
        rows = self.query(expr)
        assert len(rows) <= 1, (expr, rows)
        return float(rows[0]["value"][1]) if rows else None

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[Callable[[str], Prometheus]]:
    made: list[Prometheus] = []

    def start(target: str) -> Prometheus:
        server = Prometheus(tmp_path / f"prometheus{len(made)}", target, METRICS_TOKEN)
        made.append(server)
        wait_for(server.ready, "Prometheus to be ready", timeout=READY_TIMEOUT_S)
        return server

    yield start
    for server in made:
        server.stop()


def test_prometheus_scrapes_metrics_and_sees_ingest_counters_move(
    pg: None,
    redis_url: str,
    gunicorn: Callable[..., Gunicorn],
    prometheus: Callable[[str], Prometheus],
) -> None:
    _, token = node_token_issue(hostname="prom-node")
    server = gunicorn(redis_url=redis_url, METRICS_TOKEN=METRICS_TOKEN)
    prom = prometheus(f"{LOOPBACK}:{server.port}")

    accepted = f'gpufleet_ingest_samples_accepted_total{{job="{JOB}"}}'
    rejected = f'gpufleet_ingest_samples_rejected_total{{job="{JOB}"}}'
    requests = f'gpufleet_ingest_requests_total{{job="{JOB}"}}'
    # The counters live in the shared Redis and may hold earlier runs' counts: once the push
    # has been counted, make sure every counter has a value Prometheus scraped before it.
    uuid = "GPU-prom-1"
    warmup = push_body([good_sample(uuid, recent_minute(30))], [gpu_block(uuid)], "prom-node")
    assert post(f"{server.url}{INGEST}", token, json.dumps(warmup).encode())[0] == 200
    wait_for(
        lambda: all(prom.value(m) is not None for m in (accepted, rejected, requests)),
        "the first scrape with the ingest counters",
        timeout=SCRAPE_TIMEOUT_S,
    )
    assert prom.value(f'up{{job="{JOB}"}}') == 1
    before = {m: prom.value(m) for m in (accepted, rejected, requests)}

    # Three good samples and one with util_pct out of range: 3 accepted, 1 rejected, 1 request.
    samples = [good_sample(uuid, recent_minute(m)) for m in (3, 4, 5)]
    samples.append(good_sample(uuid, recent_minute(6), util_pct=101))
    status, reply = post(f"{server.url}{INGEST}", token, json.dumps(push_body(samples)).encode())
    assert status == 200, reply
    assert reply["accepted"] == 3 and len(reply["rejected"]) == 1, reply

    expected = {
        accepted: before[accepted] + 3,
        rejected: before[rejected] + 1,
        requests: before[requests] + 1,
    }
    wait_for(
        lambda: {m: prom.value(m) for m in expected} == expected,
        f"Prometheus to see the counters move to {expected}",
        timeout=SCRAPE_TIMEOUT_S,
    )
    seen = prom.value('gpufleet_node_last_seen_timestamp_seconds{node="prom-node"}')
    assert seen is not None and abs(seen - time.time()) < 600

    # Every query of the shipped dashboards is valid for this Prometheus and finds data.
    for dashboard in DASHBOARDS:
        for expr in dashboard_queries(dashboard):
            assert prom.query(expr), f"{dashboard.name}: no data for {expr}"
