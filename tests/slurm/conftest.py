"""A real Slurm on loopback: munged, slurmctld and slurmd of Debian's ``slurm-wlm`` (22.05),
one node named after this host with eight fake GPUs, everything in a temporary directory.

The GPUs are character devices made with ``mknod … c 195 N`` (``/dev/nvidiaN``'s numbers, in a
temporary directory): slurmd only checks that each ``gres.conf`` ``File=`` exists, so a machine
without GPUs runs GPU jobs, and the agent maps them to NVML GPUs by their minor numbers.
The node's GPUs are typed (``Gres=gpu:h100:8``) so that requests naming a model are accepted;
an untyped request (``--gres=gpu:8``) takes any type. No accounting (that needs slurmdbd).

The node's Prolog and Epilog are the project's docs/slurm/prolog.sh and epilog.sh, through a
wrapper that points ``GPUFLEET_DEFAULTS`` (``/etc/default/gpufleet`` on a node) at a settings
file whose ``GPUFLEET_ALLOC_DIR`` is in the temporary directory. :func:`cluster` starts one with
another gres.conf or more slurm.conf lines (tests/slurm/test_hooks_real.py).

Slurm runs as root here (``SlurmUser=root``): the tests need root, or Slurm and munge
installed and a user allowed to run them. Without them the tests skip, except in CI, where
they fail (dev.py installs the packages with apt, as it does Chromium).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
COMMANDS = ("munged", "slurmctld", "slurmd", "squeue", "sbatch", "scancel", "scontrol", "sinfo")
LOOPBACK = "127.0.0.1"
GPUS = 8
GPU_TYPE = "h100"
# Every wait below is bounded: the whole module stays under a minute when Slurm is healthy.
START_TIMEOUT_S = 20.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


def _stop(proc: subprocess.Popen[Any]) -> None:
    """A daemon started in its own process group: SIGTERM, SIGKILL after 10 s."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        except ProcessLookupError:
            pass


def _sweep(conf: Path) -> None:
    """Kill what this cluster left behind: slurmstepd and job processes run in sessions of
    their own, outside the daemons' process groups, but all carry SLURM_CONF=``conf``."""
    mark = f"SLURM_CONF={conf}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue  # gone, or not ours to read
        if mark in environ:
            try:
                os.kill(int(entry.name), signal.SIGKILL)
            except ProcessLookupError:
                pass


@dataclass
class Slurm:
    """The running cluster: its directory, configuration and the environment its commands need."""

    root: Path
    conf: Path
    node: str
    alloc_dir: Path
    env: dict[str, str]

    def cmd(self, *args: str, check: bool = True, timeout: float = 15.0) -> str:
        r = subprocess.run(
            list(args), env=self.env, capture_output=True, text=True, timeout=timeout
        )
        if check and r.returncode != 0:
            raise AssertionError(f"{' '.join(args)} failed ({r.returncode}): {r.stderr}")
        return r.stdout

    def sbatch(self, *args: str) -> str:
        """Submit; returns the job id."""
        out = self.cmd("sbatch", "--parsable", "--output=/dev/null", *args)
        return out.strip().split(";")[0]

    def jobs(self) -> list[dict[str, Any]]:
        return list(json.loads(self.cmd("squeue", "--json"))["jobs"])

    def wait(self, what: str, until: Any, timeout: float = 15.0) -> Any:
        """Poll ``until()`` every 0.2 s until it returns something true (bounded)."""
        deadline = time.monotonic() + timeout
        while True:
            got = until()
            if got:
                return got
            if time.monotonic() > deadline:
                logs = "\n".join(
                    f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
                    for p in sorted(self.root.glob("*.log"))
                )
                raise AssertionError(f"Slurm: {what} not within {timeout} s\n{logs}")
            time.sleep(0.2)

    def cancel_all(self) -> None:
        self.cmd("scancel", "--user", "root", check=False)
        self.wait("an empty queue", lambda: not self.jobs())


def slurm_missing() -> str | None:
    """What keeps this machine from running the real Slurm, or None."""
    missing = [c for c in COMMANDS if shutil.which(c) is None]
    if missing:
        return f"Slurm and munge ({', '.join(missing)} missing; dev.py installs them with apt)"
    if os.geteuid() != 0:
        return "root (the test Slurm runs as SlurmUser=root)"
    return None


