"""Who a process belongs to (cgroups of every runtime and cgroup version, read through a fake
/proc), and the allocation directory (tests/agent/procfs.py says where each format comes from).
The shares these become are in test_agent_shares.py."""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import pytest

from telemetry.agent import workloads as wl
from telemetry.agent.source import Workload
from telemetry.agent.workloads import (
    Allocation,
    AllocationDir,
    Discovery,
    ProcResolver,
    allocation_parse,
    cgroup_owner,
)

from . import procfs as pf

GPUS = {"GPU-aaaa": 0, "GPU-bbbb": 1}


@pytest.mark.parametrize(
    ("cgroup", "owner"),
    [
        (pf.SLURM_V1, ("slurm", "48213")),
        (pf.SLURM_V2, ("slurm", "48213")),
        (pf.SLURM_V2_ARRAY, ("slurm", "1127")),  # the task's own job id; its array form below
        (pf.SLURM_V2_EXTERN, ("slurm", "48214")),
        (pf.K8S_SYSTEMD, ("k8s", pf.POD_UID)),  # '_' back to '-'
        (pf.K8S_CGROUPFS, ("k8s", pf.POD_UID)),
        (pf.K8S_CRIO, ("k8s", pf.POD_UID)),
        (pf.K8S_CONTAINERD_V1_SYSTEMD, ("k8s", pf.STATIC_POD_UID)),
        (pf.DOCKER_V1, ("container", pf.CID)),
        (pf.DOCKER_V2, ("container", pf.CID)),
        (pf.CONTAINERD_PLAIN, ("container", pf.CID2)),
        (pf.CRIO_SCOPE, ("container", pf.CID2)),
        (pf.USER_V2, None),
        (pf.USER_V1, None),
        ("0::/system.slice/podman.service\n1:name=systemd:/jobs.slice/job_x.scope\n", None),
        (f"0::/system.slice/cri-containerd-{pf.CID[:63]}.scope\n", None),  # 63 hex: no id
    ],
)
def test_cgroup_owner_of_each_runtime_and_cgroup_version(
    cgroup: str, owner: tuple[str, str] | None
) -> None:
    assert cgroup_owner(cgroup) == owner


def test_a_job_outranks_a_pod_and_a_pod_its_containers() -> None:
    # Slurm running a container (pyxis/enroot) stays the job; a pod's container is the pod
    nested = f"0::/system.slice/slurmstepd.scope/job_9/step_0/user/task_0/docker-{pf.CID}.scope\n"
    assert cgroup_owner(nested) == ("slurm", "9")
    assert cgroup_owner(pf.K8S_SYSTEMD) == ("k8s", pf.POD_UID)


def resolver(proc: pf.FakeProc, **kw: Any) -> ProcResolver:
    # kubelet's pod log directory beside the fake /proc (made by the pods fixture, where used)
    kw.setdefault("pod_log_root", str(proc.root.parent / "pods"))
    return ProcResolver(str(proc.root), users=pf.user_name, **kw)


def test_each_runtime_becomes_its_workload(proc: pf.FakeProc, pods: pf.FakePodLogs) -> None:
    proc.add(101, pf.SLURM_V1, uid=1000)
    proc.add(102, pf.SLURM_V2, uid=1000, env={"SLURM_JOB_ID": "48213", "SLURM_JOB_ACCOUNT": "nlp"})
    proc.add(
        103,
        pf.SLURM_V2_ARRAY,
        uid=1002,
        env={
            "SLURM_JOB_ID": "1127",
            "SLURM_ARRAY_JOB_ID": "1123",
            "SLURM_ARRAY_TASK_ID": "4",
            "SLURM_JOB_USER": "carol",
            "SLURM_JOB_ACCOUNT": "vision",
            "SLURM_JOB_NAME": "sweep",
        },
    )
    pods.add("chat", "vllm-7d9f8b6c5-k2x4p")
    proc.add(201, pf.K8S_SYSTEMD, uid=0)
    # a static pod (the manifest's hash as UID; kubelet names it <name>-<node>)
    pods.add("kube-system", "dcgm-exporter-gpu-07", pf.STATIC_POD_UID)
    proc.add(202, pf.K8S_CONTAINERD_V1_SYSTEMD, uid=0)
    proc.add(301, pf.DOCKER_V2, uid=0)
    proc.add(302, pf.CONTAINERD_PLAIN, uid=1001)
    proc.add(401, pf.USER_V2, uid=1001, comm="python (nb) x)")  # a name with ') ' in it
    proc.add(402, pf.USER_V1, uid=4242)  # a uid the node has no name for
    r = resolver(proc)
    got = {pid: r.resolve(pid) for pid in (101, 102, 103, 201, 202, 301, 302, 401, 402)}
    assert got == {
        101: Workload("slurm", "48213", user="alice"),
        # the environment's SLURM_JOB_ACCOUNT and SLURM_JOB_USER are the job's user's to write:
        # the user is the uid's, the account the allocation file's (test_agent_trust.py)
        102: Workload("slurm", "48213", user="alice"),
        # the task by its job id; Discovery gives it the array form its environment claims
        103: Workload("slurm", "1127", user="carol", name="sweep"),
        # the names of kubelet's log directory of the pod (test_agent_trust.py: never the
        # pod's own claims, and the UID without an account where the directory is not there)
        201: Workload("k8s", "chat/vllm-7d9f8b6c5-k2x4p", account="chat"),
        202: Workload("k8s", "kube-system/dcgm-exporter-gpu-07", account="kube-system"),
        301: Workload("container", pf.CID),
        302: Workload("container", pf.CID2),
        401: Workload("user", "bob", user="bob"),
        402: Workload("user", "4242", user="4242"),
    }
    assert r.aliases == {"1127": "1123_4"}  # the array form, for the task's other GPUs
    disc = Discovery(r)
    disc.begin(1.0, GPUS)
    assert disc.holders("GPU-aaaa", [103]) == (Workload("slurm", "1123_4", "carol", None, "sweep"),)


