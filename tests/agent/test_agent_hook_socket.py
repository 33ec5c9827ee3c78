"""The agent's job hook socket (telemetry/agent/hook_socket.py): real datagrams from real
processes, attributed by the pid in the socket's credentials (a fake /proc says whose each pid
is) to the workload and its GPUs, and added to their samples as ``job``.

Intervals of 10 s from T0 as in test_agent_shares.py: GPUs 0 and 1 run process 101 of Slurm
job 48213, GPU 2 process 202 of job 48214. A report drained at a tick of the interval belongs
to that interval."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest

from telemetry.agent import hook_socket as hs
from telemetry.agent.agent import Agent
from telemetry.ingest import _job_error
from telemetry.wire import SampleIn

from . import procfs as pf
from .test_agent_shares import START, T0, Node, assert_server_accepts, const, gpu, uuid

ROOT = Path(__file__).resolve().parents[2]

REPORT = {
    "v": 1,
    "model": "llama-8b",
    "steps": 10,
    "samples": 320,
    "tokens": 655360,
    "wall_s": 9.0,
    "data_wait_s": 3.0,
    "compute_s": 5.0,
    "ckpt_s": 0.5,
    "ckpt_bytes": 1000,
    "flops": 2e15,
}


class HookNode(Node):
    """test_agent_shares' node with the hook socket in its temporary directory."""

    def __init__(self, tmp: Path) -> None:
        super().__init__(
            tmp,
            [
                gpu(0, const(90), const([101])),
                gpu(1, const(90), const([101])),
                gpu(2, const(50), const([202])),
            ],
        )
        self.proc.add(101, pf.SLURM_V2, uid=1000)
        self.proc.add(202, pf.SLURM_V2.replace("48213", "48214"), uid=1002)
        self.sock = str(tmp / "run" / "hook.sock")
        # the same fake GPUs, through an agent that listens (the first one never ticked)
        api = self.agent.source.api  # type: ignore[attr-defined]
        self.agent = Agent(
            api,
            spool_dir=None,
            interval_s=10,
            clock=self.clock,
            workloads=self.discovery,
            hook_socket=self.sock,
        )

    def run_with(self, sends: dict[int, list[tuple[bytes, str | None]]]) -> dict[str, Any]:
        """Tick through the interval; before the tick of second T0+s, the sends of ``sends[s]``
        (each from its own process). Samples by GPU, each checked as the server would."""
        out: list[dict[str, Any]] = []
        for t in range(T0, T0 + 11):
            for data, job in sends.get(t - T0, []):
                send_from_process(self.sock, data, self.proc if job else None, job)
            self.clock.set(t + 0.003)
            out.extend(self.agent.tick(t))
        samples = {s["gpu"]: s for s in out if s["start"] == START}
        for s in samples.values():
            check_server_accepts(s)
        return samples


def send_from_process(path: str, data: bytes, proc: pf.FakeProc | None, job: str | None) -> int:
    """A real process sends ``data`` to ``path``; its pid becomes a process of Slurm job
    ``job`` in ``proc`` (before the agent reads the datagram)."""
    p = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import socket, sys\n"
            "sys.stdin.readline()\n"
            "socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM).sendto("
            "bytes.fromhex(sys.argv[2]), sys.argv[1])\n",
            path,
            data.hex(),
        ],
        stdin=subprocess.PIPE,
    )
    if proc is not None and job is not None:
        proc.add(p.pid, pf.SLURM_V2.replace("48213", job), uid=1000)
    assert p.stdin is not None
    p.stdin.write(b"go\n")
    p.stdin.close()
    assert p.wait(timeout=60) == 0
    return p.pid


def check_server_accepts(sample: dict[str, Any]) -> None:
    assert_server_accepts(sample)
    s = msgspec.convert(json.loads(json.dumps(sample)), SampleIn, strict=True)
    if s.job is not None:
        assert not isinstance(_job_error(s.job, s.workloads, s.seconds), tuple), sample["job"]


def report(**changes: Any) -> bytes:
    return json.dumps({**REPORT, **changes}).encode()