def _write_conf(
    root: Path,
    node: str,
    ctld_port: int,
    slurmd_port: int,
    hooks: Path,
    gres: Sequence[tuple[str, str, int]],
    prologs: Sequence[str],
    extra: Sequence[str],
) -> Path:
    gpus = root / "gpu"
    gpus.mkdir()
    for i in range(GPUS):
        # /dev/nvidiaN's numbers (major 195, minor N): slurmd only checks that the file exists,
        # and the agent maps a job's device files to NVML GPUs by their minor numbers
        subprocess.run(["mknod", str(gpus / f"nvidia{i}"), "c", "195", str(i)], check=True)
    (root / "gres.conf").write_text(
        "".join(
            f"NodeName={node} Name=gpu Type={kind} File={gpus}/{files}\n" for kind, files, _ in gres
        )
    )
    for d in ("state", "spool"):
        (root / d).mkdir()
    cpus = os.cpu_count() or 1
    conf = root / "slurm.conf"
    lines = [
        "ClusterName=gpufleettest",
        f"SlurmctldHost={node}({LOOPBACK})",
        f"SlurmctldPort={ctld_port}",
        f"SlurmdPort={slurmd_port}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={root}/munge.socket",
        # JWT beside munge, for slurmrestd (tokens from `scontrol token`)
        "AuthAltTypes=auth/jwt",
        f"AuthAltParameters=jwt_key={root}/jwt.key",
        f"StateSaveLocation={root}/state",
        f"SlurmdSpoolDir={root}/spool",
        f"SlurmctldPidFile={root}/slurmctld.pid",
        f"SlurmdPidFile={root}/slurmd.pid",
        f"SlurmctldLogFile={root}/slurmctld.log",
        f"SlurmdLogFile={root}/slurmd.log",
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "GresTypes=gpu",
        "SchedulerType=sched/backfill",
        "PriorityType=priority/basic",
        # every pending job gets its reason within a second or two, not a minute
        "SchedulerParameters=sched_interval=1,bf_interval=1",
        "MpiDefault=none",
        "ReturnToService=2",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/none",
        # a cancelled job leaves squeue at once, so each scenario starts from nothing
        "MinJobAge=1",
        *(f"Prolog={p.format(hooks=hooks)}" for p in prologs or ["{hooks}/prolog"]),
        f"Epilog={hooks}/epilog",
        "PrologFlags=Alloc",
    ]
    # a line of ``extra`` replaces the base line of the same key (Slurm would keep the last and
    # log "specified more than once")
    keys = {line.split("=", 1)[0] for line in extra}
    lines = [line for line in lines if line.split("=", 1)[0] not in keys]
    lines += [
        *extra,
        f"NodeName={node} NodeAddr={LOOPBACK} CPUs={cpus} RealMemory=100 "
        f"Gres={','.join(f'gpu:{kind}:{n}' for kind, _, n in gres)} State=UNKNOWN",
        "PartitionName=gpu Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
        "",
    ]
    conf.write_text("\n".join(lines))
    return conf


def _write_hooks(root: Path, alloc: Path) -> Path:
    """Wrappers that run the project's hooks as Slurm would, with the test's settings file
    (``/etc/default/gpufleet`` on a real node) naming the test's allocation directory."""
    hooks = root / "hooks"
    hooks.mkdir()
    defaults = root / "gpufleet.defaults"
    defaults.write_text(f"GPUFLEET_ALLOC_DIR={alloc}\n")
    for name in ("prolog", "epilog"):
        script = hooks / name
        script.write_text(
            "#!/bin/bash\n"
            f"export GPUFLEET_DEFAULTS={defaults}\n"
            f"exec /bin/bash {REPO}/docs/slurm/{name}.sh\n"
        )
        script.chmod(0o755)
    return hooks


