"""gpufleet_hook (telemetry/agent/gpufleet_hook/): the sums of a window, when they are sent,
and reports that cannot go dropped and counted, never raised into the job."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from telemetry.agent.gpufleet_hook import DEFAULT_SOCKET, MAX_DATAGRAM, Hook


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_a_window_s_sums_and_the_datagram_of_design_9_4() -> None:
    clock, sent = Clock(), list[bytes]()
    hook = Hook(model="llama-8b", clock=clock, send=sent.append)
    for _ in range(3):
        with hook.data_wait():
            clock.t += 0.25
        with hook.compute():
            clock.t += 1.5
        hook.step(samples=32, tokens=65536, flops=3.1e15)
    with hook.checkpoint(nbytes=2_000_000):
        clock.t += 0.75
    clock.t += 0.5  # outside every context: wall time only
    hook.flush()
    assert len(sent) == 1
    d = json.loads(sent[0])
    # wall: 3 × (0.25 + 1.5) + 0.75 + 0.5 = 6.5 s since the hook was made
    assert d == {
        "v": 1,
        "model": "llama-8b",
        "steps": 3,
        "samples": 96,
        "tokens": 196608,
        "wall_s": 6.5,
        "data_wait_s": 0.75,
        "compute_s": 4.5,
        "ckpt_s": 0.75,
        "ckpt_bytes": 2000000,
        "flops": 9.3e15,
    }
    assert hook.sent == 1 and hook.dropped == 0
    # the next window starts from zero; an empty one sends nothing
    hook.flush()
    assert len(sent) == 1


def test_step_sends_every_10_s_and_not_before() -> None:
    clock, sent = Clock(), list[bytes]()
    hook = Hook(model="m", clock=clock, send=sent.append)
    for _ in range(99):
        clock.t += 0.1
        hook.step(samples=1)
    assert sent == []  # 9.9 s
    clock.t += 0.1
    hook.step(samples=1)  # 10.0 s: due
    assert len(sent) == 1
    assert json.loads(sent[0])["steps"] == 100
    assert json.loads(sent[0])["wall_s"] == pytest.approx(10.0)
    clock.t += 9.99
    hook.step()
    assert len(sent) == 1
    clock.t += 0.01
    hook.step()
    assert len(sent) == 2 and json.loads(sent[1])["steps"] == 2


def test_flops_per_step_and_no_flops_at_all() -> None:
    clock, sent = Clock(), list[bytes]()
    hook = Hook(model="m", clock=clock, send=sent.append, flops_per_step=1e12)
    hook.step()
    hook.step(flops=5e11)
    hook.flush()
    assert json.loads(sent[0])["flops"] == 1.5e12
    plain = Hook(model="m", clock=clock, send=sent.append)
    plain.step(samples=4)
    plain.flush()
    assert "flops" not in json.loads(sent[1])  # not known: no MFU, rather than MFU 0


def test_absent_socket_drops_and_counts(tmp_path: Path) -> None:
    clock = Clock()
    hook = Hook(model="m", clock=clock, socket_path=str(tmp_path / "nobody.sock"))
    hook.step()
    hook.flush()  # ENOENT: no agent
    assert (hook.sent, hook.dropped) == (0, 1)
    hook.step()
    hook.flush()
    assert hook.dropped == 2


def test_full_socket_drops_without_blocking(tmp_path: Path) -> None:
    path = str(tmp_path / "hook.sock")
    agent = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    agent.bind(path)  # an agent that never reads
    try:
        clock = Clock()
        hook = Hook(model="m", clock=clock, socket_path=path)
        for _ in range(2000):  # far more than a datagram socket's queue holds
            hook.step(samples=1)
            hook.flush()
        assert hook.sent + hook.dropped == 2000
        assert hook.dropped > 0 and hook.sent > 0
        first = json.loads(agent.recv(MAX_DATAGRAM))
        assert first["steps"] == 1  # each report its own window, nothing re-sent
    finally:
        agent.close()


def test_never_raises_into_the_job() -> None:
    def broken(data: bytes) -> None:
        raise RuntimeError("anything at all")

    hook = Hook(model="m", clock=Clock(), send=broken)
    hook.step(samples=1)
    hook.flush()
    hook.checkpoint(nbytes="not a number")  # type: ignore[arg-type]
    hook.step(samples=float("nan"))
    hook.flush()
    assert hook.dropped == 2


def test_the_socket_path_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUFLEET_HOOK_SOCKET", raising=False)
    assert Hook(model="m")._path == DEFAULT_SOCKET
    monkeypatch.setenv("GPUFLEET_HOOK_SOCKET", "/tmp/x.sock")
    assert Hook(model="m")._path == "/tmp/x.sock"
    assert Hook(model="m", socket_path="/tmp/y.sock")._path == "/tmp/y.sock"


def test_the_last_window_goes_at_exit(tmp_path: Path) -> None:
    path = str(tmp_path / "hook.sock")
    agent = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    agent.bind(path)
    agent.settimeout(30)
    try:
        code = (
            "import sys; sys.path.insert(0, 'telemetry/agent')\n"
            "from gpufleet_hook import Hook\n"
            f"h = Hook(model='exit-test', socket_path={path!r})\n"
            "h.step(samples=7, tokens=70)\n"
        )
        subprocess.run([sys.executable, "-c", code], check=True, cwd=_root(), timeout=60)
        d = json.loads(agent.recv(MAX_DATAGRAM))
        assert (d["model"], d["steps"], d["samples"], d["tokens"]) == ("exit-test", 1, 7, 70)
    finally:
        agent.close()


def _root() -> str:
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
