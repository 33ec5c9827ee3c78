"""share_s and air_s (docs/agent.md), worked out by hand, through the whole agent: FakeNvml's
process lists, a fake /proc (tests/agent/procfs.py), a real allocation directory, the one
summariser. And every sample checked against the server's own rules.

Every interval is 10 s from T0 = 2026-11-30T09:00:00Z: the tick at t reads the second
[t-1, t), so ticks T0+1 … T0+10 cover the seconds T0 … T0+9 (the tick at T0 reads the last
second of the interval before, which is dropped). Second s below means T0+s.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import msgspec
import pytest

from telemetry.agent.agent import Agent
from telemetry.agent.clock import VirtualClock
from telemetry.agent.fake import MODELS, FakeNvml, ScriptedGpu
from telemetry.agent.source import Workload
from telemetry.agent.summarise import WorkloadSum, hold, workloads_wire
from telemetry.agent.workloads import AllocationDir, Discovery, ProcResolver
from telemetry.ingest import _workloads_error
from telemetry.wire import SampleIn

from . import procfs as pf

T0 = 1796029200
START = "2026-11-30T09:00:00Z"
H100 = MODELS["H100"]
MEM = 20_000_000_000


def uuid(i: int) -> str:
    return f"GPU-{i:08d}-0000-4000-8000-000000000000"


def gpu(
    i: int, util: Callable[[int], int], pids: Callable[[int], Sequence[int]], **kw: Any
) -> ScriptedGpu:
    """GPU ``i``: utilisation ``util(s)`` % in second s of the interval, the compute processes
    ``pids(s)``; 300 W, 20 GB whenever a process holds it."""

    def script(t: int) -> tuple[int, int, int, int, int, int, int, int]:
        s = t - T0
        n = len(pids(s))
        return (util(s), 0, MEM if n else 0, n, 300_000, 60, 1980, 0)

    return ScriptedGpu(uuid(i), i, H100, script, pids=lambda t: pids(t - T0), **kw)


def const(v: Any) -> Callable[[int], Any]:
    return lambda s: v


class Node:
    """A fake GPU node: scripted GPUs, its /proc, its allocation directory, the agent."""

    def __init__(self, tmp: Path, gpus: list[ScriptedGpu]) -> None:
        self.proc = pf.FakeProc(tmp / "proc")
        self.pods = pf.FakePodLogs(tmp / "pods")  # kubelet's /var/log/pods
        self.alloc = tmp / "alloc"
        self.alloc.mkdir()
        self.clock = VirtualClock(T0)
        self.discovery = Discovery(
            ProcResolver(str(self.proc.root), users=pf.user_name, pod_log_root=str(self.pods.root)),
            AllocationDir(str(self.alloc)),
        )
        api = FakeNvml(gpus, self.clock.time)
        self.agent = Agent(
            api, spool_dir=None, interval_s=10, clock=self.clock, workloads=self.discovery
        )
        self.before: dict[int, Callable[[], None]] = {}  # second → change made before it

    def allocate(self, name: str, body: Any) -> None:
        tmp = self.alloc / f".{name}.tmp"
        tmp.write_text(body if isinstance(body, str) else json.dumps(body))
        tmp.rename(self.alloc / name)

    def run(self) -> dict[str, dict[str, Any]]:
        """Tick through the interval; its samples by GPU (each checked as the server would)."""
        out: list[dict[str, Any]] = []
        for t in range(T0, T0 + 11):
            change = self.before.get(t - 1 - T0)
            if change is not None:
                change()  # what the tick reading second t-1 finds
            self.clock.set(t + 0.003)
            out.extend(self.agent.tick(t))
        samples = {s["gpu"]: s for s in out if s["start"] == START}
        for s in samples.values():
            assert_server_accepts(s)
        return samples


def assert_server_accepts(sample: dict[str, Any]) -> None:
    """The server's decoding (telemetry/wire.py) and its workload rules (telemetry/ingest.py)."""
    s = msgspec.convert(json.loads(json.dumps(sample)), SampleIn, strict=True)
    if s.workloads:
        assert _workloads_error(s.workloads, s.seconds) is None, sample["workloads"]


def job(jid: str, share: float, air: float, **meta: str) -> dict[str, Any]:
    return {"kind": "slurm", "id": jid, **meta, "share_s": share, "air_s": air}