def test_an_adopted_process_is_its_job_without_the_job_s_environment(proc: pf.FakeProc) -> None:
    # an ssh session pam_slurm_adopt moved into job 48213: the cgroup says the job; the
    # session's environment names no job (a job name alone is not the job's)
    proc.add(110, pf.SLURM_V2, uid=1000, env={"SLURM_JOB_NAME": "other"})
    assert resolver(proc).resolve(110) == Workload("slurm", "48213", user="alice")


def test_a_pod_goes_by_its_name_whatever_its_hostname(
    proc: pf.FakeProc, pods: pf.FakePodLogs
) -> None:
    """A host-network pod's HOSTNAME is the node's, a pod with spec.hostname has that one: the
    name is the pod's all the same (before: the node's name made it go by its UID, and
    spec.hostname stood in for the name)."""
    pods.add("monitoring", "node-exporter-x7k2p")
    proc.add(220, pf.K8S_SYSTEMD, uid=0, env={"HOSTNAME": "gpu-07"}, namespace="monitoring")
    assert resolver(proc).resolve(220) == Workload(
        "k8s", "monitoring/node-exporter-x7k2p", account="monitoring"
    )
    pods.add("research", "train-llm-0", pf.STATIC_POD_UID)
    proc.add(221, pf.K8S_CONTAINERD_V1_SYSTEMD, uid=0, env={"HOSTNAME": "trainer"})
    assert resolver(proc).resolve(221) == Workload(
        "k8s", "research/train-llm-0", account="research"
    )


