"""The project's prolog and epilog in a real Slurm (22.05 here: Debian's slurm-wlm, started on
loopback by conftest.py), read back by the agent's own allocation reader (issue 48): several
``Prolog=`` lines, both orders of gres.conf with the agent mapping device files to NVML GPUs by
minor number, array tasks and names from squeue, and a prolog that cannot write."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from telemetry.agent.fake import MODELS, FakeNvml, ScriptedGpu
from telemetry.agent.workloads import AllocationDir, nvml_minors

from .conftest import Slurm, cluster

DEV_LOG = "/dev/log"


def allocations(slurm: Slurm, count: int) -> dict[str, Any]:
    """The allocation files once ``count`` are there: file name → its JSON."""

    def found() -> dict[str, Any] | None:
        files = sorted(slurm.alloc_dir.glob("slurm-*.json")) if slurm.alloc_dir.exists() else []
        if len(files) < count:
            return None
        return {f.name: json.loads(f.read_text()) for f in files}

    got: dict[str, Any] = slurm.wait(f"{count} allocation files", found)
    return got


def test_slurm_22_05_runs_only_the_last_prolog_line(tmp_path: Path) -> None:
    """docs/agent.md: before 24.05 slurm.conf keeps the last ``Prolog=`` and says so in the
    controller's and slurmd's logs; the site's prolog listed first never runs."""
    marker = tmp_path / "site-prolog-ran"
    site = tmp_path / "site-prolog"
    site.write_text(f"#!/bin/bash\ntouch {marker}\n")
    site.chmod(0o755)
    with cluster(prologs=(str(site), "{hooks}/prolog")) as slurm:
        job = slurm.sbatch("--gres=gpu:1", "--wrap", "sleep 300")
        (body,) = allocations(slurm, 1).values()  # ours, the last line, ran
        assert body["id"] == job
        assert not marker.exists()
        said = "Prolog 1 specified more than once, latest value used"
        assert said in (slurm.root / "slurmctld.log").read_text()
        assert said in (slurm.root / "slurmd.out.log").read_text()  # before its log file opens


# Two gres.conf lines of different types, so that which files a job gets is Slurm's own answer
# (a job asking for type "hi" runs on the "hi" files), whatever numbers it gives them.
LOW_FIRST = (("lo", "nvidia[0-3]", 4), ("hi", "nvidia[4-7]", 4))
HIGH_FIRST = (("hi", "nvidia[4-7]", 4), ("lo", "nvidia[0-3]", 4))


@pytest.mark.parametrize(
    ("gres", "hi_indexes", "lo_indexes"),
    [(LOW_FIRST, [4, 5], [0]), (HIGH_FIRST, [0, 1], [4])],
    ids=["low-first", "high-first"],
)
def test_the_job_s_gpus_by_device_file_in_both_gres_orders(
    gres: Any, hi_indexes: list[int], lo_indexes: list[int]
) -> None:
    """Slurm numbers GPUs by their position in gres.conf: with nvidia[4-7] listed first, a job
    on nvidia4 and 5 gets SLURM_JOB_GPUS=0,1. The prolog writes the device files as well, and
    the agent maps their minor numbers to NVML's (here NVML index i is /dev/nvidia(7-i), a node
    whose minor numbers do not follow NVML's order): the job holds exactly the GPUs of its
    files."""
    with cluster(gres=gres) as slurm:
        hi = slurm.sbatch("--gres=gpu:hi:2", "--wrap", "sleep 300")
        lo = slurm.sbatch("--gres=gpu:lo:1", "--wrap", "sleep 300")
        files = allocations(slurm, 2)
        dev = slurm.root / "gpu"
        assert files[f"slurm-{hi}.json"]["gpus"] == hi_indexes  # Slurm's position numbers
        assert files[f"slurm-{hi}.json"]["devices"] == [f"{dev}/nvidia4", f"{dev}/nvidia5"]
        assert files[f"slurm-{lo}.json"]["gpus"] == lo_indexes
        assert files[f"slurm-{lo}.json"]["devices"] == [f"{dev}/nvidia0"]

        uuids = [f"GPU-00000000-0000-4000-8000-00000000000{i}" for i in range(8)]
        gpus = [
            ScriptedGpu(u, i, MODELS["H100"], lambda t: (0, 0, 0, 0, 0, 0, 0, 0))
            for i, u in enumerate(uuids)
        ]
        for i, g in enumerate(gpus):
            g.minor = 7 - i  # type: ignore[attr-defined]
        api = FakeNvml(gpus, lambda: 1000.0)
        api.nvmlInit()
        got = AllocationDir(str(slurm.alloc_dir), minors=nvml_minors(api)).allocations(
            1000.0, {u: i for i, u in enumerate(uuids)}
        )
        held = {a.workload.id: a.gpus for a in got}
        # nvidia4, nvidia5 are NVML's GPUs 3 and 2; nvidia0 is GPU 7
        assert held == {hi: (uuids[3], uuids[2]), lo: (uuids[7],)}
        slurm.cmd("scancel", hi, lo)
        slurm.wait("the allocation files gone", lambda: not list(slurm.alloc_dir.iterdir()))


