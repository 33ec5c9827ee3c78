"""MIG through the fake NVML (docs/agent.md, "MIG"): instances read, one sample per instance
beside the GPU's own, the GPU's utilisation and workload shares weighted by slices, a
reconfiguration mid-run with every second of every slice accounted for, and NVML's
NOT_SUPPORTED for utilisation in MIG mode.

Same conventions as test_agent_collect.py: 10-second intervals from T0, the tick at t reads the
second [t-1, t).
"""

from __future__ import annotations

import logging
from typing import Any

import pynvml
import pytest

from telemetry.agent.agent import Agent
from telemetry.agent.clock import VirtualClock
from telemetry.agent.fake import MIG_PROFILES_H100, FakeNvml, ScriptedGpu
from telemetry.agent.nvml import mig_profile
from telemetry.agent.source import Workload
from tests.agent.test_agent_collect import H100, START, T0, U1, counter, run, script

A = Workload("slurm", "101", user="alice")
B = Workload("slurm", "202", user="bob")
C = Workload("k8s", "chat/pod-c", account="chat")
LAYOUT = ("3g.40gb", "2g.20gb", "1g.10gb")  # 6 of the 7 slices: one is in no instance
LATER = ("4g.40gb", "3g.40gb")  # all 7


def make(
    mig: list[tuple[int, tuple[str, ...]]], *, gpm: bool = True
) -> tuple[Agent, VirtualClock, FakeNvml]:
    clock = VirtualClock(T0)
    api: FakeNvml

    def activity(t: int, gi: int) -> tuple[float | None, list[int]]:
        # gi 1: A at 90 %; gi 2: B and C at 40 %; gi 3: nothing (0 %)
        held = {1: ([A], 90.0), 2: ([B, C], 40.0), 3: ([], 0.0)}.get(gi, ([], 0.0))
        return held[1], [api.processes.pid_of(w) for w in held[0]]

    prof = (lambda t: (50, 20, 30, 40)) if gpm else None
    g = ScriptedGpu(U1, 0, H100, script, energy=counter, prof=prof, mig=mig,
                    mig_script=activity)  # fmt: skip
    api = FakeNvml([g], clock.time)
    agent = Agent(api, spool_dir=None, interval_s=10, hostname="gpu-mig", clock=clock,
                  workloads=api.discovery())  # fmt: skip
    return agent, clock, api


def by_key(out: list[dict[str, Any]]) -> dict[tuple[str | None, str], dict[str, Any]]:
    return {(s.get("instance"), s["start"]): s for s in out}


def shares(s: dict[str, Any]) -> dict[str, tuple[float, float]]:
    return {w["id"]: (w["share_s"], w["air_s"]) for w in s.get("workloads", [])}


def test_the_h100_profile_table_and_names_from_attributes() -> None:
    table = {n: (p.id, p.slices) for n, p in MIG_PROFILES_H100.items()}
    assert table == {
        "1g.10gb": (19, 1),
        "1g.20gb": (15, 1),
        "2g.20gb": (14, 2),
        "3g.40gb": (9, 3),
        "4g.40gb": (5, 4),
        "7g.80gb": (0, 7),
    }
    # NVIDIA's names from slices and memory (MiB, rounded up to whole GB)
    for name, p in MIG_PROFILES_H100.items():
        assert mig_profile(p.slices, p.slices, p.memory_mb) == name
    assert mig_profile(3, 1, 40448) == "1c.3g.40gb"


