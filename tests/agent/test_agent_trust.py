"""What the agent believes when it names the workload holding a GPU (docs/agent.md, "What the
agent trusts"), tried as a job's user would attack it: names in cgroups the user made, claims in
the environment, allocation files someone else wrote, and files that never answer or that crash
a parser. Each test failed before the fix it covers (issue 47, items 1 and 2)."""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from telemetry.agent import workloads as wl
from telemetry.agent.source import Workload
from telemetry.agent.workloads import (
    Allocation,
    AllocationDir,
    Discovery,
    allocation_parse,
    cgroup_owner,
)

from . import procfs as pf
from .test_agent_workloads import resolver

GPUS = {"GPU-aaaa": 0, "GPU-bbbb": 1}
# a bounded check that a call returns at all (before the fixes it never did), not a timing gate
RETURNS_WITHIN_S = 5.0


class Allocs:
    def __init__(self, *allocs: Allocation) -> None:
        self.current = tuple(allocs)

    def allocations(self, now: float, gpus: Any) -> tuple[Allocation, ...]:
        return self.current


def returns(call: Callable[[], Any]) -> Any:
    """``call()`` run in a thread: its answer, or a failure if it has not returned within
    RETURNS_WITHIN_S (the thread is a daemon: a call that never returns is left behind)."""
    out: list[Any] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            out.append(call())
        except BaseException as e:  # handed to the test
            errors.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(RETURNS_WITHIN_S)
    assert not t.is_alive(), f"did not return within {RETURNS_WITHIN_S} s"
    if errors:
        raise errors[0]
    return out[0]


# -- 1. identity only from what the job's user cannot write -------------------------------------


@pytest.mark.parametrize("what", sorted(pf.FORGED))
def test_a_cgroup_named_by_its_user_places_a_process_nowhere(what: str) -> None:
    """bob names cgroups in his own subtree like slurmd's, kubelet's or a runtime's: none of it
    counts (before: a job_<N>, pod<uid> or container id anywhere in the path did)."""
    assert cgroup_owner(pf.FORGED[what]) is None


def test_only_the_daemon_s_position_counts_inside_a_job_too() -> None:
    """A job's process makes a sub-cgroup named like another job inside its own: it is its
    job's (5000), never the one it named."""
    nested = "0::/system.slice/slurmstepd.scope/job_5000/step_0/user/task_0/job_4242/x\n"
    assert cgroup_owner(nested) == ("slurm", "5000")
    # with several slurmds per node the scope is <node>_slurmstepd.scope, and v1's root slurm_<node>
    assert cgroup_owner("0::/system.slice/gpu-07_slurmstepd.scope/job_7/step_0\n") == ("slurm", "7")
    assert cgroup_owner("4:memory:/slurm_gpu-07/uid_1000/job_8/step_0\n") == ("slurm", "8")
    # a pod slice in the wrong QoS level's slice is not where kubelet puts it
    wrong = (
        f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-burstable-pod{pf.POD_UID_}.slice\n"
    )
    assert cgroup_owner(wrong) is None


def test_a_forged_job_cgroup_takes_no_one_s_job(proc: pf.FakeProc) -> None:
    """The red team's case: bob moves his process into
    /user.slice/user-1001.slice/user@1001.service/app.slice/job_4242 and sets SLURM_JOB_ID=4242
    and an array id. Before: "Slurm job 4242" (renamed 4000_3 on every GPU) with alice's
    allocation-file identity (user alice, account nlp). Now: bob's own process; alice's job
    keeps its id and GPU."""
    proc.add(
        900,
        pf.FORGED["a job"],
        uid=1001,
        env={"SLURM_JOB_ID": "4242", "SLURM_ARRAY_JOB_ID": "4000", "SLURM_ARRAY_TASK_ID": "3"},
    )
    alice = Allocation(Workload("slurm", "4242", "alice", "nlp", "train"), (1,))
    disc = Discovery(resolver(proc), Allocs(alice))
    disc.begin(1.0, GPUS)
    assert disc.holders("GPU-aaaa", [900]) == (Workload("user", "bob", user="bob"),)
    disc.begin(2.0, GPUS)
    assert disc.holders("GPU-bbbb", []) == (Workload("slurm", "4242", "alice", "nlp", "train"),)


