#!/usr/bin/env python3
"""The two quick-start commands (README): ``python3 dev.py demo`` and ``python3 dev.py test``.

Needs only Python 3.11+. Each creates or reuses ``.venv``, installs the project when its
dependencies changed, then runs. ``test`` points the suite at the local PostgreSQL and Redis
unless ``DATABASE_URL`` / ``REDIS_URL`` are set, then runs a smoke set on embedded SQLite.
``test --screenshots`` also rewrites the README's screenshots (docs/screenshots/); without it
the browser tests write theirs to var/screenshots/ and leave the tree clean.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
PY = VENV / "bin" / "python"
STAMP = VENV / ".gpufleet-installed"

LOCAL_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/gpufleet"
LOCAL_REDIS_URL = "redis://127.0.0.1:6379/0"
CREATE_LOCAL_DB = (
    "import psycopg\n"
    "with psycopg.connect('postgresql://postgres@127.0.0.1:5432/postgres', autocommit=True,"
    " connect_timeout=3) as c:\n"
    "    if not c.execute(\"SELECT 1 FROM pg_database WHERE datname = 'gpufleet'\").fetchone():\n"
    "        c.execute('CREATE DATABASE gpufleet')\n"
)


def say(message: str) -> None:
    print(f"==> {message}", flush=True)


def run(*args: str | Path, env: dict[str, str] | None = None) -> None:
    result = subprocess.run([str(a) for a in args], cwd=ROOT, env=env)
    if result.returncode != 0:
        sys.exit(result.returncode)


def ensure_venv(extras: str) -> None:
    if sys.version_info < (3, 11):  # noqa: UP036 - this script may be run by an older python3
        sys.exit("Python 3.11 or newer is needed")
    if not PY.exists():
        say(f"creating {VENV}")
        venv.EnvBuilder(with_pip=True).create(VENV)
    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes() + extras.encode()).hexdigest()
    if STAMP.exists() and STAMP.read_text() == digest:
        return
    say(f"installing the project and its {extras or 'runtime'} dependencies")
    run(PY, "-m", "pip", "install", "--quiet", "--upgrade", "pip")
    run(PY, "-m", "pip", "install", "--quiet", "-e", f".[{extras}]" if extras else ".")
    STAMP.write_text(digest)


# Debian packages the tests drive: the commands each provides, the install arguments, and the
# services the package starts on a systemd host, which the tests do not want running (they
# start their own server on loopback). Chromium for the browser tests; promtool and a
# Prometheus server for the /metrics tests, without the recommended node exporter; shellcheck
# for the Slurm prolog and epilog the docs ship.
DEBIAN_TOOLS = (
    (("chromium",), ("chromium", "fonts-dejavu-core"), ()),
    (("promtool", "prometheus"), ("--no-install-recommends", "prometheus"), ("prometheus",)),
    (("shellcheck",), ("shellcheck",), ()),
    # A real Slurm for the queue and prolog tests (tests/slurm/); they start their own daemons
    (
        ("munged", "slurmctld", "slurmd", "squeue", "sbatch", "slurmrestd"),
        ("slurm-wlm", "slurmrestd", "munge"),
        ("slurmctld", "slurmd", "slurmrestd", "munge"),
    ),
)


def ensure_debian_tools() -> None:
    """Install the tools the tests need when they are missing and we can (root with apt-get).

    A failed install is reported, not fatal: the tests that need the tool then skip here and
    fail in CI, naming what is missing.
    """
    missing = [(a, s) for commands, a, s in DEBIAN_TOOLS if not all(map(shutil.which, commands))]
    if not missing or os.geteuid() != 0 or not shutil.which("apt-get"):
        return
    packages = [a for args, _ in missing for a in args if not a.startswith("-")]
    say(f"installing Debian's {', '.join(packages)} for the tests")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], env=env, check=False)
    for args, services in missing:
        install = ["apt-get", "install", "-y", "-qq", *args]
        if subprocess.run(install, env=env, check=False).returncode:
            say(f"could not install {' '.join(args)}; the tests that need it will say so")
        elif services and Path("/run/systemd/system").is_dir():
            subprocess.run(["systemctl", "disable", "--now", *services], check=False)


# The FinOps Foundation's FOCUS validator, which the FOCUS export's test runs: in an environment
# of its own (it pins numpy < 2 and old pandas and pandera); multimethod 2 broke it.
FOCUS_VALIDATOR_VENV = VENV / "focus-validator"
FOCUS_VALIDATOR = FOCUS_VALIDATOR_VENV / "bin" / "focus-validator"
FOCUS_VALIDATOR_PACKAGES = ("focus-validator==1.0.0", "multimethod<2")


def ensure_focus_validator() -> None:
    """Install the validator when it is missing; a failure is reported, not fatal (its test
    then skips here and fails in CI, naming what is missing)."""
    if FOCUS_VALIDATOR.exists():
        return
    say("installing focus-validator for the FOCUS export's test")
    venv.EnvBuilder(with_pip=True).create(FOCUS_VALIDATOR_VENV)
    python = FOCUS_VALIDATOR_VENV / "bin" / "python"
    install = [str(python), "-m", "pip", "install", "--quiet", *FOCUS_VALIDATOR_PACKAGES]
    if subprocess.run(install, cwd=ROOT, check=False).returncode:
        say("could not install focus-validator; the test that needs it will say so")


def cmd_demo(args: list[str]) -> None:
    ensure_venv("")
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL")
    }
    env["DJANGO_SETTINGS_MODULE"] = "config.settings"
    run(PY, "manage.py", "demo", *args, env=env)


def screenshots_flag(args: list[str]) -> tuple[list[str], dict[str, str]]:
    """``--screenshots`` (ours, not pytest's): the browser tests rewrite the README's
    screenshots in docs/screenshots/; without it they write to var/screenshots/ only, so a
    test run leaves the tree clean. Returns pytest's arguments and the environment to add."""
    if "--screenshots" not in args:
        return args, {}
    return [a for a in args if a != "--screenshots"], {"GPUFLEET_UPDATE_SCREENSHOTS": "1"}


def cmd_test(args: list[str]) -> None:
    ensure_venv("dev")
    ensure_debian_tools()
    ensure_focus_validator()
    args, extra_env = screenshots_flag(args)
    env = {**os.environ, **extra_env}
    env.setdefault("FOCUS_VALIDATOR", str(FOCUS_VALIDATOR))
    env.setdefault("DATABASE_URL", LOCAL_DATABASE_URL)
    env.setdefault("REDIS_URL", LOCAL_REDIS_URL)
    env["DJANGO_SETTINGS_MODULE"] = "config.settings"
    bin_dir = VENV / "bin"
    if env["DATABASE_URL"] == LOCAL_DATABASE_URL:
        # The test run makes its own test_gpufleet; the plain one keeps makemigrations --check
        # from warning that it cannot read the migration history.
        subprocess.run(
            [str(PY), "-c", CREATE_LOCAL_DB], cwd=ROOT, env=env, capture_output=True, check=False
        )
    if not args:
        say("ruff")
        run(bin_dir / "ruff", "check", ".")
        run(bin_dir / "ruff", "format", "--check", ".")
        say("mypy")
        # The application and the benchmarks; tests are left to ruff and to running them.
        run(
            bin_dir / "mypy",
            *("config", "fleet", "telemetry", "billing", "alerts", "bench", "dev.py"),
            env=env,
        )
        say("manage.py check / makemigrations --check")
        run(PY, "manage.py", "check", "--fail-level", "WARNING", env=env)
        run(PY, "manage.py", "makemigrations", "--check", "--dry-run", env=env)
    say(f"pytest on PostgreSQL and Redis ({env['DATABASE_URL'].rsplit('@', 1)[-1]})")
    run(PY, "-m", "pytest", *(args or ["-q"]), env=env)
    if not args:
        say("smoke set on the embedded SQLite default")
        smoke = {
            k: v
            for k, v in env.items()
            if k not in ("DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL")
        }
        smoke["GPUFLEET_VAR_DIR"] = str(ROOT / "var" / "smoke")
        run(PY, "-m", "pytest", "-q", "-m", "smoke", env=smoke)


def main() -> None:
    commands = {"demo": cmd_demo, "test": cmd_test}
    if len(sys.argv) < 2 or sys.argv[1] not in commands:
        sys.exit("usage: python3 dev.py demo [--fresh] | test [--screenshots] [pytest args]")
    commands[sys.argv[1]](sys.argv[2:])


if __name__ == "__main__":
    main()