def test_two_jobs_sharing_a_gpu_all_interval(tmp_path: Path) -> None:
    """Seconds 0–4 at 80 %, 5–9 at 20 %; jobs 48213 (cgroup v2) and 48214 (cgroup v1, its
    extern step) both on the GPU every second. Each: share 10 × 1/2 = 5.0 s; air
    (5 × 0.8 + 5 × 0.2) / 2 = 2.5 s. Together 5.0 s of air, the sample's 50 % × 10 s."""
    node = Node(tmp_path, [gpu(0, lambda s: 80 if s < 5 else 20, const([101, 202]))])
    node.proc.add(101, pf.SLURM_V2, uid=1000)
    node.proc.add(202, pf.SLURM_V1.replace("48213", "48214"), uid=1002)
    s = node.run()[uuid(0)]
    assert s["util_pct"] == 50.0 and s["procs"] == 2
    assert s["workloads"] == [
        job("48213", 5.0, 2.5, user="alice"),
        job("48214", 5.0, 2.5, user="carol"),
    ]


def test_a_job_holds_eight_gpus_and_computes_on_one(tmp_path: Path) -> None:
    """The prolog's file gives job 48213 all 8 GPUs; its one process runs on GPU 0 at 90 %.
    GPU 0: share 10 s, air 10 × 0.9 = 9.0 s (process and allocation are one workload, with
    the file's account and name). GPUs 1–7: no process, 0 %: share 10 s, air 0 — held, where
    without the allocation the server would count them parked."""
    gpus = [gpu(0, const(90), const([101]))] + [gpu(i, const(0), const([])) for i in range(1, 8)]
    node = Node(tmp_path, gpus)
    node.proc.add(101, pf.SLURM_V1, uid=1000)
    node.allocate(
        "slurm-48213.json",
        {"kind": "slurm", "id": "48213", "user": "alice", "account": "nlp", "gpus": list(range(8))},
    )
    samples = node.run()
    meta = {"user": "alice", "account": "nlp"}
    assert samples[uuid(0)]["workloads"] == [job("48213", 10.0, 9.0, **meta)]
    for i in range(1, 8):
        s = samples[uuid(i)]
        assert s["procs"] == 0 and s["util_pct"] == 0.0
        assert s["workloads"] == [job("48213", 10.0, 0.0, **meta)]


def test_a_process_that_appears_mid_interval(tmp_path: Path) -> None:
    """60 % all interval. A pod (systemd driver, names readable) holds the GPU all 10 s; bob's
    notebook process joins at second 4. Seconds 0–3: the pod alone, 4 × 1 = 4 s, air
    4 × 0.6 = 2.4 s. Seconds 4–9: both, each 6 × 1/2 = 3 s, air 6 × 0.6 / 2 = 1.8 s.
    Pod: 7.0 s, air 4.2 s; bob: 3.0 s, air 1.8 s; together the 10 s."""
    node = Node(tmp_path, [gpu(0, const(60), lambda s: [201, 303] if s >= 4 else [201])])
    node.pods.add("chat", "vllm-0")
    node.proc.add(201, pf.K8S_SYSTEMD, uid=0)
    node.proc.add(303, pf.USER_V2, uid=1001)
    s = node.run()[uuid(0)]
    assert s["workloads"] == [
        {"kind": "k8s", "id": "chat/vllm-0", "account": "chat", "share_s": 7.0, "air_s": 4.2},
        {"kind": "user", "id": "bob", "user": "bob", "share_s": 3.0, "air_s": 1.8},
    ]


def test_a_reused_pid_is_another_workload(tmp_path: Path) -> None:
    """40 % all interval; pid 505 is job 48213's process in seconds 0–4, then the job ends and
    bob's new process gets pid 505 (another start time) for seconds 5–9. Job: 5 s, air
    5 × 0.4 = 2.0 s; bob: the same. Resolved from its cgroup once per process, not per second."""
    node = Node(tmp_path, [gpu(0, const(40), const([505]))])
    node.proc.add(505, pf.SLURM_V2, uid=1000, start=1000)

    def reuse() -> None:
        node.proc.remove(505)
        node.proc.add(505, pf.USER_V2, uid=1001, start=2000)

    node.before[5] = reuse
    s = node.run()[uuid(0)]
    assert s["workloads"] == [
        job("48213", 5.0, 2.0, user="alice"),
        {"kind": "user", "id": "bob", "user": "bob", "share_s": 5.0, "air_s": 2.0},
    ]


