"""The agent stands alone: stdlib and pynvml only, nothing from Django or the server."""

from __future__ import annotations

import ast
import importlib.metadata
import subprocess
import sys
from pathlib import Path

AGENT = Path(__file__).resolve().parents[2] / "telemetry" / "agent"


def test_agent_imports_only_stdlib_and_pynvml() -> None:
    allowed = set(sys.stdlib_module_names) | {"pynvml"}
    for path in AGENT.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            else:
                continue
            for name in names:
                assert name.split(".")[0] in allowed, f"{path.name} imports {name}"


def test_importing_the_agent_loads_no_django() -> None:
    code = (
        "import sys, telemetry.agent.cli, telemetry.agent.fake;"
        "bad = [m for m in sys.modules if m.split('.')[0] in "
        "('django', 'rest_framework', 'celery', 'fleet', 'billing', 'config')];"
        "print(bad)"
    )
    r = subprocess.run(
        [sys.executable, "-c", code],
        cwd=AGENT.parents[1],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def test_one_version_string() -> None:
    """The installed distribution, the agent's own string and ``gpufleet-agent --version`` say
    the same version (pyproject.toml reads it from the agent package)."""
    from telemetry.agent import __version__

    assert importlib.metadata.version("gpufleet") == __version__
    r = subprocess.run(
        [sys.executable, "-m", "telemetry.agent.cli", "--version"],
        cwd=AGENT.parents[1],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.stdout.strip() == f"gpufleet-agent {__version__}"