@pytest.mark.parametrize("cgroup", ["a cgroupfs pod", "a Docker scope"])
def test_a_forged_pod_or_container_cgroup_is_its_user(
    proc: pf.FakeProc, pods: pf.FakePodLogs, cgroup: str
) -> None:
    pods.add("finance", "vllm-0")  # the real pod whose UID bob's cgroup names
    proc.add(901, pf.FORGED[cgroup], uid=1001, env={"HOSTNAME": "vllm-0"}, namespace="finance")
    assert resolver(proc).resolve(901) == Workload("user", "bob", user="bob")


def test_a_pod_that_rewrote_its_own_claims_keeps_the_names_kubelet_gave_it(
    proc: pf.FakeProc, pods: pf.FakePodLogs
) -> None:
    """The red team's pod chat/vllm-0 rewrites its service-account namespace file to "finance"
    and sets HOSTNAME=payroll-0 (a container that may write its own root and environment can).
    Before: workload finance/payroll-0, account finance (the finance team charged, its owners
    told). Now: chat/vllm-0, account chat, from kubelet's log directory on the host."""
    pods.add("chat", "vllm-0")
    proc.add(970, pf.K8S_SYSTEMD, uid=0, env={"HOSTNAME": "payroll-0"}, namespace="finance")
    assert resolver(proc).resolve(970) == Workload("k8s", "chat/vllm-0", account="chat")


@pytest.mark.parametrize("host", ["no pod log root", "no directory of the pod", "kubelet < 1.14"])
def test_without_kubelet_s_copy_a_pod_goes_by_its_uid_with_no_account(
    proc: pf.FakeProc, tmp_path: Path, caplog: pytest.LogCaptureFixture, host: str
) -> None:
    """Where the agent cannot see kubelet's names (no /var/log/pods mounted, the pod's
    directory not there, or a kubelet before 1.14 that named it by the UID alone), the pod is
    its UID with no account, said once. Before: finance/payroll-0, account finance, from the
    pod's own claims."""
    if host != "no pod log root":
        root = pf.FakePodLogs(tmp_path / "pods")
        root.add("chat", "vllm-1", "0f0e0d0c-0b0a-4909-8807-060504030201")  # another pod
        if host == "kubelet < 1.14":
            (root.root / pf.POD_UID).mkdir()
    proc.add(971, pf.K8S_SYSTEMD, uid=0, env={"HOSTNAME": "payroll-0"}, namespace="finance")
    proc.add(972, pf.K8S_CRIO, uid=0, env={"HOSTNAME": "payroll-1"}, namespace="finance")
    r = resolver(proc)
    with caplog.at_level(logging.WARNING, "gpufleet.agent"):
        assert r.resolve(971) == Workload("k8s", pf.POD_UID)
        assert r.resolve(972) == Workload("k8s", pf.POD_UID)
    said = [m for m in caplog.messages if "sent by its UID" in m or "sent by their UID" in m]
    assert len(said) == 1, said


