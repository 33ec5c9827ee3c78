"""The agent as a process: SIGKILL mid-spool and restart, ``--once --print``, bad flags."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from telemetry.agent.agent import SPOOL_FILE

REPO = Path(__file__).resolve().parents[2]
SPEC = "nodes=1,gpus=2,model=H100,pattern=training"


def start_agent(spool: Path, ingest: Any, anchor: int, log: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ)
    env.update(
        {
            "GPUFLEET_SERVER": ingest.url,
            "GPUFLEET_TOKEN": ingest.token,
            "GPUFLEET_INTERVAL": "10",
            "GPUFLEET_SPOOL": str(spool),
            "GPUFLEET_FAKE": SPEC,
            # 20 simulated seconds per real second, on a timeline both runs share
            "GPUFLEET_FAKE_SPEED": "20",
            "GPUFLEET_FAKE_EPOCH": str(anchor),
        }
    )
    return subprocess.Popen(
        [sys.executable, "-m", "telemetry.agent.cli", "--batch-size", "4"],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=log.open("ab"),
    )


def wait_for(cond: Any, timeout: float) -> None:
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError("timed out")
        time.sleep(0.02)


def keys(payload: dict[str, Any]) -> set[tuple[str, str]]:
    return {(s["gpu"], s["start"]) for s in payload["samples"]}


def spooled_keys(spool: Path) -> set[tuple[str, str]]:
    db = sqlite3.connect(spool / SPOOL_FILE)
    try:
        return set(db.execute("SELECT gpu, start FROM samples").fetchall())
    finally:
        db.close()


def restart_until_resent(
    spool: Path, ingest: Any, anchor: int, log: Path, spooled: set[tuple[str, str]], after: int
) -> None:
    """Start an agent on ``spool`` again; once every key of ``spooled`` has been pushed (in
    requests after the first ``after``), and a second more, stop it with SIGTERM."""
    p = start_agent(spool, ingest, anchor, log)
    try:

        def resent() -> set[tuple[str, str]]:
            with ingest.lock:
                return set().union(set(), *(keys(q) for _, q in ingest.requests[after:]))

        wait_for(lambda: spooled <= resent(), timeout=30)
        time.sleep(1.0)
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=12) == 0, log.read_text()
    finally:
        if p.poll() is None:
            p.kill()


def test_killed_mid_spool_and_restarted_loses_and_duplicates_nothing(
    tmp_path: Path, ingest: Any
) -> None:
    spool = tmp_path / "spool"
    log = tmp_path / "agent.log"
    anchor = int(time.time())
    # Phase 1: the server takes three batches, then holds the fourth without answering.
    ingest.hold_after = 3
    p1 = start_agent(spool, ingest, anchor, log)
    try:
        assert ingest.held.wait(timeout=30), log.read_text()
        time.sleep(1.0)  # 20 more simulated seconds: two more intervals go to the spool
        p1.send_signal(signal.SIGKILL)
        p1.wait(timeout=10)
    finally:
        if p1.poll() is None:
            p1.kill()
    with ingest.lock:
        phase1 = list(ingest.requests)
    acked = set().union(*(keys(p) for s, p in phase1 if s == 200))
    (held,) = [keys(p) for s, p in phase1 if s == -1]
    assert len([s for s, _ in phase1 if s == 200]) == 3
    spooled = spooled_keys(spool)
    # the unacknowledged batch is still on disk; nothing acknowledged is; later data is too
    assert held <= spooled
    assert not acked & spooled
    assert len(spooled) > len(held)

    # Phase 2: the server answers again (the held request finally gets its 200, to a dead
    # socket); a new agent on the same spool sends what is left, then stops cleanly.
    ingest.release.set()
    n1 = len(phase1)
    restart_until_resent(spool, ingest, anchor, log, spooled, n1)

    with ingest.lock:
        phase2 = ingest.requests[n1:]
        received = Counter(ingest.received)
    assert all(s == 200 for s, _ in phase2)
    sent2 = Counter(k for _, p in phase2 for k in keys(p))
    # everything that was spooled at the kill arrives after the restart, exactly once
    assert all(sent2[k] == 1 for k in spooled)
    # nothing the server had acknowledged is sent again
    assert not acked & set(sent2)
    # over both runs, only the held (never acknowledged) batch arrived twice
    assert {k for k, n in received.items() if n > 1} == held
    assert max(received.values()) == 2
    # the clean stop flushed and delivered the last partial interval: the spool is empty
    db = sqlite3.connect(spool / SPOOL_FILE)
    assert db.execute("SELECT count(*) FROM samples").fetchone()[0] == 0
    db.close()
    # per GPU, the delivered intervals are contiguous except for the time the agent was dead
    for gpu in {k[0] for k in received}:
        starts = sorted({k[1] for k in received if k[0] == gpu})
        ts = [time.mktime(time.strptime(s, "%Y-%m-%dT%H:%M:%SZ")) for s in starts]
        gaps = [b - a for a, b in zip(ts, ts[1:], strict=False) if b - a != 10]
        assert len(gaps) <= 1, starts


def test_sigterm_ends_the_agent_within_10_s_while_the_server_hangs_and_loses_nothing(
    tmp_path: Path, ingest: Any
) -> None:
    spool = tmp_path / "spool"
    log = tmp_path / "agent.log"
    anchor = int(time.time())
    # The server accepts the connection, reads the push and never answers (until released).
    ingest.mode = "hold"
    p = start_agent(spool, ingest, anchor, log)
    try:
        assert ingest.held.wait(timeout=30), log.read_text()
        time.sleep(0.5)  # 10 more simulated seconds: one more interval goes to the spool
        sent = time.monotonic()
        p.send_signal(signal.SIGTERM)
        # docs/agent.md: a stop takes at most 10 s (systemd kills at 45 s); 2 s of slack here
        assert p.wait(timeout=12) == 0, log.read_text()
        took = time.monotonic() - sent
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=10)
    assert took <= 12
    with ingest.lock:
        (held,) = [keys(q) for s, q in ingest.requests if s == -1]
        n1 = len(ingest.requests)
    spooled = spooled_keys(spool)
    # the spool was written before the push: the aborted push's samples are all still there,
    # with the intervals closed since and the partial one flushed at the stop
    assert held <= spooled and len(spooled) > len(held)
    assert "push in flight" in log.read_text()

    # A new start against an answering server delivers all of it.
    ingest.mode = "ok"
    ingest.release.set()
    restart_until_resent(spool, ingest, anchor, log, spooled, n1)
    assert spooled <= set(ingest.stored)


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith("GPUFLEET_")}
    e.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "telemetry.agent.cli", *args],
        cwd=REPO,
        env=e,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_once_print_with_fake_fleet() -> None:
    r = run_cli("--once", "--print", "--interval", "10", env={"GPUFLEET_FAKE": "small"})
    assert r.returncode == 0, r.stderr
    payload = json.loads(r.stdout)
    assert payload["node"]["hostname"] == "gpu-fra1-01"
    assert [g["name"] for g in payload["gpus"]] == ["NVIDIA H100 80GB HBM3"] * 2
    assert len(payload["samples"]) == 2
    for s in payload["samples"]:
        assert s["seconds"] == 10 and s["start"].endswith("0Z")
        assert int(s["start"][17:19]) % 10 == 0


def test_once_print_without_a_gpu_says_so_in_one_line() -> None:
    pytest.importorskip("pynvml")
    r = run_cli("--once", "--print", "--interval", "1")
    if r.returncode == 0:
        pytest.skip("this machine has a working NVIDIA driver")
    assert r.returncode == 1
    assert "Traceback" not in r.stderr
    errors = [line for line in r.stderr.splitlines() if " ERROR " in line]
    assert errors and "NVML unavailable" in errors[0]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--interval", "7", "--once", "--print"], "must divide 3600"),
        (["--interval", "60"], "--server and --token"),
        (["--print"], "--print needs --once"),
    ],
)
def test_bad_flags_exit_2_with_one_line(args: list[str], message: str) -> None:
    r = run_cli(*args)
    assert r.returncode == 2
    assert message in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_environment_stands_in_for_flags() -> None:
    r = run_cli(
        "--once",
        "--print",
        env={"GPUFLEET_FAKE": "nodes=1,gpus=1,model=L4,pattern=parked", "GPUFLEET_INTERVAL": "30"},
    )
    assert r.returncode == 0, r.stderr
    (s,) = json.loads(r.stdout)["samples"]
    assert s["seconds"] == 30
    assert json.loads(r.stdout)["gpus"][0]["name"] == "NVIDIA L4"


def test_the_pod_log_root_reaches_the_resolver(monkeypatch: pytest.MonkeyPatch) -> None:
    """--pod-log-root, or GPUFLEET_POD_LOG_ROOT, is where the NVML agent reads the pods' names
    (docs/agent.md); kubelet's default without either."""
    from telemetry.agent import cli
    from telemetry.agent.workloads import ProcResolver

    def pod_log_root(*argv: str) -> str:
        discovery = cli._setup(cli.build_parser().parse_args(list(argv)))[3]
        assert discovery is not None and isinstance(discovery.resolver, ProcResolver)
        return discovery.resolver.pod_log_root

    monkeypatch.delenv("GPUFLEET_POD_LOG_ROOT", raising=False)
    assert pod_log_root() == "/var/log/pods"
    assert pod_log_root("--pod-log-root", "/srv/kubelet/pods-logs") == "/srv/kubelet/pods-logs"
    monkeypatch.setenv("GPUFLEET_POD_LOG_ROOT", "/data/log/pods")
    assert pod_log_root() == "/data/log/pods"