def test_without_ptrace_rights_pods_keep_their_names_and_it_is_said_once(
    proc: pf.FakeProc,
    pods: pf.FakePodLogs,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A non-root agent (DynamicUser) reads cgroup and status of every process, but not the
    environ of other users' processes: EACCES, as the kernel answers. Pods keep their names
    (the pod log directory is world-readable); Slurm jobs lose their environment's name."""
    real = wl._read

    def denied(path: str, limit: int = 65536) -> bytes:
        if path.endswith("/environ") or "/root/" in path:
            raise PermissionError(13, "Permission denied", path)
        return real(path, limit)

    monkeypatch.setattr(wl, "_read", denied)
    pods.add("chat", "vllm-0")
    proc.add(201, pf.K8S_SYSTEMD, uid=0)
    proc.add(202, pf.K8S_CGROUPFS, uid=0)
    proc.add(102, pf.SLURM_V2_ARRAY, uid=1002, env={"SLURM_JOB_ID": "1127", "SLURM_JOB_NAME": "x"})
    proc.add(103, pf.SLURM_V2, uid=1000, env={"SLURM_JOB_ID": "48213"})
    r = resolver(proc)
    with caplog.at_level(logging.WARNING, "gpufleet.agent"):
        assert r.resolve(201) == Workload("k8s", "chat/vllm-0", account="chat")
        assert r.resolve(202) == Workload("k8s", "chat/vllm-0", account="chat")
        assert r.resolve(102) == Workload("slurm", "1127", user="carol")
        assert r.resolve(103) == Workload("slurm", "48213", user="alice")
    said = [m for m in caplog.messages if "CAP_SYS_PTRACE" in m]
    assert len(said) == 1 and "/proc/<pid>/environ" in said[0]  # once, whatever the processes


def test_a_pid_is_resolved_once_and_again_when_reused(
    proc: pf.FakeProc, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads: list[str] = []
    real = wl._read

    def counting(path: str, limit: int = 65536) -> bytes:
        reads.append(path.rsplit("/", 1)[-1])
        return real(path, limit)

    monkeypatch.setattr(wl, "_read", counting)
    proc.add(500, pf.SLURM_V2, uid=1000, start=777)
    r = resolver(proc)
    for _ in range(30):
        r.tick()
        assert r.resolve(500) == Workload("slurm", "48213", user="alice")
    assert reads.count("cgroup") == 1 and reads.count("stat") == 30
    # the job ends; a new process of bob's gets pid 500 (another start time)
    proc.remove(500)
    proc.add(500, pf.USER_V2, uid=1001, start=9_999)
    r.tick()
    assert r.resolve(500) == Workload("user", "bob", user="bob")
    assert reads.count("cgroup") == 2


def test_the_cache_forgets_pids_not_seen_for_a_while(proc: pf.FakeProc) -> None:
    proc.add(600, pf.USER_V2, uid=1001)
    r = resolver(proc)
    r.tick()
    r.resolve(600)
    assert 600 in r._cache
    for _ in range(wl.CACHE_IDLE_TICKS + 60):
        r.tick()
    assert 600 not in r._cache


def test_a_process_that_is_not_there_cannot_be_told(
    proc: pf.FakeProc, caplog: pytest.LogCaptureFixture
) -> None:
    r = resolver(proc)
    with caplog.at_level(logging.WARNING, "gpufleet.agent"):
        assert r.resolve(4242) is None
        assert r.resolve(4243) is None
    assert len([m for m in caplog.messages if "PID namespace" in m]) == 1


# -- allocation files ---------------------------------------------------------------------------

JOB = {"kind": "slurm", "id": "48213", "user": "alice", "account": "nlp", "name": "train-llm"}


def write(d: Path, name: str, body: Any) -> Path:
    p = d / name
    tmp = d / f".{name}.tmp"
    tmp.write_text(body if isinstance(body, str) else json.dumps(body))
    os.replace(tmp, p)  # as the hooks do: whole or not at all
    return p


def test_allocation_files_are_parsed_and_checked() -> None:
    a = allocation_parse({**JOB, "gpus": ["GPU-aaaa", 1, "1"]}, "x.json")
    assert a == Allocation(
        Workload("slurm", "48213", "alice", "nlp", "train-llm"), ("GPU-aaaa", 1), None, "x.json"
    )
    assert allocation_parse({"kind": "slurm", "id": 7, "gpus": [0], "job_id": "9"}) == Allocation(
        Workload("slurm", "7"), (0,), "9"
    )
    bad = {
        "is not a JSON object": [],
        "kind must be": {**JOB, "kind": "vm", "gpus": [0]},
        "id must be": {**JOB, "id": " ", "gpus": [0]},
        "user must be a string": {**JOB, "user": 5, "gpus": [0]},
        "gpus must be a list of 1 to 1024": {**JOB, "gpus": []},
        "neither a GPU UUID nor an index": {**JOB, "gpus": [True]},
        "job_id must be": {**JOB, "gpus": [0], "job_id": "12a"},
    }
    for why, data in bad.items():
        got = allocation_parse(data)
        assert isinstance(got, str) and why in got, (why, got)


def test_allocation_dir_skips_bad_files_once_per_version(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    d = tmp_path / "alloc"
    d.mkdir()
    write(d, "slurm-1.json", {**JOB, "gpus": [0, "GPU-bbbb"]})
    write(d, "slurm-2.json", "{not json")
    write(d, "slurm-3.json", {**JOB, "id": "3", "gpus": ["GPU-ffff"]})  # not this node's
    write(d, "slurm-4.json", {**JOB, "id": "4", "gpus": [7]})  # no GPU 7 here
    (d / "README").write_text("not an allocation")
    (d / ".slurm-5.json.Xa9f").write_text("{half a fi")  # a hook still writing
    (d / "slurm-6.json").mkdir()  # not a regular file
    src = AllocationDir(str(d))
    with caplog.at_level(logging.WARNING, "gpufleet.agent"):
        for s in range(5):
            got = src.allocations(100.0 + s, GPUS)
            assert [a.origin for a in got] == ["slurm-1.json"]
        assert len(caplog.messages) == 4  # 2, 3, 4, 6: each once, whatever the ticks
        assert all("skipped" in m for m in caplog.messages)
        write(d, "slurm-2.json", "{still not json}")  # a new version: said again
        src.allocations(106.0, GPUS)
    assert len(caplog.messages) == 5 and "slurm-2.json" in caplog.messages[-1]


def test_allocation_dir_looks_at_most_once_a_second_and_cheaply(tmp_path: Path) -> None:
    d = tmp_path / "alloc"
    assert AllocationDir(str(d)).allocations(1.0, GPUS) == ()  # no directory: no hook here
    d.mkdir()
    # the file system's clock far ahead: the directory's mtime is never "racy"
    src = AllocationDir(str(d), wall=lambda: time.time() + 3600)
    assert src.allocations(100.0, GPUS) == ()
    p = write(d, "slurm-1.json", {**JOB, "gpus": [0]})
    assert src.allocations(100.5, GPUS) == ()  # within the second: not looked at
    first = src.allocations(101.0, GPUS)  # the directory changed: read
    assert [a.workload.id for a in first] == ["48213"]
    assert src.allocations(102.0, GPUS) is first  # the same object: nothing to rebuild
    # a file rewritten in place (no rename): the directory does not change; the full rescan
    # after ALLOC_RESCAN_S sees it
    dir_mtime = d.stat().st_mtime_ns
    p.write_text(json.dumps({**JOB, "id": "48214", "gpus": [0]}))
    os.utime(d, ns=(dir_mtime, dir_mtime))
    assert src.allocations(103.0, GPUS) is first
    later = src.allocations(101.0 + wl.ALLOC_RESCAN_S, GPUS)
    assert [a.workload.id for a in later] == ["48214"]
    p.unlink()
    assert src.allocations(102.0 + wl.ALLOC_RESCAN_S, GPUS) == ()


def test_allocation_dir_right_after_a_change_looks_again(tmp_path: Path) -> None:
    """Two changes within one tick of the directory's mtime: while the mtime is that recent the
    directory is read at every look, so the second change is not missed."""
    d = tmp_path / "alloc"
    d.mkdir()
    src = AllocationDir(str(d))  # the real clock: the mtime is seconds old at most
    write(d, "slurm-1.json", {**JOB, "gpus": [0]})
    assert len(src.allocations(100.0, GPUS)) == 1
    mtime = d.stat().st_mtime_ns
    write(d, "slurm-2.json", {**JOB, "id": "2", "gpus": [1]})
    os.utime(d, ns=(mtime, mtime))  # the same mtime, as a coarse file system would show
    assert len(src.allocations(101.0, GPUS)) == 2


# -- both together ------------------------------------------------------------------------------


class Allocs:
    def __init__(self, *allocs: Allocation) -> None:
        self.current = tuple(allocs)

    def allocations(self, now: float, gpus: Any) -> tuple[Allocation, ...]:
        return self.current


def test_discovery_merges_a_job_s_process_and_its_allocation(proc: pf.FakeProc) -> None:
    proc.add(101, pf.SLURM_V1, uid=1000)  # says job 48213 and alice, nothing more
    proc.add(102, pf.USER_V2, uid=1001)
    alloc = Allocation(Workload("slurm", "48213", "alice", "nlp", "train-llm"), (0, 1))
    disc = Discovery(resolver(proc), Allocs(alloc))
    disc.begin(1.0, GPUS)
    job = Workload("slurm", "48213", "alice", "nlp", "train-llm")
    assert disc.holders("GPU-aaaa", [101, 102]) == (job, Workload("user", "bob", user="bob"))
    assert disc.holders("GPU-bbbb", []) == (job,)  # allocated, no process: held all the same
    assert disc.holders("GPU-aaaa", [101, 4242]) is None  # a process it cannot see


def test_an_array_task_has_one_id_on_every_gpu(proc: pf.FakeProc) -> None:
    """The prolog knows the task by its job id (1127); the process's environment says 1123_4.
    Before the process is seen the allocation goes as 1127; after, everything as 1123_4."""
    alloc = Allocation(Workload("slurm", "1127", "carol", "vision"), (0, 1))
    proc.add(
        103,
        pf.SLURM_V2_ARRAY,
        uid=1002,
        env={"SLURM_JOB_ID": "1127", "SLURM_ARRAY_JOB_ID": "1123", "SLURM_ARRAY_TASK_ID": "4"},
    )
    disc = Discovery(resolver(proc), Allocs(alloc))
    disc.begin(1.0, GPUS)
    assert disc.holders("GPU-bbbb", []) == (Workload("slurm", "1127", "carol", "vision"),)
    task = Workload("slurm", "1123_4", "carol", "vision")
    assert disc.holders("GPU-aaaa", [103]) == (task,)
    disc.begin(2.0, GPUS)
    assert disc.holders("GPU-bbbb", []) == (task,)
    # an allocation file that says the array form itself (job_id: the numeric id)
    said = Allocation(Workload("slurm", "1123_4", "carol", "vision"), ("GPU-aaaa",), "1127")
    proc.add(104, pf.SLURM_V2_ARRAY, uid=1002)  # its environment says nothing
    disc2 = Discovery(resolver(proc), Allocs(said))
    disc2.begin(1.0, GPUS)
    assert disc2.holders("GPU-aaaa", [104]) == (task,)