def test_a_report_is_split_over_its_workload_s_gpus(tmp_path: Path) -> None:
    """Job 48213 holds GPUs 0 and 1: counts halved (steps 10 → 5, samples 320 → 160, tokens
    655,360 → 327,680, flops 2e15 → 1e15, checkpoint bytes 1,000 → 500), times the job's on
    each GPU; GPU 2 (job 48214) gets nothing."""
    node = HookNode(tmp_path)
    mode = stat.S_IMODE(os.stat(node.sock).st_mode)
    assert mode == 0o666
    samples = node.run_with({4: [(report(), "48213")]})
    expected = {
        "kind": "slurm",
        "id": "48213",
        "model": "llama-8b",
        "steps": 5.0,
        "samples": 160.0,
        "tokens": 327680.0,
        "flops": 1e15,
        "ckpt_bytes": 500.0,
        "wall_s": 9.0,
        "data_wait_s": 3.0,
        "compute_s": 5.0,
        "ckpt_s": 0.5,
    }
    assert samples[uuid(0)]["job"] == expected
    assert samples[uuid(1)]["job"] == expected
    assert "job" not in samples[uuid(2)]
    assert node.agent.hook is not None
    assert node.agent.hook.counts["received"] == 1
    assert node.agent.hook.counts["attributed"] == 2


def test_two_reports_add_up_and_the_pid_decides_never_the_body(tmp_path: Path) -> None:
    """Two reports of job 48213 (4.5 s of wall each) add up; a report from a process of job
    48214 that claims a pid of job 48213 in its body is job 48214's (GPU 2, whole)."""
    node = HookNode(tmp_path)
    half = {"wall_s": 4.5, "data_wait_s": 1.5, "compute_s": 2.5, "ckpt_s": 0.25}
    samples = node.run_with(
        {
            2: [(report(**half), "48213")],
            6: [(report(**half), "48213"), (report(pid=101, model="bert"), "48214")],
        }
    )
    assert samples[uuid(0)]["job"]["steps"] == 10.0  # 2 × 10 / 2 GPUs
    assert samples[uuid(0)]["job"]["wall_s"] == 9.0
    assert samples[uuid(0)]["job"]["data_wait_s"] == 3.0
    assert samples[uuid(2)]["job"]["id"] == "48214"
    assert samples[uuid(2)]["job"]["model"] == "bert"
    assert samples[uuid(2)]["job"]["steps"] == 10.0  # one GPU: the whole count


def test_one_model_per_gpu_the_longest_wall_time_wins(tmp_path: Path) -> None:
    node = HookNode(tmp_path)
    samples = node.run_with(
        {
            3: [(report(model="small", wall_s=2.0, compute_s=1.0, data_wait_s=0.5), "48213")],
            5: [(report(model="large"), "48213")],
        }
    )
    assert samples[uuid(0)]["job"]["model"] == "large"
    assert node.agent.hook is not None
    assert node.agent.hook.counts["unattributed"] == 2  # "small" on GPUs 0 and 1


def test_bad_datagrams_are_counted_and_dropped(tmp_path: Path) -> None:
    node = HookNode(tmp_path)
    samples = node.run_with(
        {
            1: [
                (b"not json", "48213"),
                (b"[1, 2]", "48213"),
                (report(v=2), "48213"),
                (report(steps=-1), "48213"),
                (report(tokens="many"), "48213"),
                (report(compute_s=20.0), "48213"),  # more than its wall time
                (b"{" + b" " * 5000 + b"}", "48213"),  # over 4 KB
                (report(), None),  # a pid the agent cannot see
            ]
        }
    )
    assert all("job" not in s for s in samples.values())
    hook = node.agent.hook
    assert hook is not None
    assert hook.counts["received"] == 8
    assert hook.counts["malformed"] == 6
    assert hook.counts["oversized"] == 1
    assert hook.counts["unknown_pid"] == 1  # after its retries
    assert hook.pending == [] and hook.sums == {}