def test_allocation_files_malformed_unknown_gpu_or_removed_mid_interval(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """GPU 0 at 50 %, GPU 1 at 0 %, no processes. slurm-7001.json gives GPU 0 to carol's job
    until it is removed before second 6: seconds 0–5, share 6 s, air 6 × 0.5 = 3.0 s. A file
    that is not JSON and one naming another node's GPU are skipped (said once each), so GPU 1
    is held by nothing: the key, empty."""
    node = Node(tmp_path, [gpu(0, const(50), const([])), gpu(1, const(0), const([]))])
    node.allocate("slurm-7001.json", {"kind": "slurm", "id": "7001", "user": "carol", "gpus": [0]})
    node.allocate("slurm-7002.json", '{"kind": "slurm", "id": "7002", "gpus": [1')
    node.allocate(
        "slurm-7003.json", {"kind": "slurm", "id": "7003", "gpus": [uuid(1), "GPU-elsewhere"]}
    )
    node.before[6] = lambda: (node.alloc / "slurm-7001.json").unlink()
    with caplog.at_level(logging.WARNING, "gpufleet.agent"):
        samples = node.run()
    assert samples[uuid(0)]["workloads"] == [job("7001", 6.0, 3.0, user="carol")]
    assert samples[uuid(1)]["workloads"] == []
    skipped = [m for m in caplog.messages if "skipped" in m]
    assert len(skipped) == 2
    assert "slurm-7002.json is not JSON" in skipped[0] and "GPU-elsewhere" in skipped[1]


def test_a_gpu_whose_processes_cannot_be_listed_sends_no_workloads(tmp_path: Path) -> None:
    """NVML answers NOT_SUPPORTED for the process list (or NO_PERMISSION, as for a MIG-enabled
    GPU's whole handle to an unprivileged caller): who held it cannot be told, so the sample has
    no key (the server's procs / memory rule), allocation or not."""
    node = Node(tmp_path, [gpu(0, const(0), const([]), unsupported=["procs"])])
    node.allocate("slurm-1.json", {"kind": "slurm", "id": "1", "gpus": [0]})
    s = node.run()[uuid(0)]
    assert "workloads" not in s and "procs" not in s


def test_graphics_processes_hold_the_gpu_too(tmp_path: Path) -> None:
    """A render client on the graphics list only, at 30 %: share 10 s, air 3.0 s."""
    g = gpu(0, const(30), const([]), graphics=lambda t: [404])
    node = Node(tmp_path, [g])
    node.proc.add(404, pf.DOCKER_V2, uid=0)
    s = node.run()[uuid(0)]
    assert s["procs"] == 0  # compute processes, as before
    assert s["workloads"] == [{"kind": "container", "id": pf.CID, "share_s": 10.0, "air_s": 3.0}]


def test_seconds_whose_holders_cannot_be_told_are_left_out(tmp_path: Path) -> None:
    """Process 909 is on the GPU all interval but in /proc only from second 3 on (the agent
    cannot see it before: another PID namespace, say): seconds 0–2 are nobody's, and bob has
    the 7 s at 100 % he could be seen in: share 7.0 s, air 7.0 s."""
    node = Node(tmp_path, [gpu(0, const(100), const([909]))])

    def appears() -> None:
        node.proc.add(909, pf.USER_V1, uid=1001)

    node.before[3] = appears
    s = node.run()[uuid(0)]
    assert s["workloads"] == [
        {"kind": "user", "id": "bob", "user": "bob", "share_s": 7.0, "air_s": 7.0}
    ]


def test_nvml_reading_of_a_gpu_nothing_holds_is_an_empty_list(tmp_path: Path) -> None:
    node = Node(tmp_path, [gpu(0, const(0), const([]))])
    assert node.run()[uuid(0)]["workloads"] == []


# -- the server's rules, at the edges -----------------------------------------------------------


def wire(ws: list[tuple[tuple[Workload, ...], float, int]], seconds: int) -> list[dict[str, Any]]:
    sums: dict[tuple[str, str], WorkloadSum] = {}
    for held, util_sum, n in ws:
        hold(sums, held, util_sum, n)
    return workloads_wire(sums, seconds, "GPU-edge")


def test_rounded_shares_never_add_up_past_the_interval() -> None:
    """Three jobs share a GPU for 2 s at 0 %: each 2/3 s, 0.667 when rounded, 2.001 together.
    The largest share (the first, by id) gives the millisecond back: 0.666 + 0.667 + 0.667."""
    three = tuple(Workload("slurm", str(i)) for i in (1, 2, 3))
    rows = wire([(three, 0.0, 2)], 2)
    assert [r["share_s"] for r in rows] == [0.666, 0.667, 0.667]
    assert sum(r["share_s"] for r in rows) <= 2
    assert_server_accepts(
        {"gpu": "GPU-edge", "start": START, "seconds": 2, "util_pct": 0.0, "workloads": rows}
    )


def test_more_than_32_workloads_keep_the_32_largest_and_say_so_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """40 users' processes share a GPU for 10 s (10/40 = 0.25 s each); four of them also hold
    it together for 1 more second (1/4 = 0.25 s each: 0.5 s). The 32 largest: those four, then
    28 more by id."""
    everyone = tuple(Workload("user", f"u{i:02d}", user=f"u{i:02d}") for i in range(40))
    four = everyone[36:]
    with caplog.at_level(logging.WARNING, "gpufleet.agent"):
        rows = wire([(everyone, 500.0, 10), (four, 0.0, 1)], 11)
        wire([(everyone, 0.0, 10)], 10)
    assert len(rows) == 32
    assert [r["id"] for r in rows[:4]] == ["u36", "u37", "u38", "u39"]
    assert [r["share_s"] for r in rows[:4]] == [0.5] * 4
    assert [r["id"] for r in rows[4:]] == [f"u{i:02d}" for i in range(28)]
    # air: 500 % over 10 s among 40 = 500 / 100 / 40 = 0.125 s each
    assert {r["air_s"] for r in rows} == {0.125}
    assert len([m for m in caplog.messages if "workloads held it" in m]) == 1


def test_strings_are_made_what_the_server_takes() -> None:
    """Control characters dropped (tab, NUL, DEL, a no-break space: not printable), at most 200
    characters, no surrounding whitespace; an id that is left empty, or an unknown kind, is
    not sent; two ids that become the same are one workload."""
    odd = Workload("k8s", "  ns/pod\t-0\x00 ", user="\x7fal\u00a0ice\n", account="", name="n" * 250)
    same = Workload("k8s", "ns/pod-0")
    rows = wire(
        [((odd, same), 100.0, 1), ((Workload("user", "\x01\x02"),), 0.0, 1)]
        + [((Workload("vm", "x"),), 0.0, 1)],
        3,
    )
    assert rows == [
        {
            "kind": "k8s",
            "id": "ns/pod-0",
            "user": "alice",
            "name": "n" * 200,
            "share_s": 1.0,
            "air_s": 1.0,
        }
    ]
    assert_server_accepts(
        {"gpu": "GPU-edge", "start": START, "seconds": 3, "util_pct": 33.3, "workloads": rows}
    )


def test_whatever_the_sources_say_the_server_takes_it() -> None:
    """Seeded random seconds: 0–40 workloads each, ids and names of any characters and any
    length (controls, surrogates, no-break spaces, 300 characters), duplicates, unknown
    kinds, utilisation 0–100 or missing: every sample is one the server accepts."""
    import random

    rng = random.Random(14)
    alphabet = "ab-_/ .\t\n\x00\x7f\u00a0é中\ud800" + "0123456789"

    def text() -> str:
        return "".join(rng.choice(alphabet) for _ in range(rng.choice((0, 1, 5, 40, 300))))

    pool = [
        Workload(rng.choice(("slurm", "k8s", "container", "user", "vm")), text(), text(), text())
        for _ in range(80)
    ]
    for _ in range(60):
        seconds = rng.choice((1, 7, 60, 300))
        sums: dict[tuple[str, str], WorkloadSum] = {}
        for _ in range(seconds):
            held = tuple(rng.choice(pool) for _ in range(rng.randint(0, 40)))
            hold(sums, held, rng.choice((0.0, 37.5, 100.0)), 1)
        rows = workloads_wire(sums, seconds, "GPU-fuzz")
        assert_server_accepts(
            {"gpu": "GPU-f", "start": START, "seconds": seconds, "util_pct": 1.0, "workloads": rows}
        )
