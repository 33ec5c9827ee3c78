"""The agent's queue mode and the project's prolog and epilog against a real Slurm (22.05 here:
Debian's slurm-wlm), started on loopback by conftest.py."""

from __future__ import annotations

import calendar
import datetime as dt
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from fleet.services import node_token_issue
from telemetry.models import PendingStretch
from telemetry.queue_figures import queue_rows

from .conftest import REPO, Slurm


def agent_queue(slurm: Slurm, *args: str) -> subprocess.CompletedProcess[str]:
    """``gpufleet-agent --queue slurm --once --print`` as a user runs it, with Slurm's
    environment (SLURM_CONF) and nothing else of ours."""
    return subprocess.run(
        [sys.executable, "-m", "telemetry.agent.cli", "--queue", "slurm", *args],
        env={**slurm.env, "PYTHONPATH": str(REPO)},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )


def pending(slurm: Slurm) -> dict[str, Any]:
    return {str(j["job_id"]): j for j in slurm.jobs() if j["job_state"] == "PENDING"}


def unix(stamp: str) -> int:
    return calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ"))


def test_prolog_writes_the_allocation_while_the_job_runs_and_epilog_removes_it(
    slurm: Slurm,
) -> None:
    slurm.cancel_all()
    job = slurm.sbatch("--gres=gpu:2", "--wrap", "sleep 300")
    alloc = slurm.alloc_dir / f"slurm-{job}.json"
    slurm.wait("the allocation file", alloc.exists)
    assert json.loads(alloc.read_text()) == {
        "kind": "slurm",
        "id": job,
        "user": "root",
        "gpus": [0, 1],  # the first two of the node's eight; no account without accounting
        "devices": [f"{slurm.root}/gpu/nvidia0", f"{slurm.root}/gpu/nvidia1"],
        "name": "wrap",  # squeue's name for an --wrap job
    }
    running = [j for j in slurm.jobs() if str(j["job_id"]) == job]
    assert running and running[0]["job_state"] == "RUNNING"
    slurm.cmd("scancel", job)
    slurm.wait("the allocation file gone", lambda: not alloc.exists())
    assert list(slurm.alloc_dir.iterdir()) == []


