"""Dependencies point down (STYLE.md): alerts reads billing, fleet and telemetry; none of
them reads alerts. Billing applies the fleet file's [[alerts]] through a hook alerts
registers (billing.services.fleet_section_register), not by importing it: fleet_apply's
tests in test_fleetfile.py show the hook works."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def imported(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


@pytest.mark.parametrize("app", ["fleet", "telemetry", "billing"])
def test_apps_below_alerts_do_not_import_it(app: str) -> None:
    files = sorted((ROOT / app).rglob("*.py"))
    assert files, f"no sources under {app}/"
    offenders = {
        str(path.relative_to(ROOT)): sorted(
            n for n in imported(path) if n.split(".")[0] == "alerts"
        )
        for path in files
    }
    assert not {k: v for k, v in offenders.items() if v}