def test_instances_are_read_and_each_sends_its_own_sample(
    caplog: pytest.LogCaptureFixture,
) -> None:
    agent, clock, api = make([(T0 - 100, LAYOUT)])
    with caplog.at_level(logging.INFO, logger="gpufleet.agent"):
        out = by_key(run(agent, clock, T0, T0 + 10))
    [inv] = agent.source.inventory()
    assert inv["mig_slices"] == 7
    mig = inv["mig"]
    assert [(m["gi"], m["ci"], m["profile"], m["slices"], m["memory_mb"]) for m in mig] == [
        (1, 0, "3g.40gb", 3, 40448),
        (2, 0, "2g.20gb", 2, 20096),
        (3, 0, "1g.10gb", 1, 9984),
    ]
    u3, u2, u1 = (m["uuid"] for m in mig)
    assert all(u.startswith("MIG-") for u in (u3, u2, u1))
    # the instances' samples of [T0, T0+10): GPM graphics utilisation as util_pct, SM
    # activity 80 % of it; processes and workloads per instance
    s3 = out[(u3, START)]
    assert (s3["gpu"], s3["seconds"], s3["util_pct"], s3["procs"]) == (U1, 10, 90.0, 1)
    assert (s3["sm_active"], s3["prof_s"]) == (0.72, 10)
    assert shares(s3) == {"101": (10.0, 9.0)}
    s2 = out[(u2, START)]
    assert (s2["util_pct"], s2["procs"]) == (40.0, 2)
    assert shares(s2) == {"202": (5.0, 2.0), "chat/pod-c": (5.0, 2.0)}
    s1 = out[(u1, START)]
    assert (s1["util_pct"], s1["procs"], s1["workloads"]) == (0.0, 0, [])
    assert "energy_j" not in s1 and "power_w" not in s1  # the GPU's, not an instance's
    # the GPU's own sample: every second, utilisation weighted by slices over 7
    # ((3×90 + 2×40 + 1×0) / 7 = 50 %), power and energy as ever, processes summed, and the
    # workloads' shares of the GPU: A 3/7 of each second, B and C 2/7 ÷ 2
    g = out[(None, START)]
    assert (g["seconds"], g["util_pct"], g["procs"]) == (10, 50.0, 3)
    assert (g["energy_j"], g["power_w"]) == (4500.0, 300.0)
    assert "mem_util_pct" not in g  # NVML has no utilisation rates in MIG mode
    assert shares(g) == {
        "101": (round(10 * 3 / 7, 3), round(9 * 3 / 7, 3)),  # 4.286 s, 3.857 s of air
        "202": (round(10 * 1 / 7, 3), round(4 * 1 / 7, 3)),  # 1.429, 0.571
        "chat/pod-c": (round(10 * 1 / 7, 3), round(4 * 1 / 7, 3)),
    }
    # Σ share = 10 × 5/7 (the 3g and 2g held; the 1g idle, one slice free): held = Σ share −
    # air = 7.143 − 5.0 = 2.143 s; parked = 10 − 5 − 2.143 s: the free slice and the idle 1g
    assert sum(s for s, _ in shares(g).values()) == pytest.approx(50 / 7, abs=0.002)
    messages = [r.getMessage() for r in caplog.records]
    assert any("MIG mode (7 slices)" in m for m in messages)


def test_utilisation_is_not_supported_in_mig_mode_and_the_gpu_still_reports() -> None:
    agent, clock, api = make([(T0 - 100, LAYOUT)])
    clock.set(T0 + 0.002)
    api.nvmlInit()
    h = api.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        api.nvmlDeviceGetUtilizationRates(h)
    mh = api.nvmlDeviceGetMigDeviceHandleByIndex(h, 0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        api.nvmlDeviceGetUtilizationRates(mh)
    assert api.nvmlDeviceGetMigMode(h) == [1, 1]
    with pytest.raises(pynvml.NVMLError_NotFound):
        api.nvmlDeviceGetMigDeviceHandleByIndex(h, 3)  # 3 instances: index 3 is empty
    assert api.nvmlDeviceGetAttributes(mh).gpuInstanceSliceCount == 3
    assert api.nvmlDeviceGetUUID(api.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mh)) == U1
    out = run(agent, clock, T0, T0 + 20)
    gpu = [s for s in out if "instance" not in s and s["seconds"] == 10]
    assert [s["util_pct"] for s in gpu] == [50.0, 50.0]


