"""The agent's allocation directory seen from the server (issue 48): what hides Slurm's
allocation files from the agent travels in the node header of every push and shows on
``/metrics``, so an unwritable or untrusted directory (idle GPUs of jobs going unattributed)
is no longer visible only in one node's log."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from django.test import override_settings

from fleet.models import Node
from telemetry.agent.workloads import ALLOC_PROBLEM_MAX, AllocationDir, Discovery, ProcResolver
from telemetry.models import Sample
from tests.deploy.test_health_metrics import parse_exposition
from tests.telemetry.test_ingest import agent, base, gpu_block, push, sample  # noqa: F401

GPU = "GPU-0a1b2c3d-0000-4000-8000-000000000001"
PROBLEM = "gpufleet_node_allocation_problem"
SKIPPED = "gpufleet_node_allocation_files_skipped"


def metrics(client: Any) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with override_settings(METRICS_TOKEN="m3trics-t0ken"):
        r = client.get("/metrics", HTTP_AUTHORIZATION="Bearer m3trics-t0ken")
    assert r.status_code == 200
    return parse_exposition(r.content.decode())


def test_the_agent_s_directory_problem_reaches_metrics_and_clears(
    agent: Any,  # noqa: F811
    base: Any,  # noqa: F811
    client: Any,
    tmp_path: Path,
) -> None:
    d = tmp_path / "alloc"
    src = AllocationDir(str(d))
    discovery = Discovery(ProcResolver(str(tmp_path / "proc")), src)
    gpus = {GPU: 0}

    # Not made yet (no GPU job since boot): normal, no problem said to the server.
    src.allocations(0.0, gpus)
    assert discovery.health() == {"alloc_problem": "", "alloc_skipped_files": 0}

    # Writable by others: nothing in it is believed, and the server hears why.
    d.mkdir()
    d.chmod(0o777)
    src.allocations(10.0, gpus)
    health = discovery.health()
    assert health["alloc_problem"].startswith(f"{d} is writable by group or others")
    a = agent("gpu-n1")
    r = a.post(push([sample(GPU, base)], [gpu_block(GPU)], **health))
    assert r.status_code == 200
    node = Node.objects.get(pk=a.node.pk)
    assert node.alloc_problem == health["alloc_problem"] and node.alloc_skipped_files == 0
    got = metrics(client)
    assert got[(PROBLEM, (("node", "gpu-n1"),))] == 1
    assert got[(SKIPPED, (("node", "gpu-n1"),))] == 0

    # Fixed, with one file that is not an allocation: the problem clears, the skip is counted.
    d.chmod(0o755)
    (d / "slurm-7.json").write_text("{not json")
    (d / "slurm-8.json").write_text(json.dumps({"kind": "slurm", "id": "8", "gpus": [0]}))
    assert [x.workload.id for x in src.allocations(20.0, gpus)] == ["8"]
    health = discovery.health()
    assert health == {"alloc_problem": "", "alloc_skipped_files": 1}
    assert a.post(push([], [], **health)).status_code == 200
    got = metrics(client)
    assert got[(PROBLEM, (("node", "gpu-n1"),))] == 0
    assert got[(SKIPPED, (("node", "gpu-n1"),))] == 1

    # An agent that does not say (an older one): what it said last stands.
    assert a.post(push([], [])).status_code == 200
    node = Node.objects.get(pk=a.node.pk)
    assert (node.alloc_problem, node.alloc_skipped_files) == ("", 1)


def test_a_long_path_is_cut_to_what_the_server_takes(tmp_path: Path) -> None:
    d = tmp_path / ("x" * 200) / ("y" * 200)
    d.mkdir(parents=True)
    d.chmod(0o777)
    src = AllocationDir(str(d))
    src.allocations(0.0, {GPU: 0})
    problem = src.health()["alloc_problem"]
    assert len(problem) == ALLOC_PROBLEM_MAX and problem.startswith(str(d)[:100])


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("alloc_problem", "x" * (ALLOC_PROBLEM_MAX + 1)),
        ("alloc_problem", 7),
        ("alloc_skipped_files", -1),
        ("alloc_skipped_files", 2**31),
    ],
)
def test_bad_allocation_health_is_400_naming_the_field(
    agent: Any,  # noqa: F811
    base: Any,  # noqa: F811
    field: str,
    value: Any,
) -> None:
    a = agent()
    r = a.post(push([sample(GPU, base)], [gpu_block(GPU)], **{field: value}))
    assert r.status_code == 400
    assert f"node.{field}" in json.dumps(r.json())
    assert not Node.objects.get(pk=a.node.pk).gpus.exists()
    assert not Sample.objects.exists()