@contextmanager
def cluster(
    *,
    gres: Sequence[tuple[str, str, int]] = ((GPU_TYPE, f"nvidia[0-{GPUS - 1}]", GPUS),),
    prologs: Sequence[str] = (),
    extra: Sequence[str] = (),
    files: Mapping[str, str] | None = None,
) -> Iterator[Slurm]:
    """munged, slurmctld and slurmd on loopback, the node idle; stopped at the end.

    ``gres``: the node's ``gres.conf`` GPU lines in order, each (type, ``File=`` of the device
    files nvidia0-7 of a temporary directory, minor numbers 0-7, and how many); ``prologs``:
    the slurm.conf ``Prolog=`` lines, ``{hooks}/prolog`` being the project's (the default
    alone); ``extra``: more
    slurm.conf lines (each replaces the default line of its key); ``files``: more files beside
    slurm.conf."""
    why = slurm_missing()
    if why is not None:
        from tests.conftest import service_missing

        service_missing(why)
    # Outside pytest's private temporary tree: slurmrestd reads slurm.conf as another user.
    root = Path(tempfile.mkdtemp(prefix="gpufleet-slurm-"))
    root.chmod(0o755)  # others may read; munged refuses a socket directory others may write to
    node = subprocess.run(["hostname", "-s"], capture_output=True, text=True, check=True)
    name = node.stdout.strip()
    alloc = root / "alloc"
    hooks = _write_hooks(root, alloc)
    for file_name, text in (files or {}).items():
        (root / file_name).write_text(text)
    conf = _write_conf(root, name, free_port(), free_port(), hooks, gres, prologs, extra)
    jwt_key = root / "jwt.key"
    jwt_key.write_bytes(os.urandom(32))
    jwt_key.chmod(0o600)
    key = root / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    env = {
        "PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
        "SLURM_CONF": str(conf),
        "HOME": str(root),
        "LC_ALL": "C",
    }
    procs: list[subprocess.Popen[Any]] = []

    def start(*args: str, log: str) -> None:
        with open(root / log, "ab") as out:
            procs.append(
                subprocess.Popen(
                    list(args),
                    env=env,
                    cwd=root,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # its own process group, stopped as one
                )
            )

    c = Slurm(root, conf, name, alloc, env)
    try:
        start(
            "munged",
            "--foreground",
            "--force",
            f"--key-file={key}",
            f"--socket={root}/munge.socket",
            f"--pid-file={root}/munged.pid",
            f"--log-file={root}/munged.log",
            f"--seed-file={root}/munged.seed",
            log="munged.out.log",
        )
        c.wait("munged's socket", lambda: (root / "munge.socket").exists(), START_TIMEOUT_S)
        # -i: ignore any saved state; -c: a clean start
        start("slurmctld", "-D", "-i", "-f", str(conf), log="slurmctld.out.log")
        start("slurmd", "-D", "-f", str(conf), "-N", name, log="slurmd.out.log")

        def idle() -> bool:
            r = subprocess.run(
                ["sinfo", "--noheader", "--format=%t", "--nodes", name],
                env=env,
                capture_output=True,
                text=True,
                timeout=10,
            )
            return r.returncode == 0 and r.stdout.strip() == "idle"

        c.wait("the node idle", idle, START_TIMEOUT_S)
        yield c
    finally:
        try:
            c.cancel_all()  # slurmd ends the job steps it started
        except (AssertionError, OSError, subprocess.SubprocessError):
            pass
        for proc in reversed(procs):
            _stop(proc)
        _sweep(conf)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def slurm() -> Iterator[Slurm]:
    """The default cluster (gres.conf lists nvidia[0-7]), shared by the session."""
    with cluster() as c:
        yield c


@pytest.fixture
def slurmrestd(slurm: Slurm) -> Iterator[str]:
    """slurmrestd (22.05: OpenAPI v0.0.38) on loopback with JWT authentication; its URL.
    ``SLURM_JWT=daemon`` makes it pass each request's token on to slurmctld; it refuses to
    run as root or SlurmUser, so it drops to ``daemon`` once its socket is open."""
    if shutil.which("slurmrestd") is None:
        from tests.conftest import service_missing

        service_missing("slurmrestd (dev.py installs it with apt)")
    port = free_port()
    with open(slurm.root / "slurmrestd.log", "ab") as out:
        proc = subprocess.Popen(
            ["slurmrestd", "-a", "rest_auth/jwt", "-s", "openapi/v0.0.38", "-u", "daemon"]
            + ["-f", str(slurm.conf), f"{LOOPBACK}:{port}"],
            env={**slurm.env, "SLURM_JWT": "daemon"},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:

        def listening() -> bool:
            with socket.socket() as s:
                return s.connect_ex((LOOPBACK, port)) == 0

        slurm.wait("slurmrestd listening", listening, START_TIMEOUT_S)
        yield f"http://{LOOPBACK}:{port}"
    finally:
        _stop(proc)
