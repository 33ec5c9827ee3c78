"""docs/slurm/prolog.sh and epilog.sh, run with bash in the environment slurmd gives a node
Prolog / Epilog (Slurm's prolog_epilog guide; src/plugins/prep/script/prep_script_slurmd.c:
SLURM_JOB_ID, SLURM_JOB_USER, SLURM_JOB_ACCOUNT, and from the gres plugin SLURM_JOB_GPUS and
CUDA_VISIBLE_DEVICES; no job name, no array ids), each file read back by the agent's own
parser."""

from __future__ import annotations

import json
import os
import random
import shutil
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest

from telemetry.agent.source import Workload
from telemetry.agent.workloads import Allocation, AllocationDir, allocation_parse

REPO = Path(__file__).resolve().parents[2]
PROLOG = REPO / "docs" / "slurm" / "prolog.sh"
EPILOG = REPO / "docs" / "slurm" / "epilog.sh"
GPU_A = "GPU-2f6e1c3a-5b7d-4e9f-8a1b-2c3d4e5f6a7b"
GPU_B = "GPU-9e8d7c6b-5a4f-4e3d-8c2b-1a0f9e8d7c6b"


def hook(script: Path, alloc: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """Run a hook as slurmd does: its own small environment, nothing of ours."""
    base = {
        "GPUFLEET_ALLOC_DIR": str(alloc),
        "SLURM_SCRIPT_CONTEXT": "prolog_slurmd",
        # no squeue here, and not this machine's settings file: the tests of either say so
        "GPUFLEET_PROLOG_LOOKUP": "0",
        "GPUFLEET_DEFAULTS": str(alloc.parent / "no-such-defaults"),
    }
    return subprocess.run(
        ["bash", str(script)], env={**base, **env}, capture_output=True, text=True, timeout=30
    )


def job_env(**extra: str) -> dict[str, str]:
    return {
        "SLURM_JOB_ID": "48213",
        "SLURM_JOB_UID": "1000",
        "SLURM_JOB_USER": "alice",
        "SLURM_JOB_ACCOUNT": "nlp",
        "SLURM_JOB_GPUS": "0,1",
        "CUDA_VISIBLE_DEVICES": "0,1",
        **extra,
    }


def read(alloc: Path, job: str = "48213") -> Any:
    return json.loads((alloc / f"slurm-{job}.json").read_text())


def test_prolog_writes_the_allocation_and_epilog_removes_it(tmp_path: Path) -> None:
    alloc = tmp_path / "run" / "gpufleet" / "alloc"  # created on the first job
    r = hook(PROLOG, alloc, **job_env())
    assert r.returncode == 0 and r.stderr == ""
    assert read(alloc) == {
        "kind": "slurm",
        "id": "48213",
        "user": "alice",
        "account": "nlp",
        "gpus": [0, 1],
    }
    f = alloc / "slurm-48213.json"
    assert stat.S_IMODE(f.stat().st_mode) == 0o644  # the agent need not be root to read it
    assert os.listdir(alloc) == ["slurm-48213.json"]  # no temporary file left
    # what the agent makes of it
    got = AllocationDir(str(alloc)).allocations(1.0, {GPU_A: 0, GPU_B: 1})
    assert got == (
        Allocation(Workload("slurm", "48213", "alice", "nlp"), (0, 1), None, "slurm-48213.json"),
    )
    r = hook(EPILOG, alloc, **job_env())
    assert r.returncode == 0 and r.stderr == "" and os.listdir(alloc) == []
    assert hook(EPILOG, alloc, **job_env()).returncode == 0  # nothing there: still fine


def test_prolog_prefers_gpu_uuids_and_writes_what_json_can_carry(tmp_path: Path) -> None:
    alloc = tmp_path / "alloc"
    env = job_env(
        CUDA_VISIBLE_DEVICES=f"{GPU_A},{GPU_B}",  # gres.conf AutoDetect=nvml with UUIDs
        SLURM_JOB_GPUS="4,5",
        SLURM_JOB_USER='o"brien\\',
        SLURM_JOB_ACCOUNT="résumé\x01lab",
        SLURM_JOB_NAME="train\tllm\r\nv2",  # not given by Slurm today; written where it is set
    )
    assert hook(PROLOG, alloc, **env).returncode == 0
    body = read(alloc)
    assert body["gpus"] == [GPU_A, GPU_B]
    # escaped in the file, so read back whole (the agent drops control characters when it sends);
    # a name over several lines is one line, each line break a space
    assert (body["user"], body["account"], body["name"]) == (
        'o"brien\\',
        "résumé\x01lab",
        "train\tllm  v2",
    )
    raw = (alloc / "slurm-48213.json").read_bytes()
    assert b"\\u0001" in raw and b"\\u0009" in raw and b"\\u000a" not in raw
    parsed = allocation_parse(body)
    assert isinstance(parsed, Allocation) and parsed.gpus == (GPU_A, GPU_B)


def test_prolog_writes_valid_json_for_names_in_any_encoding(tmp_path: Path) -> None:
    """Under LC_ALL=C the prolog saw bytes and wrote them: a job named train-\\xff\\xfe or a
    Latin-1 account made a file that is not UTF-8, which the agent refused, so the job's GPUs
    counted as parked (issue 47). Now each bad stretch is one U+FFFD, as Python's own decoder
    replaces it, and the agent reads the job."""
    alloc = tmp_path / "alloc"
    env = job_env(
        SLURM_JOB_NAME=os.fsdecode(b"train-\xff\xfe"),
        SLURM_JOB_ACCOUNT=os.fsdecode("résumé".encode("latin-1")),
        SLURM_JOB_USER="zoë",  # valid UTF-8 stays as it is
    )
    assert hook(PROLOG, alloc, **env).returncode == 0
    raw = (alloc / "slurm-48213.json").read_bytes()
    body = json.loads(raw.decode("utf-8"))  # strict: the file is UTF-8
    assert (body["name"], body["account"], body["user"]) == (
        "train-\ufffd\ufffd",
        "r\ufffdsum\ufffd",
        "zoë",
    )
    (got,) = AllocationDir(str(alloc)).allocations(1.0, {GPU_A: 0, GPU_B: 1})
    assert got.workload == Workload(
        "slurm", "48213", "zoë", "r\ufffdsum\ufffd", "train-\ufffd\ufffd"
    )
    assert got.gpus == (0, 1)


def test_prolog_json_strings_match_python_s_decoder_for_any_bytes(tmp_path: Path) -> None:
    """Seeded random names of every byte but NUL (the environment cannot hold one), weighted
    towards UTF-8's lead and continuation bytes, overlong forms, surrogates, code points past
    U+10FFFF and cut sequences: the file is strict UTF-8 JSON and each name reads back as
    bytes.decode("utf-8", "replace") of its first 1,024 bytes, line breaks made spaces."""
    rng = random.Random(47)
    tricky = b'\x80\xbf\xc0\xc1\xc2\xdf\xe0\xe1\xed\xef\xf0\xf4\xf5\xff\xa0\x9f\x90\x8f\\"\x01\x7fa'
    names = [b"\xe1\x80A", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xf0\x9f\x98\x80", b"\xe2\x82"]
    names.append("ü".encode() * 600)  # 1,200 bytes, cut at 1,024: between two ü
    names.append(b"a" + "ü".encode() * 600)  # cut inside a ü: its lone lead byte is U+FFFD
    for _ in range(60):
        n = rng.randint(1, 30)
        names.append(
            bytes(
                rng.choice(tricky) if rng.random() < 0.6 else rng.randint(1, 255) for _ in range(n)
            )
        )
    alloc = tmp_path / "alloc"
    for i, name in enumerate(names):
        job = str(1000 + i)
        env = job_env(SLURM_JOB_ID=job, SLURM_JOB_NAME=os.fsdecode(name))
        assert hook(PROLOG, alloc, **env).returncode == 0
        raw = (alloc / f"slurm-{job}.json").read_bytes()
        # each line break a space, then the first 1,024 bytes decoded
        flat = name.replace(b"\n", b" ").replace(b"\r", b" ")[:1024]
        assert json.loads(raw.decode("utf-8"))["name"] == flat.decode("utf-8", "replace"), name


@pytest.mark.parametrize(
    ("env", "gpus"),
    [
        ({"SLURM_JOB_GPUS": "3", "CUDA_VISIBLE_DEVICES": ""}, [3]),
        ({"SLURM_JOB_GPUS": "", "CUDA_VISIBLE_DEVICES": "2,07"}, [2, 7]),
        ({"SLURM_JOB_GPUS": "", "CUDA_VISIBLE_DEVICES": "", "SLURM_STEP_GPUS": "6"}, [6]),
        ({"SLURM_JOB_GPUS": "1, 2,x", "CUDA_VISIBLE_DEVICES": "NoDevFiles"}, [1, 2]),
    ],
)
def test_prolog_finds_the_gpus_where_slurm_puts_them(
    tmp_path: Path, env: dict[str, str], gpus: list[int]
) -> None:
    alloc = tmp_path / "alloc"
    assert hook(PROLOG, alloc, **job_env(**env)).returncode == 0
    assert read(alloc)["gpus"] == gpus


def test_prolog_for_an_array_task_names_it_and_keeps_the_job_id(tmp_path: Path) -> None:
    alloc = tmp_path / "alloc"
    env = job_env(SLURM_JOB_ID="1127", SLURM_ARRAY_JOB_ID="1123", SLURM_ARRAY_TASK_ID="4")
    assert hook(PROLOG, alloc, **env).returncode == 0
    body = read(alloc, "1127")  # the file goes by the job id, which the epilog also has
    assert (body["id"], body["job_id"]) == ("1123_4", "1127")


def test_prolog_can_ask_squeue_for_the_name_and_array_id(tmp_path: Path) -> None:
    """On by default (GPUFLEET_PROLOG_LOOKUP, 1 unless set): the node Prolog has neither,
    squeue has both: numbers first (the array's own id lists every task), then the name of
    exactly this task."""
    fake = tmp_path / "squeue"
    fake.write_text(
        "#!/bin/bash\n"
        'case "$*" in\n'
        '"--noheader --jobs=1127 --format=%A %F %K") printf "1127 1123 4\\n1130 1123 5\\n" ;;\n'
        '"--noheader --jobs=1123_4 --format=%A %j") printf "1127 sweep lr\\n3e-4\\n" ;;\n'
        "*) exit 1 ;;\n"
        "esac\n"
    )
    fake.chmod(0o755)
    alloc = tmp_path / "alloc"
    env = job_env(SLURM_JOB_ID="1127", GPUFLEET_SQUEUE=str(fake))
    r = subprocess.run(
        ["bash", str(PROLOG)],
        env={**env, "GPUFLEET_ALLOC_DIR": str(alloc), "GPUFLEET_DEFAULTS": str(tmp_path / "none")},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 0 and r.stderr == ""
    body = read(alloc, "1127")
    assert (body["id"], body["job_id"], body["name"]) == ("1123_4", "1127", "sweep lr 3e-4")
    # off: no squeue call, the numeric id
    env = job_env(SLURM_JOB_ID="1128", GPUFLEET_SQUEUE=str(fake))
    assert hook(PROLOG, alloc, **env).returncode == 0
    assert read(alloc, "1128")["id"] == "1128" and "name" not in read(alloc, "1128")
    # a controller that does not answer in time costs nothing but the name
    fake.write_text("#!/bin/bash\nsleep 30\n")
    env = job_env(SLURM_JOB_ID="1129", GPUFLEET_SQUEUE=str(fake), GPUFLEET_PROLOG_LOOKUP="1")
    r = hook(PROLOG, alloc, GPUFLEET_LOOKUP_TIMEOUT="1", **env)
    assert r.returncode == 0 and "squeue gave no answer within 1 s" in r.stderr
    assert read(alloc, "1129")["id"] == "1129"


def test_prolog_reads_its_settings_file_without_running_it(tmp_path: Path) -> None:
    """/etc/default/gpufleet: KEY=VALUE parsed with a strict pattern, never sourced (the hooks
    run as root); a value that is not a plain absolute path is refused and said; a file others
    may write is not believed. Each problem also goes to syslog (``logger -t``)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    said = tmp_path / "syslog"
    (bin_dir / "logger").write_text(f'#!/bin/bash\nprintf "%s\\n" "$*" >> {said}\n')
    (bin_dir / "logger").chmod(0o755)
    path = f"{bin_dir}:/usr/bin:/bin"
    pwned = tmp_path / "pwned"
    defaults = tmp_path / "gpufleet"
    alloc = tmp_path / "alloc"
    defaults.write_text(
        "# the agent's and the hooks' settings\n"
        "GPUFLEET_SERVER=https://fleet.example.com\n"
        f'GPUFLEET_ALLOC_DIR="{alloc}"  # quoted, as systemd reads it\n'
        "GPUFLEET_PROLOG_LOOKUP=0\n"
        f"GPUFLEET_GRES_CONF=$(touch {pwned})\n"
    )
    defaults.chmod(0o644)
    env = job_env()
    for key in ("GPUFLEET_ALLOC_DIR", "GPUFLEET_PROLOG_LOOKUP", "GPUFLEET_DEFAULTS"):
        env.pop(key, None)
    base = {"GPUFLEET_DEFAULTS": str(defaults), "GPUFLEET_HOOK_PATH": path}
    r = subprocess.run(
        ["bash", str(PROLOG)], env={**env, **base}, capture_output=True, text=True, timeout=30
    )
    assert r.returncode == 0 and not pwned.exists()
    assert "ignoring a line of" in r.stderr and "GPUFLEET_GRES_CONF" in r.stderr
    assert read(alloc)["id"] == "48213"  # the file's directory, and no squeue asked
    assert "-t gpufleet-prolog" in said.read_text()
    r = subprocess.run(
        ["bash", str(EPILOG)], env={**env, **base}, capture_output=True, text=True, timeout=30
    )
    assert r.returncode == 0 and os.listdir(alloc) == []
    defaults.chmod(0o666)  # anyone could point root's hook elsewhere: not believed
    other = tmp_path / "other"
    r = hook(PROLOG, other, **{**job_env(), **base})
    assert "not owned by root, or writable by others" in r.stderr
    assert read(other)["id"] == "48213"  # the environment's (or the built-in) directory


def test_prolog_renames_a_whole_file_into_place(tmp_path: Path) -> None:
    """Atomic: the file is written under a dot name in the same directory (which the agent
    does not read) and renamed; the name the agent reads never holds a partial file."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "mv.log"
    real_mv = shutil.which("mv")
    assert real_mv is not None
    (bin_dir / "mv").write_text(
        "#!/bin/bash\n"
        'src="${@: -2:1}" dst="${@: -1}"\n'
        f'{{ echo "$src"; echo "$dst"; test -e "$dst" && echo existed || echo new; cat "$src"; '
        f'stat -c %i "$src"; }} >> {log}\n'
        f'exec {real_mv} "$@"\n'
    )
    (bin_dir / "mv").chmod(0o755)
    alloc = tmp_path / "alloc"
    path = f"{bin_dir}:/usr/bin:/bin"
    assert hook(PROLOG, alloc, GPUFLEET_HOOK_PATH=path, **job_env()).returncode == 0
    src, dst, before, content, inode = log.read_text().splitlines()
    assert Path(src).parent == alloc and Path(src).name.startswith(".slurm-48213.")
    assert dst == str(alloc / "slurm-48213.json") and before == "new"
    assert json.loads(content) == read(alloc)  # complete before the rename
    assert (alloc / "slurm-48213.json").stat().st_ino == int(inode)  # the renamed file itself


def test_hooks_never_fail_the_job(tmp_path: Path) -> None:
    """A Prolog or Epilog that exits non-zero drains the node: every problem is said on
    stderr and the exit status stays 0."""
    blocked = tmp_path / "file"
    blocked.write_text("")  # the directory cannot be made under a file
    r = hook(PROLOG, blocked / "alloc", **job_env())
    assert r.returncode == 0 and "cannot write" in r.stderr
    for bad in ("", "../../etc/passwd", "48213;rm"):
        r = hook(PROLOG, tmp_path / "a", **job_env(SLURM_JOB_ID=bad))
        assert r.returncode == 0 and "not a job id" in r.stderr
        assert hook(EPILOG, tmp_path / "a", **job_env(SLURM_JOB_ID=bad)).returncode == 0
    assert not (tmp_path / "a").exists()
    # a job without GPUs on this node holds none: nothing written, nothing said
    r = hook(PROLOG, tmp_path / "b", **job_env(SLURM_JOB_GPUS="", CUDA_VISIBLE_DEVICES=""))
    assert r.returncode == 0 and r.stderr == "" and not (tmp_path / "b").exists()


def test_epilog_removes_what_a_killed_prolog_left(tmp_path: Path) -> None:
    alloc = tmp_path / "alloc"
    alloc.mkdir()
    for name in ("slurm-48213.json", ".slurm-48213.Xy12Ab", ".slurm-482130.Qq", "slurm-48.json"):
        (alloc / name).write_text("{}")
    assert hook(EPILOG, alloc, **job_env()).returncode == 0
    assert sorted(os.listdir(alloc)) == [".slurm-482130.Qq", "slurm-48.json"]  # others' files


def test_hooks_are_shellcheck_clean() -> None:
    if shutil.which("shellcheck") is None:
        from tests.conftest import service_missing

        service_missing("shellcheck (dev.py installs it with apt)")
    r = subprocess.run(
        ["shellcheck", "--shell=bash", str(PROLOG), str(EPILOG)], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stdout


def test_agent_says_allocation_directory_problems_once_and_counts_them(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Missing, untrusted, unparsable: each said when it begins (not each second), counted in
    the reader's counters (the agent has no /metrics endpoint)."""
    import logging

    d = tmp_path / "alloc"
    src = AllocationDir(str(d))
    gpus = {GPU_A: 0, GPU_B: 1}
    with caplog.at_level(logging.INFO, "gpufleet.agent"):
        for t in range(5):
            assert src.allocations(float(t), gpus) == ()
    assert [m for m in caplog.messages if "does not exist" in m] == [caplog.messages[0]]
    assert src.problem is not None and src.problems_total == 1
    d.mkdir(mode=0o755)
    (d / "slurm-1.json").write_text("{not json")
    (d / "slurm-2.json").write_text(json.dumps({"kind": "slurm", "id": "2", "gpus": [1]}))
    caplog.clear()
    with caplog.at_level(logging.INFO, "gpufleet.agent"):
        for t in range(10, 15):
            got = src.allocations(float(t), gpus)
    assert [a.workload.id for a in got] == ["2"]
    assert src.problem is None and src.skipped == 1 and src.problems_total == 2
    assert sum("slurm-1.json is not JSON" in m for m in caplog.messages) == 1
    assert any("read again" in m for m in caplog.messages)