def test_without_gpm_per_instance_air_is_zero_and_processes_decide_held_or_parked(
    caplog: pytest.LogCaptureFixture,
) -> None:
    agent, clock, _ = make([(T0 - 100, LAYOUT)], gpm=False)
    with caplog.at_level(logging.WARNING, logger="gpufleet.agent"):
        out = by_key(run(agent, clock, T0, T0 + 20))
    g = out[(None, START)]
    assert g["util_pct"] == 0.0 and "sm_active" not in g
    assert shares(g)["101"] == (round(10 * 3 / 7, 3), 0.0)
    said = [r for r in caplog.records if "no activity for its MIG instances" in r.getMessage()]
    assert len(said) == 1  # once, not every second


def test_a_reconfiguration_mid_interval_keeps_every_second_of_every_slice() -> None:
    # 3g + 2g + 1g (one slice free) until T0+15, then 4g + 3g: new instances, new UUIDs
    agent, clock, _ = make([(T0 - 100, LAYOUT), (T0 + 15, LATER)])
    out = run(agent, clock, T0, T0 + 30)
    gpu = [s for s in out if "instance" not in s and s["start"] >= START]
    inst = [s for s in out if "instance" in s and s["start"] >= START]
    # the GPU: every second of [T0, T0+30)
    assert sum(s["seconds"] for s in gpu) == 30
    # the instances: slice-seconds of the instances + those of the free slice = 7 × 30
    # (the old layout's 6 slices for 15 s and one free slice, then 7 slices for 15 s)
    slices = {"3g.40gb": 3, "2g.20gb": 2, "1g.10gb": 1, "4g.40gb": 4}
    [inv] = agent.source.inventory()
    now = {m["uuid"] for m in inv["mig"]}
    old = {s["instance"] for s in inst} - now
    assert len(old) == 3 and len(now) == 2  # every instance of both layouts reported
    per_uuid = {u: sum(s["seconds"] for s in inst if s["instance"] == u) for u in old | now}
    assert sorted(per_uuid.values()) == [15, 15, 15, 15, 15]
    profile = {m["uuid"]: m["profile"] for m in inv["mig"]}
    new_slice_s = sum(per_uuid[u] * slices[profile[u]] for u in now)
    assert new_slice_s == 7 * 15
    old_slice_s = sum(per_uuid[u] for u in old) * 2  # 3 instances × 15 s; 6 slices in all
    assert old_slice_s + 1 * 15 == 7 * 15
    # the interval with the change: the old instances' samples cover 5 s, the new ones' 5 s
    mid = "2026-11-30T09:00:10Z"
    assert sorted(s["seconds"] for s in inst if s["start"] == mid) == [5, 5, 5, 5, 5]
    # the new 4g instance's first second has no GPM pair yet: 4 s of activity, 0 % in the
    # first (util 4 × 90 / 5 = 72 %)
    first = [s for s in inst if s["start"] == mid and s["instance"] in now]
    assert sorted(s["prof_s"] for s in first) == [4, 4]
    # the GPU's workload shares add up, second by second, to the held slices over 7
    g_mid = next(s for s in gpu if s["start"] == mid)
    # 5 s of the old layout: A 3/7, B and C 1/7 each; 5 s of the new: A on the 4g
    # (gi 1) 4/7, B and C on the 3g (gi 2) 3/14 each
    assert shares(g_mid)["101"][0] == pytest.approx(5 * 3 / 7 + 5 * 4 / 7, abs=0.002)
    assert shares(g_mid)["202"][0] == pytest.approx(5 / 7 + 5 * 3 / 14, abs=0.002)


def test_a_gpu_leaving_mig_mode_is_read_as_one_gpu_again() -> None:
    agent, clock, api = make([(T0 - 100, LAYOUT)])
    run(agent, clock, T0, T0 + 5)
    api.gpus[0].mig = []  # MIG off (after a GPU reset)
    out = run(agent, clock, T0 + 6, T0 + 20)
    last = [s for s in out if s["start"] == "2026-11-30T09:00:10Z"]
    assert len(last) == 1 and "instance" not in last[0]
    assert last[0]["util_pct"] == 50.0  # utilisation samples again: (5×80 + 5×20) / 10
    assert "mig" not in agent.source.inventory()[0]