def test_a_pod_log_entry_kubelet_did_not_write_is_not_believed(
    proc: pf.FakeProc, pods: pf.FakePodLogs, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The pod's UID with a second entry beside kubelet's (someone else made one), an entry
    that is a link, one whose names are no namespace and pod name, or a root others may write:
    the pod goes by its UID, and it is said. The same tree made right names it again."""
    proc.add(973, pf.K8S_SYSTEMD, uid=0)
    real = pods.add("chat", "vllm-0")
    fake = pods.add("finance", "payroll-0")  # the same (default) UID
    chat = Workload("k8s", "chat/vllm-0", account="chat")
    cases: list[tuple[str, Callable[[], None], Callable[[], None]]] = [
        ("2 log directories", lambda: None, lambda: shutil.rmtree(fake)),
        (
            "is not a directory",
            lambda: (real.rename(tmp_path / "elsewhere"), real.symlink_to(tmp_path / "elsewhere")),
            lambda: (real.unlink(), (tmp_path / "elsewhere").rename(real)),
        ),
        (
            "is not <namespace>_<name>_<uid>",
            lambda: real.rename(pods.root / f"Chat_vllm-0_{pf.POD_UID}"),
            lambda: (pods.root / f"Chat_vllm-0_{pf.POD_UID}").rename(real),
        ),
        (
            "is writable by group or others (mode 0777)",
            lambda: pods.root.chmod(0o777),
            lambda: pods.root.chmod(0o755),
        ),
    ]
    for why, spoil, mend in cases:
        spoil()
        caplog.clear()
        with caplog.at_level(logging.WARNING, "gpufleet.agent"):
            assert resolver(proc).resolve(973) == Workload("k8s", pf.POD_UID), why
        assert any(why in m for m in caplog.messages), (why, caplog.messages)
        mend()
    assert resolver(proc).resolve(973) == chat


def test_a_pod_log_root_or_entry_of_another_owner_is_not_believed(
    proc: pf.FakeProc, pods: pf.FakePodLogs, caplog: pytest.LogCaptureFixture
) -> None:
    """bob (uid 1001) made the pod's entry, or owns the root (could make any): not kubelet's."""
    if os.geteuid() != 0:
        pytest.skip("giving a directory to another uid needs root")
    proc.add(974, pf.K8S_SYSTEMD, uid=0)
    d = pods.add("finance", "payroll-0")
    os.chown(d, 1001, 1001)
    with caplog.at_level(logging.WARNING, "gpufleet.agent"):
        assert resolver(proc).resolve(974) == Workload("k8s", pf.POD_UID)
    assert any("belongs to uid 1001" in m for m in caplog.messages)
    os.chown(d, 0, 0)
    os.chown(pods.root, 1001, 1001)
    caplog.clear()
    with caplog.at_level(logging.WARNING, "gpufleet.agent"):
        assert resolver(proc).resolve(974) == Workload("k8s", pf.POD_UID)
    assert any("belongs to uid 1001" in m for m in caplog.messages)


def test_a_path_from_another_cgroup_namespace_is_said(
    proc: pf.FakeProc, caplog: pytest.LogCaptureFixture
) -> None:
    """An agent in a container with a cgroup namespace of its own sees others' cgroups as
    "/../.."-relative paths, where no position can be told: its processes are their users',
    and the operator is told why."""
    proc.add(902, pf.FORGED["another cgroup namespace"], uid=1001)
    with caplog.at_level(logging.WARNING, "gpufleet.agent"):
        assert resolver(proc).resolve(902) == Workload("user", "bob", user="bob")
    assert any("run the agent in the host's cgroup namespace" in m for m in caplog.messages)


def test_the_environment_never_names_the_user_or_the_account(proc: pf.FakeProc) -> None:
    """carol (uid 1002) runs job 48213 with SLURM_JOB_USER=alice, SLURM_JOB_ACCOUNT=finance in
    her environment: before, the job was alice's and finance's. The user is the uid's; the
    account comes from the job's allocation file (root's), else there is none."""
    env = {"SLURM_JOB_ID": "48213", "SLURM_JOB_USER": "alice", "SLURM_JOB_ACCOUNT": "finance"}
    proc.add(910, pf.SLURM_V2, uid=1002, env=env)
    assert resolver(proc).resolve(910) == Workload("slurm", "48213", user="carol")
    alloc = Allocation(Workload("slurm", "48213", "carol", "vision"), (0,))
    disc = Discovery(resolver(proc), Allocs(alloc))
    disc.begin(1.0, GPUS)
    assert disc.holders("GPU-aaaa", [910]) == (Workload("slurm", "48213", "carol", "vision"),)


def test_an_array_claim_cannot_take_another_job_s_task(proc: pf.FakeProc) -> None:
    """carol's job 5000 says SLURM_ARRAY_JOB_ID=1000, SLURM_ARRAY_TASK_ID=3: bob's task 1000_3
    (job 1003, as his allocation file says). Before: carol's process became "1000_3" with bob's
    user and account. Now the file's claim stands and carol's job goes by its own id."""
    claim = {"SLURM_JOB_ID": "5000", "SLURM_ARRAY_JOB_ID": "1000", "SLURM_ARRAY_TASK_ID": "3"}
    proc.add(
        920, "0::/system.slice/slurmstepd.scope/job_5000/step_0/user/task_0\n", uid=1002, env=claim
    )
    bob = Allocation(Workload("slurm", "1000_3", "bob", "nlp"), (1,), "1003")
    disc = Discovery(resolver(proc), Allocs(bob))
    disc.begin(1.0, GPUS)
    assert disc.holders("GPU-aaaa", [920]) == (Workload("slurm", "5000", user="carol"),)
    assert disc.holders("GPU-bbbb", []) == (Workload("slurm", "1000_3", "bob", "nlp"),)


def test_an_array_form_two_jobs_claim_is_believed_for_neither(
    proc: pf.FakeProc, caplog: pytest.LogCaptureFixture
) -> None:
    """Without a file to settle it, bob's task (job 1003) and carol's job 5000 both say 1000_3:
    each goes by its job id (before: whichever was read last renamed both into one workload).
    A claim of an array id above the job's own is no Slurm array (its id comes first)."""
    v2 = "0::/system.slice/slurmstepd.scope/job_{}/step_0/user/task_0\n"
    arr = {"SLURM_ARRAY_JOB_ID": "1000", "SLURM_ARRAY_TASK_ID": "3"}
    proc.add(930, v2.format(1003), uid=1001, env={"SLURM_JOB_ID": "1003", **arr})
    proc.add(931, v2.format(5000), uid=1002, env={"SLURM_JOB_ID": "5000", **arr})
    future = {"SLURM_JOB_ID": "600", "SLURM_ARRAY_JOB_ID": "9000", "SLURM_ARRAY_TASK_ID": "1"}
    proc.add(932, v2.format(600), uid=1000, env=future)
    disc = Discovery(resolver(proc))
    disc.begin(1.0, GPUS)
    with caplog.at_level(logging.WARNING, "gpufleet.agent"):
        got = disc.holders("GPU-aaaa", [930, 931, 932])
    assert got == (
        Workload("slurm", "1003", user="bob"),
        Workload("slurm", "5000", user="carol"),
        Workload("slurm", "600", user="alice"),
    )
    assert any("1003, 5000 each say they are array task 1000_3" in m for m in caplog.messages)