def test_memory_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hs, "MAX_REPORTS_PER_S", 0.3)  # 3 reports per 10 s interval
    node = HookNode(tmp_path)
    samples = node.run_with({2: [(report(), "48213")] * 5})
    assert samples[uuid(0)]["job"]["steps"] == 15.0  # 3 taken × 10 / 2 GPUs
    assert node.agent.hook is not None
    assert node.agent.hook.counts["over_cap"] == 2


def test_the_real_hook_through_the_real_socket(tmp_path: Path) -> None:
    """gpufleet_hook in a child process that the fake /proc makes job 48213's."""
    node = HookNode(tmp_path)
    code = (
        f"import sys; sys.path.insert(0, {str(ROOT / 'telemetry' / 'agent')!r})\n"
        "sys.stdin.readline()\n"
        "from gpufleet_hook import Hook\n"
        f"h = Hook(model='tiny', socket_path={node.sock!r})\n"
        "for _ in range(4):\n"
        "    with h.data_wait(): pass\n"
        "    with h.compute(): pass\n"
        "    h.step(samples=8, tokens=1024, flops=1e9)\n"
        "h.flush()\n"
        "print(h.sent, h.dropped)\n"
    )
    out: list[dict[str, Any]] = []
    for t in range(T0, T0 + 11):
        if t == T0 + 3:
            p = subprocess.Popen(
                [sys.executable, "-c", code],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            node.proc.add(p.pid, pf.SLURM_V2, uid=1000)
            got, _ = p.communicate("go\n", timeout=60)
            assert got.split() == ["1", "0"]
        node.clock.set(t + 0.003)
        out.extend(node.agent.tick(t))
    job = {s["gpu"]: s for s in out if s["start"] == START}[uuid(1)]["job"]
    assert (job["model"], job["steps"], job["samples"], job["tokens"], job["flops"]) == (
        "tiny",
        2.0,
        16.0,
        2048.0,
        2e9,
    )
    assert job["data_wait_s"] + job["compute_s"] <= job["wall_s"] * 1.01


def test_a_socket_path_that_cannot_be_bound_leaves_the_agent_running(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a socket")
    node = Node(tmp_path, [gpu(0, const(90), const([]))])
    agent = Agent(
        node.agent.source.api,  # type: ignore[attr-defined]
        spool_dir=None,
        interval_s=10,
        clock=node.clock,
        hook_socket=str(blocker),
    )
    assert agent.hook is None
    assert blocker.read_text() == "not a socket"


def test_the_socket_is_removed_at_close_and_a_stale_one_replaced(tmp_path: Path) -> None:
    node = HookNode(tmp_path)
    node.agent.close()
    assert not os.path.exists(node.sock)
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    stale.bind(node.sock)
    stale.close()  # the file stays, as after a crash
    listener = hs.HookListener(node.sock, resolve=lambda pid: None, interval_s=10)
    assert listener.open()
    assert stat.S_ISSOCK(os.lstat(node.sock).st_mode)
    listener.close()
    assert not os.path.exists(node.sock)


def test_more_reports_than_the_kernel_queues_between_two_ticks_all_arrive(tmp_path: Path) -> None:
    """Linux queues net.unix.max_dgram_qlen datagrams on a socket (10 by default): the reader
    thread keeps taking them as they come, so 200 reports sent between two ticks, a job's
    burst, all arrive; without it the 11th and later would be refused to the sender."""
    import time

    sock = str(tmp_path / "hook.sock")
    listener = hs.HookListener(sock, resolve=lambda pid: None, interval_s=10)
    assert listener.open()
    sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sender.setblocking(False)  # as the hook's: a full socket refuses, never waits
    refused = 0
    try:
        for _ in range(200):
            for _attempt in range(200):  # the reader needs a moment now and then
                try:
                    sender.sendto(report(), sock)
                    break
                except BlockingIOError:
                    time.sleep(0.001)
            else:
                refused += 1
        listener.drain(T0)
        assert refused == 0
        assert listener.counts["received"] == 200
    finally:
        sender.close()
        listener.close()
