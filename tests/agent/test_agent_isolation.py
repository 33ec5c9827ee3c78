"""The agent stands alone: stdlib and pynvml only, nothing from Django or the server."""

from __future__ import annotations

import ast
import importlib.metadata
import subprocess
import sys
from pathlib import Path

AGENT = Path(__file__).resolve().parents[2] / "telemetry" / "agent"


def _imports(tree: ast.AST) -> list[str]:
    out: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.extend(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            out.append(node.module or "")
    return out


def test_agent_imports_only_stdlib_and_pynvml() -> None:
    """At module level, stdlib and pynvml only; prometheus_client (the dcgm source's optional
    extra) only inside a function of dcgm.py, where a node that reads NVML never calls it."""
    allowed = set(sys.stdlib_module_names) | {"pynvml"}
    for path in AGENT.glob("*.py"):
        tree = ast.parse(path.read_text())
        functions = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]
        lazy = {name for f in functions for name in _imports(f)}
        for name in _imports(tree):
            top = name.split(".")[0]
            if top == "prometheus_client" and path.name == "dcgm.py" and name in lazy:
                continue
            assert top in allowed, f"{path.name} imports {name}"


def test_importing_the_agent_loads_no_django() -> None:
    """Nor prometheus_client: the dcgm source imports it only when one is made."""
    code = (
        "import sys, telemetry.agent.cli, telemetry.agent.fake, telemetry.agent.dcgm;"
        "bad = [m for m in sys.modules if m.split('.')[0] in "
        "('django', 'rest_framework', 'celery', 'fleet', 'billing', 'config', "
        "'prometheus_client')];"
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