def test_a_job_whose_processes_name_two_array_tasks_goes_by_its_id(proc: pf.FakeProc) -> None:
    v2 = "0::/system.slice/slurmstepd.scope/job_1127/step_0/user/task_0\n"
    base = {"SLURM_JOB_ID": "1127", "SLURM_ARRAY_JOB_ID": "1123"}
    proc.add(940, v2, uid=1002, env={**base, "SLURM_ARRAY_TASK_ID": "4"})
    proc.add(941, v2, uid=1002, env={**base, "SLURM_ARRAY_TASK_ID": "5"})
    disc = Discovery(resolver(proc))
    disc.begin(1.0, GPUS)
    assert disc.holders("GPU-aaaa", [940]) == (Workload("slurm", "1123_4", user="carol"),)
    # the second claim takes the first back (before: the job was renamed 1123_5)
    assert disc.holders("GPU-aaaa", [940, 941]) == (Workload("slurm", "1127", user="carol"),)


def test_a_process_whose_claims_disagree_is_its_user(
    proc: pf.FakeProc, caplog: pytest.LogCaptureFixture
) -> None:
    """Its environment names another job than its cgroup (before: the cgroup's job, quietly);
    or its job's allocation file names another user than it runs as (before: the job, under
    the file's user). Both: its uid's, said once; the allocation still holds its GPUs."""
    proc.add(950, pf.SLURM_V2, uid=1001, env={"SLURM_JOB_ID": "5"})
    proc.add(951, pf.SLURM_V1.replace("48213", "48214"), uid=1001)
    alice = Allocation(Workload("slurm", "48214", "alice", "nlp"), (0, 1))
    disc = Discovery(resolver(proc), Allocs(alice))
    disc.begin(1.0, GPUS)
    bob = Workload("user", "bob", user="bob")
    with caplog.at_level(logging.WARNING, "gpufleet.agent"):
        assert disc.holders("GPU-aaaa", [950]) == (bob, alice.workload)
        assert disc.holders("GPU-bbbb", [951]) == (bob, alice.workload)
    assert any("environment says job '5'" in m for m in caplog.messages)
    assert any("whose allocation file names user alice" in m for m in caplog.messages)


