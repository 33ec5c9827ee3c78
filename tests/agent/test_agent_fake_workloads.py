"""The fake fleet's workloads (spec option ``workloads=1``): the story the demo tells, the same
shares from the tick-by-tick agent and from ``simulate``, and nothing changed when it is off."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter, defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from telemetry.agent.fake import FakeFleet, PatternGpu, parse_spec, simulate

from .test_agent_fake import tick_path
from .test_agent_shares import assert_server_accepts

REPO = Path(__file__).resolve().parents[2]
T0 = 1796029200  # 2026-11-30T09:00:00Z, a Monday
DAY0 = datetime(2026, 11, 30, tzinfo=UTC)


def samples(spec: Any, start: datetime, end: datetime, **kw: Any) -> list[dict[str, Any]]:
    return [s for _, p in simulate(spec, start=start, end=end, **kw) for s in p["samples"]]


def pattern_of(fleet: FakeFleet) -> dict[str, tuple[str, int, str]]:
    """GPU uuid → (pattern, index in its node, node)."""
    return {
        g.uuid: (g.pattern, g.index, h)
        for h in fleet.nodes
        for g in fleet.node(h).gpus
        if isinstance(g, PatternGpu)
    }


def test_spec_option_in_every_form() -> None:
    assert [g.workloads for g in parse_spec("nodes=1,workloads=1;nodes=1")] == [True, False]
    assert [g.workloads for g in parse_spec({"nodes": 2, "workloads": True})] == [True]
    top = {"workloads": 1, "groups": [{"nodes": 1}, {"nodes": 1, "workloads": 0}]}
    assert [g.workloads for g in parse_spec(top)] == [True, False]
    assert [g.workloads for g in parse_spec("workloads")] == [True] * 5  # the preset
    with pytest.raises(ValueError, match="unknown pattern"):
        parse_spec("pattern=hogs")


def test_the_story_the_demo_tells() -> None:
    """Two days of the ``workloads`` preset (docs/agent.md, issue 14's demo)."""
    fleet = FakeFleet("workloads", seed=3, epoch=DAY0)
    where = pattern_of(fleet)
    out = samples(fleet, DAY0, DAY0 + timedelta(days=2))
    for s in out[:: len(out) // 500]:
        assert_server_accepts(s)
    by: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for s in out:
        assert "workloads" in s  # every GPU says who holds it, [] when nobody does
        by[where[s["gpu"]][0]].append(s)
    kinds = {p: Counter(w["kind"] for s in v for w in s["workloads"]) for p, v in by.items()}
    assert set(kinds["training"]) == {"slurm"} and set(kinds["starved"]) == {"slurm"}
    assert set(kinds["inference"]) == {"k8s"} and set(kinds["notebook"]) == {"user"}

    # one job holds all 8 GPUs of the hog node and computes on GPU 0 only
    minute: dict[str, dict[int, dict[str, Any]]] = defaultdict(dict)
    for s in by["hog"]:
        minute[s["start"]][where[s["gpu"]][1]] = s
    for start, gpus in minute.items():
        ids = {w["id"] for s in gpus.values() for w in s["workloads"]}
        assert len(ids) == 1 and len(gpus) == 8, start
        assert all(g["util_pct"] == 0 and g["procs"] == 0 for i, g in gpus.items() if i)
        assert all(g["workloads"][0]["share_s"] == 60.0 for g in gpus.values())
    hog_air = sum(w["air_s"] for s in by["hog"] for w in s["workloads"])
    hog_share = sum(w["share_s"] for s in by["hog"] for w in s["workloads"])
    assert 0.10 < hog_air / hog_share < 0.125  # ~92 % on 1 GPU of 8

    # the starved GPU's jobs run at 26–34 %, the others' at 90–98 %
    def busy_util(pattern: str) -> float:
        busy = [s for s in by[pattern] if s["util_pct"] > 10]
        return sum(s["util_pct"] for s in busy) / len(busy)

    assert 26 <= busy_util("starved") <= 34 and busy_util("training") >= 90

    # notebooks: a user's kernel holds the GPU (all day, both days) and computes ~nothing
    nb = by["notebook"]
    assert all(len(s["workloads"]) == 1 and s["workloads"][0]["share_s"] == 60 for s in nb)
    assert sum(w["air_s"] for s in nb for w in s["workloads"]) < 0.05 * 60 * len(nb)
    # inference: one pod per GPU, namespace/pod with the namespace as account
    pods = {w["id"]: w for s in by["inference"] for w in s["workloads"]}
    assert all(w["id"].split("/")[0] == w["account"] for w in pods.values())
    assert len(pods) == 8  # redeployed weekly: one pod per GPU over these two days


def test_workloads_are_deterministic_by_seed_and_ids_unique() -> None:
    end = DAY0 + timedelta(hours=4)
    a = samples("workloads", DAY0, end, seed=5)
    assert a == samples("workloads", DAY0, end, seed=5)
    b = samples("workloads", DAY0, end, seed=6)
    ids = lambda xs: {w["id"] for s in xs for w in s["workloads"]}  # noqa: E731
    assert ids(a) != ids(b)
    # a Slurm job id is one job: the same name and user wherever it appears
    seen: dict[str, tuple[str, str]] = {}
    for s in a:
        for w in s["workloads"]:
            if w["kind"] == "slurm":
                assert seen.setdefault(w["id"], (w["name"], w["user"])) == (w["name"], w["user"])


def test_the_option_off_changes_nothing_else() -> None:
    spec = {
        "nodes": 1,
        "gpus": 8,
        "model": "H100",
        "pattern": ["training", "starved", "hog", "inference", "batch", "notebook", "parked"],
    }
    end = DAY0 + timedelta(hours=6)
    off = samples(spec, DAY0, end, seed=9)
    on = samples({**spec, "workloads": 1}, DAY0, end, seed=9)
    assert all("workloads" not in s for s in off)
    assert [{k: v for k, v in s.items() if k != "workloads"} for s in on] == off


@pytest.mark.parametrize(
    ("start_hms", "minutes", "interval"),
    [((1, 0), 45, 60), ((13, 58), 8, 10), ((5, 55), 20, 300)],
)
def test_tick_path_matches_simulator_with_workloads(
    start_hms: tuple[int, int], minutes: int, interval: int
) -> None:
    """The fake NVML's process lists resolved through the fake process table, its allocations,
    the collector and the summariser, second by second: exactly simulate()'s closed form."""
    t0 = T0 - 9 * 3600 + start_hms[0] * 3600 + start_hms[1] * 60
    spec = {
        "nodes": 1,
        "gpus": 8,
        "model": "H100",
        "pattern": ["hog", "hog", "training", "starved", "inference", "batch", "notebook", "hog"],
        "workloads": 1,
        "falls_off_bus": {"node": 0, "gpu": 5, "at": f"+{minutes * 30 + 7}s"},
    }
    if interval == 10:
        spec["unsupported"] = ["procs"]  # the process lists cannot be read: no key at all
    fleet = FakeFleet(spec, seed=11, epoch=t0)
    ticked = [
        s
        for s in tick_path(fleet, fleet.nodes[0], t0, t0 + minutes * 60, interval, workloads=True)
        if s["start"] >= datetime.fromtimestamp(t0, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    ]
    sim = samples(
        FakeFleet(spec, seed=11, epoch=t0),
        datetime.fromtimestamp(t0, UTC),
        datetime.fromtimestamp(t0 + minutes * 60, UTC),
        interval_s=interval,
    )
    key = lambda s: (s["start"], s["gpu"])  # noqa: E731
    assert sorted(ticked, key=key) == sorted(sim, key=key)
    if interval == 10:
        assert all("workloads" not in s for s in sim)
    else:
        assert any(w["share_s"] for s in sim for w in s["workloads"])
    assert any(s["seconds"] < interval for s in sim)  # the lost GPU's last, partial interval


def test_once_print_of_a_fake_node_with_workloads() -> None:
    env = {**os.environ, "GPUFLEET_FAKE_EPOCH": str(T0)}
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "telemetry.agent.cli",
            "--fake",
            "nodes=1,gpus=2,model=H100,pattern=hog,workloads=1",
            "--once",
            "--print",
            "--interval",
            "10",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    gpu0, gpu1 = json.loads(r.stdout)["samples"]
    (w0,), (w1,) = gpu0["workloads"], gpu1["workloads"]
    assert w0["id"] == w1["id"] and w0["share_s"] == w1["share_s"] == 10.0
    assert w0["air_s"] > 8 and w1["air_s"] == 0.0 and gpu1["procs"] == 0