@pytest.mark.django_db
def test_queue_snapshot_of_a_real_squeue(slurm: Slurm, client: Any) -> None:
    slurm.cancel_all()
    before = int(time.time())
    big = slurm.sbatch("--gres=gpu:8", "--wrap", "sleep 300")  # all eight GPUs: it runs
    slurm.wait(
        "the first job running",
        lambda: any(j["job_state"] == "RUNNING" for j in slurm.jobs()),
    )
    resources = slurm.sbatch("--gres=gpu:4", "--wrap", "sleep 300")  # first in line: Resources
    priority = slurm.sbatch("--gres=gpu:h100:2", "--wrap", "sleep 300")  # behind it: Priority
    held = slurm.sbatch("--hold", "--gpus=3", "--wrap", "sleep 300")  # tres_per_job
    dependency = slurm.sbatch(
        f"--dependency=afterok:{big}", "--gpus-per-node=h100:1", "-N1", "--wrap", "sleep 300"
    )
    array = slurm.sbatch("--array=0-3", "--gres=gpu:2", "--wrap", "sleep 300")
    no_gpu = slurm.sbatch("--hold", "--wrap", "sleep 300")  # pending, asks for no GPU: left out
    after = int(time.time())

    def settled() -> bool:
        # the scheduler has looked at every job (a fresh one says "None" until then)
        jobs = pending(slurm)
        return len(jobs) == 6 and all(j["state_reason"] != "None" for j in jobs.values())

    slurm.wait("every pending job evaluated", settled)
    r = agent_queue(slurm, "--cluster", "loopback", "--once", "--print")
    assert r.returncode == 0, r.stderr
    snap = json.loads(r.stdout)
    assert snap["cluster"] == "loopback"
    assert before <= unix(snap["at"]) <= int(time.time())

    def entry(id_: str, gpus: int, model: str | None, reason: str, klass: str) -> dict[str, Any]:
        return {
            "kind": "slurm",
            "id": id_,
            "user": "root",
            "account": "",  # no accounting in this Slurm: squeue names no account
            "partition": "gpu",
            "gpus": gpus,
            "gpu_model": model,
            "reason": reason,
            "class": klass,
        }

    expected = [
        entry(resources, 4, None, "Resources", "capacity"),
        entry(priority, 2, "h100", "Priority", "capacity"),
        entry(held, 3, None, "JobHeldUser", "user"),
        entry(dependency, 1, "h100", "Dependency", "user"),
        *(entry(f"{array}_{t}", 2, None, "Priority", "capacity") for t in range(4)),
    ]
    got = sorted(snap["pending"], key=lambda e: (int(e["id"].split("_")[0]), e["id"]))
    assert [{k: v for k, v in e.items() if k not in ("submitted", "eligible")} for e in got] == (
        expected
    )
    assert no_gpu not in {e["id"] for e in got} and big not in {e["id"] for e in got}
    for e in got:
        assert before <= unix(e["submitted"]) <= after
    eligible = {e["id"]: e["eligible"] for e in got}
    # waiting on the machine: eligible since submission; held or waiting on a job: not yet
    assert unix(eligible[resources]) >= before and unix(eligible[priority]) >= before
    assert eligible[held] is None and eligible[dependency] is None

    # What the server stores: a second snapshot a few seconds later, both pushed to
    # POST /api/v1/queue as the collector pushes them. Between them the four capacity waits
    # (4 + 2 + 4 × 2 GPUs) and the two user waits (3 + 1) each waited Δt.
    time.sleep(2)
    r = agent_queue(slurm, "--cluster", "loopback", "--once", "--print")
    assert r.returncode == 0, r.stderr
    second = json.loads(r.stdout)
    delta = unix(second["at"]) - unix(snap["at"])
    assert 1 <= delta <= 120
    _, token = node_token_issue(hostname="slurm-login")
    for body in (snap, second):
        response = client.post(
            "/api/v1/queue",
            data=json.dumps(body),
            content_type="application/json",
            HTTP_AUTHORIZATION=f"Bearer {token}",
        )
        assert response.status_code == 200, response.content
    hour = dt.datetime.fromtimestamp(unix(snap["at"]) // 3600 * 3600, dt.UTC)
    (row,) = queue_rows(start=hour, end=hour + dt.timedelta(hours=2), group_by="partition")
    assert (row["cluster"], row["key"], row["jobs"]) == ("loopback", "gpu", 8)
    assert row["waited_gpu_hours_capacity"] == pytest.approx(14 * delta / 3600)
    assert row["waited_gpu_hours_user"] == pytest.approx(4 * delta / 3600)
    assert row["waited_gpu_hours_policy"] == 0
    assert PendingStretch.objects.count() == 8  # one stretch per job, not per snapshot


def test_queue_mode_says_so_when_squeue_fails(slurm: Slurm, tmp_path: Path) -> None:
    broken = tmp_path / "squeue"
    broken.write_text("#!/bin/sh\necho 'slurm_load_jobs error: Unable to contact' >&2\nexit 1\n")
    broken.chmod(0o755)
    r = agent_queue(slurm, "--cluster", "c", "--squeue", str(broken), "--once", "--print")
    assert r.returncode == 1 and r.stdout == ""
    assert "Unable to contact" in r.stderr


def test_slurmrestd_answers_what_squeue_says(slurm: Slurm, slurmrestd: str, tmp_path: Path) -> None:
    """The same queue through the real slurmrestd (JWT from ``scontrol token``): the agent
    finds the version 22.05 serves (v0.0.38, after 404s for the newer ones) and reads the same
    entries as from squeue."""
    slurm.cancel_all()
    slurm.sbatch("--gres=gpu:8", "--wrap", "sleep 300")
    slurm.wait(
        "the first job running", lambda: any(j["job_state"] == "RUNNING" for j in slurm.jobs())
    )
    waiting = slurm.sbatch("--gres=gpu:h100:4", "--wrap", "sleep 300")
    held = slurm.sbatch("--hold", "--gpus=2", "--wrap", "sleep 300")
    slurm.wait(
        "every pending job evaluated",
        lambda: all(j["state_reason"] != "None" for j in pending(slurm).values()),
    )
    # a token for a user other than root: slurmrestd refuses SlurmUser's
    token = slurm.cmd("scontrol", "token", "username=nobody", "lifespan=600").strip()
    jwt = tmp_path / "slurm.jwt"
    jwt.write_text(token.removeprefix("SLURM_JWT=") + "\n")
    base = ["--cluster", "hpc", "--once", "--print"]
    rest = agent_queue(slurm, *base, "--slurmrestd", slurmrestd, "--jwt-file", str(jwt))
    assert rest.returncode == 0, rest.stderr
    assert "answers v0.0.38" in rest.stderr
    squeue = agent_queue(slurm, *base)
    assert squeue.returncode == 0, squeue.stderr
    got = json.loads(rest.stdout)["pending"]
    assert got == json.loads(squeue.stdout)["pending"]
    assert [(e["id"], e["gpus"], e["gpu_model"], e["reason"], e["class"]) for e in got] == [
        (waiting, 4, "h100", "Resources", "capacity"),
        (held, 2, None, "JobHeldUser", "user"),
    ]