# -- allocation files only from the scheduler's hook ------------------------------------------

JOB = {"kind": "slurm", "id": "48213", "user": "alice", "account": "nlp"}


def put(d: Path, name: str, body: Any) -> Path:
    p = d / name
    if isinstance(body, bytes):
        p.write_bytes(body)
    else:
        p.write_text(body if isinstance(body, str) else json.dumps(body))
    return p


def test_an_allocation_file_someone_else_could_write_is_not_believed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A file that group or others may write is skipped and said; so is every file of a
    directory that others may write (they could put or swap files in it)."""
    d = tmp_path / "alloc"
    d.mkdir(mode=0o755)
    put(d, "slurm-1.json", {**JOB, "id": "1", "gpus": [0]})
    put(d, "slurm-3.json", {**JOB, "id": "3", "gpus": [1]}).chmod(0o666)
    put(d, "slurm-4.json", {**JOB, "id": "4", "gpus": [1]}).chmod(0o664)
    src = AllocationDir(str(d), owners={os.geteuid()})
    with caplog.at_level(logging.WARNING, "gpufleet.agent"):
        assert [a.workload.id for a in src.allocations(1.0, GPUS)] == ["1"]
    said = "\n".join(caplog.messages)
    assert "slurm-3.json is writable by group or others (mode 0666)" in said
    assert "slurm-4.json is writable by group or others (mode 0664)" in said
    d.chmod(0o1777)  # a sticky, world-writable directory, as /tmp
    caplog.clear()
    with caplog.at_level(logging.WARNING, "gpufleet.agent"):
        assert src.allocations(2.0, GPUS) == ()
    assert "no allocation in it is believed" in caplog.messages[0]
    d.chmod(0o755)
    assert [a.workload.id for a in src.allocations(3.0, GPUS)] == ["1"]


def test_an_allocation_file_of_another_user_is_not_believed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """bob (uid 1001) wrote a file naming alice's job: not the hook's (root's)."""
    if os.geteuid() != 0:
        pytest.skip("giving a file to another uid needs root")
    d = tmp_path / "alloc"
    d.mkdir(mode=0o755)
    os.chown(put(d, "slurm-2.json", {**JOB, "id": "2", "gpus": [1]}), 1001, 1001)
    with caplog.at_level(logging.WARNING, "gpufleet.agent"):
        assert AllocationDir(str(d)).allocations(1.0, GPUS) == ()
    assert "slurm-2.json belongs to uid 1001, not to root" in caplog.messages[0]
    os.chown(d, 1001, 1001)
    os.chown(d / "slurm-2.json", 0, 0)
    caplog.clear()
    with caplog.at_level(logging.WARNING, "gpufleet.agent"):
        assert AllocationDir(str(d)).allocations(1.0, GPUS) == ()  # bob's directory
    assert "belongs to uid 1001" in caplog.messages[0]


def test_the_default_owners_are_root_and_the_agent_s_user() -> None:
    assert AllocationDir("/nonexistent").owners == {0, os.geteuid()}


# -- 2. nothing a workload writes stops or crashes the agent ------------------------------------


def test_a_fifo_in_the_pod_s_own_files_is_never_opened(
    proc: pf.FakeProc, pods: pf.FakePodLogs
) -> None:
    """The pod replaces its namespace file with a FIFO: before, open() waited for a writer
    forever inside the tick. Now the agent reads none of the pod's files (its names are
    kubelet's), and _read refuses a FIFO at once wherever one stands."""
    pods.add("chat", "vllm-0")
    d = proc.add(960, pf.K8S_SYSTEMD, uid=0, env={"HOSTNAME": "vllm-0"}, namespace="chat")
    ns = d / "root" / "run" / "secrets" / "kubernetes.io" / "serviceaccount" / "namespace"
    ns.unlink()
    os.mkfifo(ns)
    try:
        got = returns(lambda: resolver(proc).resolve(960))
        assert got == Workload("k8s", "chat/vllm-0", account="chat")
        with pytest.raises(wl.NotRegularFile):
            returns(lambda: wl._read(str(ns)))
    finally:
        # a reader still waiting (the code before the fix) is let go
        try:
            os.close(os.open(ns, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass


def test_a_read_that_never_returns_costs_the_tick_at_most_its_wait(
    proc: pf.FakeProc, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A process whose files never answer (a FUSE mount it controls, its memory locked while
    /proc reads its environment): the tick goes on without its workload, other processes are
    still read, and once the read returns the process is its job's."""
    release = threading.Event()
    real = wl._read

    def hangs(path: str, limit: int = 65536) -> bytes:
        if path.endswith("/970/environ"):
            release.wait(30)
        return real(path, limit)

    monkeypatch.setattr(wl, "_read", hangs)
    monkeypatch.setattr(wl, "RESOLVE_STUCK_S", 0.0)
    proc.add(970, pf.SLURM_V2, uid=1000, env={"SLURM_JOB_ID": "48213"})
    proc.add(971, pf.USER_V2, uid=1001)
    disc = Discovery(resolver(proc, wait_s=0.2))
    bob = (Workload("user", "bob", user="bob"),)
    try:
        with caplog.at_level(logging.WARNING, "gpufleet.agent"):
            # a tick waits for new processes' reads wait_s in all: bob's first, then 970's
            disc.begin(1.0, GPUS)
            assert returns(lambda: disc.holders("GPU-bbbb", [971])) == bob
            assert returns(lambda: disc.holders("GPU-aaaa", [970])) is None
            disc.begin(2.0, GPUS)
            assert returns(lambda: disc.holders("GPU-aaaa", [970])) is None
            assert returns(lambda: disc.holders("GPU-bbbb", [971])) == bob
        assert any("reading /proc/970 has not returned" in m for m in caplog.messages)
    finally:
        release.set()
    deadline = time.monotonic() + RETURNS_WITHIN_S
    got = None
    while got is None and time.monotonic() < deadline:
        disc.begin(3.0, GPUS)
        got = disc.holders("GPU-aaaa", [970])
    assert got == (Workload("slurm", "48213", user="alice"),)


def test_reads_that_never_return_hold_a_few_threads_and_no_more(
    proc: pf.FakeProc, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    release = threading.Event()
    real = wl._read

    def hangs(path: str, limit: int = 65536) -> bytes:
        if path.endswith("/cgroup"):
            release.wait(30)
        return real(path, limit)

    monkeypatch.setattr(wl, "_read", hangs)
    n = wl.RESOLVE_THREADS + 3
    for pid in range(980, 980 + n):
        proc.add(pid, pf.USER_V2, uid=1001)
    r = resolver(proc, wait_s=0.05)
    before = threading.active_count()
    try:
        with caplog.at_level(logging.WARNING, "gpufleet.agent"):
            r.tick()
            assert [returns(lambda p=p: r.resolve(p)) for p in range(980, 980 + n)] == [None] * n
        assert threading.active_count() - before <= wl.RESOLVE_THREADS
        assert any("reads have not returned" in m for m in caplog.messages)
    finally:
        release.set()


@pytest.mark.parametrize(
    ("body", "why"),
    [
        ({**JOB, "gpus": ["²"]}, "names GPUs this node does not have (²)"),  # "²".isdigit()
        ({**JOB, "gpus": ["7" * 5000]}, "neither a GPU UUID nor an index"),
        ('{"kind": "slurm", "id": "1", "gpus": [' + "7" * 5000 + "]}", "is not JSON"),
        ("[" * 30_000 + "]" * 30_000, "is not JSON (nested too deeply)"),
        ({**JOB, "gpus": [0], "job_id": "١٢"}, "job_id must be the numeric Slurm job id"),
        ({**JOB, "gpus": [10**30]}, "neither a GPU UUID nor an index"),
        ({**JOB, "gpus": list(range(2000))}, "gpus must be a list of 1 to 1024"),
    ],
)
def test_an_allocation_file_that_crashed_the_agent_is_skipped_and_said(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, body: Any, why: str
) -> None:
    """Before: int("²") and int() of 5,000 digits raised ValueError, 30,000 nested arrays
    RecursionError, out of the tick: the agent died, and systemd restarted it into the same
    file. Now each file is skipped and said; the good file beside it still counts."""
    d = tmp_path / "alloc"
    d.mkdir()
    put(d, "slurm-1.json", {**JOB, "id": "1", "gpus": [0]})
    put(d, "slurm-2.json", body)
    with caplog.at_level(logging.WARNING, "gpufleet.agent"):
        got = AllocationDir(str(d)).allocations(1.0, GPUS)
    assert [a.workload.id for a in got] == ["1"]
    assert len(caplog.messages) == 1 and "slurm-2.json" in caplog.messages[0]
    assert why in caplog.messages[0] and len(caplog.messages[0]) < 400


def test_an_allocation_file_that_is_not_utf8_is_read_with_replacement(tmp_path: Path) -> None:
    """A job name in Latin-1 (a hook under LC_ALL=C): before, the whole file was "not JSON" and
    the job's GPUs counted as parked. Each bad byte is U+FFFD; the rest is the job's."""
    d = tmp_path / "alloc"
    d.mkdir()
    body = b'{"kind": "slurm", "id": "7", "account": "r\xe9sum\xe9", "name": "train-\xff\xfe", '
    put(d, "slurm-7.json", body + b'"gpus": [0]}')
    (got,) = AllocationDir(str(d)).allocations(1.0, GPUS)
    assert got.workload == Workload("slurm", "7", None, "r\ufffdsum\ufffd", "train-\ufffd\ufffd")


def test_a_fifo_or_link_in_the_allocation_directory_is_not_opened(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    d = tmp_path / "alloc"
    d.mkdir()
    os.mkfifo(d / "slurm-8.json")
    (d / "slurm-9.json").symlink_to("/etc/passwd")
    with caplog.at_level(logging.WARNING, "gpufleet.agent"):
        assert returns(lambda: AllocationDir(str(d)).allocations(1.0, GPUS)) == ()
    assert sum("is not a regular file" in m for m in caplog.messages) == 2


def test_allocation_parse_refuses_what_is_not_an_allocation_without_raising() -> None:
    for data in (
        {**JOB, "gpus": [{"a": 1}]},
        {**JOB, "gpus": [[0]]},
        {**JOB, "kind": ["x" * 9999]},  # raised TypeError: a list is not hashable
    ):
        got = allocation_parse(data)
        assert isinstance(got, str) and len(got) < 200