def test_array_tasks_and_names_come_from_squeue(slurm: Slurm) -> None:
    """By default the prolog asks squeue: each task of ``A_[1-2]`` is the workload ``A_n``,
    though Slurm runs task 1 as job A+1 and task 2 as job A (the array's own id goes to its
    last task), named as submitted, its newline read as a space. (Two tasks: this machine may
    have two CPUs, one per job.)"""
    slurm.cancel_all()
    name = 'sweep "lr"\nv2'
    array = slurm.sbatch("--array=1-2", "--gres=gpu:1", f"--job-name={name}", "--wrap", "sleep 300")
    files = allocations(slurm, 2)
    assert {f: b["id"] for f, b in files.items()} == {
        f"slurm-{int(array) + 1}.json": f"{array}_1",
        f"slurm-{array}.json": f"{array}_2",
    }
    for file_name, body in files.items():
        assert body["name"] == 'sweep "lr" v2'
        assert file_name == f"slurm-{body['job_id']}.json"  # the file goes by the task's job id
    # what squeue itself says of each task
    listed = slurm.cmd("squeue", "--noheader", "--array", "--format=%A %F_%K")
    pairs = {tuple(line.split()) for line in listed.splitlines()}
    assert pairs == {(b["job_id"], b["id"]) for b in files.values()}
    slurm.cancel_all()
    slurm.wait("the allocation files gone", lambda: not list(slurm.alloc_dir.iterdir()))


@contextlib.contextmanager
def syslog() -> Iterator[socket.socket]:
    """A syslog daemon's socket at /dev/log, where ``logger`` sends (these machines run none);
    skipped where a real one is there (its journal would have to be read instead)."""
    if os.path.exists(DEV_LOG):
        pytest.skip(f"{DEV_LOG} belongs to this machine's syslog")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        sock.bind(DEV_LOG)
        os.chmod(DEV_LOG, 0o666)
        sock.settimeout(1.0)
        yield sock
    finally:
        sock.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(DEV_LOG)


def syslog_lines(sock: socket.socket, tag: str, until: float) -> list[str]:
    """The messages tagged ``tag`` that arrive before ``until`` (time.monotonic())."""
    lines: list[str] = []
    while time.monotonic() < until and not lines:
        try:
            data = sock.recv(65536).decode("utf-8", "replace")
        except TimeoutError:
            continue
        if f" {tag}:" in data or f" {tag}[" in data:
            lines.append(data)
    return lines


def test_a_prolog_that_cannot_write_runs_the_job_and_says_so(slurm: Slurm) -> None:
    """An allocation directory the prolog cannot make: the job runs, the node stays up, and
    the prolog says why in syslog (slurmd logs the output of a prolog that exits 0 nowhere)."""
    slurm.cancel_all()
    defaults = slurm.root / "gpufleet.defaults"
    before = defaults.read_text()
    blocker = slurm.root / "blocker"
    blocker.write_text("")
    try:
        with syslog() as log:
            defaults.write_text(f"GPUFLEET_ALLOC_DIR={blocker}/alloc\n")
            job = slurm.sbatch("--gres=gpu:1", "--wrap", "sleep 300")
            slurm.wait(
                "the job running",
                lambda: (
                    [j["job_state"] for j in slurm.jobs() if str(j["job_id"]) == job] == ["RUNNING"]
                ),
            )
            said = syslog_lines(log, "gpufleet-prolog", time.monotonic() + 30)
        state = slurm.cmd("sinfo", "--noheader", "--format=%t", "--nodes", slurm.node).strip()
        assert state in ("mix", "alloc")  # not drained
        assert not (blocker.parent / "alloc" / f"slurm-{job}.json").exists()
        # <28>: facility daemon (3) × 8 + warning (4), as the prolog asks
        assert len(said) == 1 and said[0].startswith("<28>"), said
        assert f"gpufleet prolog, job {job}: cannot write into {blocker}/alloc" in said[0]
    finally:
        defaults.write_text(before)
        os.utime(defaults)
        slurm.cancel_all()
