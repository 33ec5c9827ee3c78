"""``--source dcgm``: an existing dcgm-exporter's /metrics, scraped over real HTTP on 127.0.0.1,
through the same summariser as NVML (docs/agent.md).

Conventions of test_agent_collect.py: 10-second intervals from T0 = 2026-11-30T09:00:00Z; the
tick at t scrapes the exporter, whose answer describes the second [t-1, t) (its energy counter
as read at t). The fake exporter reads the same VirtualClock as the agent.
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from telemetry.agent.agent import Agent
from telemetry.agent.clock import VirtualClock
from telemetry.agent.dcgm import DcgmSource, parse, reading
from telemetry.agent.fake import FakeFleet, FakeGpu, ScriptedGpu
from telemetry.agent.fake_dcgm import FakeExporter, exposition
from telemetry.agent.source import Workload
from tests.agent import dcgm_fixtures as fx
from tests.agent.test_agent_collect import (
    FULL,
    H100,
    START,
    START2,
    T0,
    U1,
    U2,
    counter,
    only,
    run,
    script,
)
from tests.agent.test_agent_gpm import PROF_FULL, PROF_KEYS, prof

MIB = 1 << 20
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def exporter() -> Iterator[FakeExporter]:
    e = FakeExporter(lambda: "")
    yield e
    e.down()


def agent_on(exporter: FakeExporter, clock: VirtualClock) -> Agent:
    # a short scrape timeout keeps the hanging-exporter tests quick
    source = DcgmSource(exporter.url, timeout_s=0.3)
    return Agent(source, spool_dir=None, interval_s=10, hostname="gpu-test-01", clock=clock)


def serve(exporter: FakeExporter, clock: VirtualClock, text: Callable[[int], str]) -> None:
    """Answer each scrape with ``text(now)``, ``now`` the whole second of the agent's clock."""
    exporter.body = lambda: text(int(clock.time()))


def serve_gpus(exporter: FakeExporter, clock: VirtualClock, gpus: list[FakeGpu]) -> None:
    serve(exporter, clock, lambda now: exposition(gpus, now))


# -- the hand-written answers ------------------------------------------------------------------

H100_REASONS = {0: 4, 1: 4, 5: 1, 6: 4 | 0x20, 7: 0x8, 8: 0x40, 9: 0x10}


def h100_text(now: int) -> str:
    """Second now-1: seconds 0–4 of each 10 busy (graphics engine 95 %, SMs 40 % active),
    5–9 nearly idle (15 %, 5 %). The busy GPU's counter grows 400 J a second, the idle one's
    69.012 J, each read at ``now``."""
    s = (now - 1) % 10
    busy = s < 5
    return fx.H100_PROFILING.substitute(
        clock=1980 if busy else 1410,
        temp=60 + s,
        power="612.500000" if busy else "180.200000",
        energy=9_876_543_210 + 400_000 * (now - T0),
        energy_idle=1_234_567_890 + 69_012 * (now - T0),
        mem_util=41 if busy else 3,
        reasons=H100_REASONS.get(s, 0),
        gr_active="0.950000" if busy else "0.150000",
        sm_active="0.400000" if busy else "0.050000",
        sm_occupancy="0.200000" if busy else "0.020000",
        tensor_active="0.300000" if busy else "0.000000",
        dram_active="0.250000" if busy else "0.010000",
    )


def a100_text(now: int) -> str:
    """Seconds 0–4 at 100 %, 350.5 W; 5–9 at 0 %, 85.5 W; the counter grows 300 J a second."""
    busy = (now - 1) % 10 < 5
    return fx.A100_DEFAULT.substitute(
        clock=1410 if busy else 210,
        temp=70 if busy else 55,
        power="350.500000" if busy else "85.500000",
        energy=4_000_000_000 + 300_000 * (now - T0),
        util=100 if busy else 0,
        mem_util=60 if busy else 0,
        reasons=4 if busy else 1,
    )


def k8s_text(now: int) -> str:
    return fx.K8S_L4.substitute(util0=73, util2=30)


def test_h100_with_profiling_fields(exporter: FakeExporter) -> None:
    clock = VirtualClock(T0)
    serve(exporter, clock, h100_text)
    agent = agent_on(exporter, clock)
    out = run(agent, clock, T0, T0 + 10)
    assert only(out, fx.H100_UUID, START) == {
        "gpu": fx.H100_UUID,
        "start": START,
        "seconds": 10,
        "util_pct": 55.0,  # no GPU_UTIL: graphics engine active × 100, (5×95 + 5×15) / 10
        "mem_util_pct": 22.0,  # (5×41 + 5×3) / 10
        "mem_used_bytes": 61000 * MIB,  # FB_USED is MiB
        "power_w": 396.35,  # (5×612.5 + 5×180.2) / 10
        "energy_j": 4000.0,  # 10 counter deltas × 400 J (not the power readings' 3963.5 J)
        "temp_c": 69,
        "sm_clock_mhz": 1695,  # (5×1980 + 5×1410) / 10
        "throttle_s": {
            "power_cap": 3,  # seconds 0, 1, 6
            "thermal": 2,  # 6 (SW thermal), 8 (HW thermal)
            "hw_slowdown": 1,  # 7
            "other": 1,  # 9 (sync boost)
            "any": 6,  # second 5 is GPU-idle only: no throttle
        },
        "sm_active": 0.225,  # (5×0.40 + 5×0.05) / 10
        "sm_occupancy": 0.11,  # (5×0.20 + 5×0.02) / 10
        "tensor_active": 0.15,  # (5×0.30 + 5×0) / 10
        "dram_active": 0.13,  # (5×0.25 + 5×0.01) / 10
        "prof_s": 10,
    }
    idle = only(out, fx.H100_IDLE_UUID, START)
    assert {k: idle[k] for k in ("util_pct", "power_w", "energy_j", "temp_c")} == {
        "util_pct": 0.0,
        "power_w": 69.01,
        "energy_j": 690.12,  # 10 × 69.012 J
        "temp_c": 31,
    }
    # measured as zero is zero: the idle GPU's SMs did nothing, and that is said
    assert {k: idle[k] for k in PROF_KEYS} == {
        "sm_active": 0.0,
        "sm_occupancy": 0.0,
        "tensor_active": 0.0,
        "dram_active": 0.0,
        "prof_s": 10,
    }
    assert idle["throttle_s"]["any"] == 0 and idle["mem_used_bytes"] == 0
    total = (61000 + 20000 + 559) * MIB  # used + free + reserved: 81559 MiB, as nvidia-smi says
    assert agent.source.inventory() == [
        {
            "uuid": fx.H100_UUID,
            "index": 0,
            "name": "NVIDIA H100 80GB HBM3",
            "memory_total_bytes": total,
        },
        {
            "uuid": fx.H100_IDLE_UUID,
            "index": 1,
            "name": "NVIDIA H100 80GB HBM3",
            "memory_total_bytes": total,
        },
    ]
    assert agent.node_info()["driver_version"] == "560.35.03"


def test_a100_without_profiling_fields(exporter: FakeExporter) -> None:
    clock = VirtualClock(T0)
    serve(exporter, clock, a100_text)
    agent = agent_on(exporter, clock)
    out = run(agent, clock, T0, T0 + 10)
    assert only(out, fx.A100_UUID, START) == {
        "gpu": fx.A100_UUID,
        "start": START,
        "seconds": 10,
        "util_pct": 50.0,  # DCGM_FI_DEV_GPU_UTIL: (5×100 + 5×0) / 10
        "mem_util_pct": 30.0,
        "mem_used_bytes": 70000 * MIB,
        "power_w": 218.0,  # (5×350.5 + 5×85.5) / 10
        "energy_j": 3000.0,  # 10 × 300 J
        "temp_c": 70,  # GPU_TEMP (MEMORY_TEMP, here a "not supported" blank, is not read)
        "sm_clock_mhz": 810,  # (5×1410 + 5×210) / 10
        # DCGM_FI_DEV_CLOCK_THROTTLE_REASONS, the older name: SW power cap in seconds 0–4
        "throttle_s": {"power_cap": 5, "thermal": 0, "hw_slowdown": 0, "other": 0, "any": 5},
    }  # no profiling field at all, not zeros
    (inv,) = agent.source.inventory()
    assert inv["memory_total_bytes"] == (70000 + 11920) * MIB  # no FB_RESERVED: used + free
    assert inv["name"] == "NVIDIA A100-SXM4-80GB"
    assert "driver_version" not in agent.node_info()  # this exporter has no such label


def test_kubernetes_pod_labels_become_workloads_on_the_reading(exporter: FakeExporter) -> None:
    clock = VirtualClock(T0)
    serve(exporter, clock, k8s_text)
    source = DcgmSource(exporter.url, timeout_s=0.3)
    res = source.read(T0)
    assert not res.down and sorted(res.readings) == sorted(fx.L4_UUIDS)
    r0, r1, r2 = (res.readings[u] for u in fx.L4_UUIDS)
    assert r0.workloads == (Workload("k8s", "research/train-llm-0", account="research"),)
    assert r1.workloads == ()  # the exporter maps pods, and no pod holds GPU 1
    assert r2.workloads == (
        Workload("k8s", "inference/vllm-7d9f8b6c5-k2x4p", account="inference"),
        Workload("k8s", "inference/vllm-7d9f8b6c5-q8w2z", account="inference"),
    )
    # a GPU two pods share repeats each series per pod: its values count once
    assert (r2.util, r2.mem_used, r2.power_mw) == (30.0, 16000 * MIB, 40_000)
    assert (r0.util, r0.power_mw) == (73.0, 61_500)
    # bare metal (no pod labels at all): the source cannot tell
    serve(exporter, clock, h100_text)
    assert all(r.workloads is None for r in source.read(T0 + 1).readings.values())


def test_kubernetes_node_sends_who_held_each_gpu(exporter: FakeExporter) -> None:
    clock = VirtualClock(T0)
    serve(exporter, clock, k8s_text)
    out = run(agent_on(exporter, clock), clock, T0, T0 + 10)
    s0, s1, s2 = (only(out, u, START) for u in fx.L4_UUIDS)
    assert s2["util_pct"] == 30.0 and s2["power_w"] == 40.0
    assert "procs" not in s2  # dcgm-exporter has no process count
    # GPU 0: one pod all 10 s at 73 %: share 10 × 1 = 10 s, air 10 × 0.73 = 7.3 s
    assert s0["workloads"] == [
        {
            "kind": "k8s",
            "id": "research/train-llm-0",
            "account": "research",
            "share_s": 10.0,
            "air_s": 7.3,
        }
    ]
    # GPU 1: the exporter maps pods and none holds it: the key, empty (its time is parked)
    assert s1["workloads"] == []
    # GPU 2, time-sliced between two replicas at 30 %: each 10 × 1/2 = 5 s, air 10 × 0.3 / 2
    assert s2["workloads"] == [
        {
            "kind": "k8s",
            "id": f"inference/vllm-7d9f8b6c5-{x}",
            "account": "inference",
            "share_s": 5.0,
            "air_s": 1.5,
        }
        for x in ("k2x4p", "q8w2z")
    ]


def test_bare_metal_exporter_sends_no_workloads_key(exporter: FakeExporter) -> None:
    clock = VirtualClock(T0)
    serve(exporter, clock, h100_text)
    out = run(agent_on(exporter, clock), clock, T0, T0 + 10)
    assert out and all("workloads" not in s for s in out)  # the memory rule applies


MIG_GPU = 'gpu="0",UUID="GPU-aaaa",device="nvidia0",modelName="NVIDIA H100 80GB HBM3"'


def mig_text(now: int) -> str:
    """An H100 in MIG mode as dcgm-exporter answers it on Kubernetes: the GPU's power and
    energy without instance labels; per GPU instance (3g.40gb id 1, 2g.20gb id 5, 1g.10gb id
    13; one slice free) its graphics engine's activity, SM activity and framebuffer, labelled
    with the pod that holds it (the 1g.10gb none). The counter grows 300 J a second."""

    def inst(gi: int, profile: str, pod: str, ns: str) -> str:
        return f'{MIG_GPU},GPU_I_PROFILE="{profile}",GPU_I_ID="{gi}",pod="{pod}",namespace="{ns}"'

    gpu = f'{MIG_GPU},GPU_I_PROFILE="",GPU_I_ID="",pod="",namespace=""'
    rows = [
        ("3g.40gb", 1, "train-0", "team-a", "0.800000", "0.600000", 30000, 10448),
        ("2g.20gb", 5, "serve-0", "team-b", "0.100000", "0.050000", 8000, 12224),
        ("1g.10gb", 13, "", "", "0.000000", "0.000000", 0, 9856),
    ]
    lines = [
        "# TYPE DCGM_FI_DEV_POWER_USAGE gauge",
        f"DCGM_FI_DEV_POWER_USAGE{{{gpu}}} 300.000000",
        "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter",
        f"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{{gpu}}} {5_000_000_000 + 300_000 * (now - T0)}",
    ]
    for metric, k in (
        ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", 4),
        ("DCGM_FI_PROF_SM_ACTIVE", 5),
        ("DCGM_FI_DEV_FB_USED", 6),
        ("DCGM_FI_DEV_FB_FREE", 7),
    ):
        lines.append(f"# TYPE {metric} gauge")
        for row in rows:
            lines.append(f"{metric}{{{inst(row[1], row[0], row[2], row[3])}}} {row[k]}")
    return "\n".join(lines) + "\n"


def test_mig_instances_are_read_from_their_own_series() -> None:
    """Each GPU instance's values and pods are its own; the GPU's utilisation and SM activity
    are the instances' weighted by their slices of 7 (the free slice counts 0):
    util (3 × 80 + 2 × 10 + 1 × 0) / 7 = 37.142857 %, SM (3 × 60 + 2 × 5) / 7 = 27.142857 %."""
    from prometheus_client.parser import text_string_to_metric_families

    series, _ = parse(mig_text(T0), text_string_to_metric_families)
    r = reading(series["GPU-aaaa"], "GPU-aaaa")
    assert r.power_mw == 300_000
    assert r.util == pytest.approx(260 / 7) and r.sm_active_pct == pytest.approx(190 / 7)
    assert r.workloads is None and r.slices_total == 7  # the instances say who held them
    assert r.instances is not None
    got = [
        (i.instance.uuid, i.instance.gi, i.instance.profile, i.instance.slices) for i in r.instances
    ]
    assert got == [
        ("MIG-aaaa-1-3g.40gb", 1, "3g.40gb", 3),
        ("MIG-aaaa-5-2g.20gb", 5, "2g.20gb", 2),
        ("MIG-aaaa-13-1g.10gb", 13, "1g.10gb", 1),
    ]
    assert [i.instance.memory_mb for i in r.instances] == [40448, 20224, 9856]
    first, second, third = (i.reading for i in r.instances)
    assert (first.util, first.mem_used) == (pytest.approx(80.0), 30000 * MIB)
    assert first.workloads == (Workload("k8s", "team-a/train-0", account="team-a"),)
    assert second.workloads == (Workload("k8s", "team-b/serve-0", account="team-b"),)
    assert third.workloads == () and third.util == 0.0  # the exporter maps pods: nobody


def test_a_mig_gpu_through_the_exporter_sends_a_sample_per_instance(
    exporter: FakeExporter,
) -> None:
    """Ten seconds of the answer above through the agent: the GPU's sample (its energy, the
    slice-weighted utilisation; the pods holding 3/7 and 2/7 of it) and one per instance,
    each naming its GPU and instance, all as the server takes them; the inventory lists the
    instances."""
    from tests.agent.test_agent_shares import assert_server_accepts

    clock = VirtualClock(T0)
    serve(exporter, clock, mig_text)
    agent = agent_on(exporter, clock)
    out = run(agent, clock, T0, T0 + 10)
    by = {s.get("instance"): s for s in out if s["start"] == START}
    assert set(by) == {None, "MIG-aaaa-1-3g.40gb", "MIG-aaaa-5-2g.20gb", "MIG-aaaa-13-1g.10gb"}
    gpu = by[None]
    assert gpu["util_pct"] == pytest.approx(260 / 7, abs=0.01)
    assert gpu["energy_j"] == pytest.approx(3000.0)
    shares = {w["id"]: w["share_s"] for w in gpu["workloads"]}
    # 10 s × 3/7 and × 2/7, as the wire rounds them (3 decimals)
    assert shares == {"team-a/train-0": 4.286, "team-b/serve-0": 2.857}
    inst = by["MIG-aaaa-1-3g.40gb"]
    assert inst["gpu"] == "GPU-aaaa" and inst["util_pct"] == pytest.approx(80.0)
    assert [w["id"] for w in inst["workloads"]] == ["team-a/train-0"]
    for s in by.values():
        assert_server_accepts(s)
    (block,) = agent.source.inventory()
    assert block["mig_slices"] == 7
    assert [m["uuid"] for m in block["mig"]] == [
        "MIG-aaaa-1-3g.40gb",
        "MIG-aaaa-5-2g.20gb",
        "MIG-aaaa-13-1g.10gb",
    ]


def test_fields_are_matched_by_their_whole_name() -> None:
    from prometheus_client.parser import text_string_to_metric_families

    gpu = 'gpu="0",UUID="GPU-aaaa"'
    text = (
        "# HELP DCGM_FI_DEV_FB_USED_PERCENT Percentage used of Frame Buffer: 'Used/(Total)'.\n"
        "# TYPE DCGM_FI_DEV_FB_USED_PERCENT gauge\n"
        f"DCGM_FI_DEV_FB_USED_PERCENT{{{gpu}}} 0.75\n"
        "# TYPE DCGM_FI_DEV_FB_USED gauge\n"
        f"DCGM_FI_DEV_FB_USED{{{gpu}}} 100\n"
    )
    series, _ = parse(text, text_string_to_metric_families)
    assert series["GPU-aaaa"].values == {"DCGM_FI_DEV_FB_USED": 100.0}  # not the 0.75


# -- one summariser, two sources ---------------------------------------------------------------


def nvml_samples(gpus: list[FakeGpu], t0: int, t1: int, interval: int) -> list[dict[str, Any]]:
    from telemetry.agent.fake import FakeNvml

    clock = VirtualClock(t0)
    agent = Agent(FakeNvml(gpus, clock.time), spool_dir=None, interval_s=interval, clock=clock)
    return run(agent, clock, t0, t1)


def as_dcgm_says(s: dict[str, Any]) -> dict[str, Any]:
    """What the dcgm source sends where NVML sent ``s``: no process count, memory in whole
    MiB (FB_USED)."""
    d = {k: v for k, v in s.items() if k != "procs"}
    if "mem_used_bytes" in d:
        d["mem_used_bytes"] = d["mem_used_bytes"] // MIB * MIB
    return d


def test_the_same_gpu_read_through_nvml_and_through_the_exporter(
    exporter: FakeExporter,
) -> None:
    gpu = ScriptedGpu(U1, 0, H100, script, energy=counter, prof=prof)
    clock = VirtualClock(T0)
    serve_gpus(exporter, clock, [gpu])
    via_dcgm = only(run(agent_on(exporter, clock), clock, T0, T0 + 10), U1, START)
    via_nvml = only(nvml_samples([gpu], T0, T0 + 10, 10), U1, START)
    assert via_nvml == {**FULL, **PROF_FULL}  # test_agent_gpm's hand-computed figures
    assert via_dcgm == as_dcgm_says(via_nvml)
    assert via_dcgm["mem_used_bytes"] == 38146 * MIB  # 40 GB = 38146.97 MiB


def test_a_fleet_read_through_nvml_and_through_the_exporter_agree(
    exporter: FakeExporter,
) -> None:
    t0 = T0 + 3600
    fleet = FakeFleet(
        "nodes=1,gpus=4,model=H100,pattern=training|inference|notebook|batch,gpm=1,"
        "power_throttle=1",
        seed=5,
        epoch=t0,
    )
    gpus = fleet.node(fleet.nodes[0]).gpus
    clock = VirtualClock(t0)
    serve_gpus(exporter, clock, gpus)
    agent = Agent(DcgmSource(exporter.url, timeout_s=0.3), spool_dir=None, clock=clock)
    via_dcgm = [s for s in run(agent, clock, t0, t0 + 600) if s["seconds"] == 60]
    via_nvml = [s for s in nvml_samples(gpus, t0, t0 + 600, 60) if s["seconds"] == 60]
    key = lambda s: (s["start"], s["gpu"])  # noqa: E731
    assert len(via_dcgm) == 4 * 10
    assert sorted(via_dcgm, key=key) == sorted(map(as_dcgm_says, via_nvml), key=key)
    assert any(s["throttle_s"]["power_cap"] for s in via_dcgm)
    assert any(s["sm_active"] > 0.3 for s in via_dcgm)


# -- the scrape loop: an exporter that hangs, fails, goes away, resets, loses a GPU -------------


def test_a_hanging_exporter_costs_those_seconds_never_zeros(
    exporter: FakeExporter, caplog: pytest.LogCaptureFixture
) -> None:
    gpu = ScriptedGpu(U1, 0, H100, script, energy=counter, prof=prof)
    clock = VirtualClock(T0)
    serve_gpus(exporter, clock, [gpu])
    agent = agent_on(exporter, clock)
    with caplog.at_level(logging.INFO, logger="gpufleet.agent"):
        out = run(agent, clock, T0, T0 + 2)
        exporter.mode = "hang"  # the ticks at T0+3, 4, 5 get no answer within 0.3 s
        began = time.monotonic()
        out += run(agent, clock, T0 + 3, T0 + 5)
        hung = time.monotonic() - began
        exporter.mode = "ok"
        out += run(agent, clock, T0 + 6, T0 + 10)
    s = only(out, U1, START)
    # seconds 2, 3, 4 are missing: 0, 1 (80 %, 400 W) and 5–9 (20 %, 200 W) remain
    assert s["seconds"] == 7
    assert s["util_pct"] == 37.14  # (2×80 + 5×20) / 7
    assert s["power_w"] == 257.14  # (2×400 + 5×200) / 7
    # counter deltas for 0, 1, 6–9 (6 × 450 J); second 5 has no reading one second before it,
    # so it counts its power, 200 J
    assert s["energy_j"] == 2900.0
    assert s["sm_clock_mhz"] == 1637  # (2×1980 + 5×1500) / 7 = 1637.1
    assert s["throttle_s"] == {
        "power_cap": 2,
        "thermal": 1,
        "hw_slowdown": 1,
        "other": 0,
        "any": 3,
    }
    assert {k: s[k] for k in PROF_KEYS} == {
        "sm_active": 0.3143,  # (2×60 + 5×20) / 7
        "sm_occupancy": 0.1571,  # (2×30 + 5×10) / 7
        "tensor_active": 0.1143,  # (2×40 + 5×0) / 7
        "dram_active": 0.2143,  # (2×50 + 5×10) / 7
        "prof_s": 7,
    }
    assert hung < 3 * 0.3 + 2.0  # each hung scrape gave up at its timeout (generous bound)
    msgs = [r.getMessage() for r in caplog.records if "dcgm-exporter at" in r.getMessage()]
    assert len(msgs) == 2, msgs
    assert "did not answer" in msgs[0] and "offline" in msgs[0]
    assert "answers again after 3 missed seconds" in msgs[1]


def test_an_exporter_that_is_gone_makes_the_gpus_offline_not_idle(
    exporter: FakeExporter,
) -> None:
    gpu = ScriptedGpu(U1, 0, H100, script, energy=counter)
    clock = VirtualClock(T0)
    serve_gpus(exporter, clock, [gpu])
    agent = agent_on(exporter, clock)
    out = run(agent, clock, T0, T0 + 9)
    exporter.down()  # stopped: the kept-alive connection is closed, new ones are refused
    out += run(agent, clock, T0 + 10, T0 + 29)
    exporter.up()
    out += run(agent, clock, T0 + 30, T0 + 40)
    starts = sorted({s["start"] for s in out if s["gpu"] == U1})
    # [T0, +10) has seconds 0–8; [+10, +20) nothing at all (offline, no sample to say 0 %);
    # [+20, +30) only second 29; [+30, +40) whole again
    assert starts == [
        "2026-11-30T08:59:50Z",
        START,
        "2026-11-30T09:00:20Z",
        "2026-11-30T09:00:30Z",
    ]
    seconds = {s["start"]: s["seconds"] for s in out}
    assert seconds[START] == 9 and seconds["2026-11-30T09:00:20Z"] == 1
    assert seconds["2026-11-30T09:00:30Z"] == 10
    assert agent.source.inventory()[0].get("status") is None  # away is not lost


@pytest.mark.parametrize("answer", ["500", "bad line", "html", "no GPU"])
def test_an_answer_that_says_nothing_about_the_gpus_is_a_missing_second(
    exporter: FakeExporter, answer: str, caplog: pytest.LogCaptureFixture
) -> None:
    gpu = ScriptedGpu(U1, 0, H100, script, energy=counter)
    clock = VirtualClock(T0)
    good = lambda now: exposition([gpu], now)  # noqa: E731
    bad = {
        # a value that is no number, in a field the agent reads
        "bad line": lambda now: re.sub(r"(DCGM_FI_DEV_GPU_UTIL\{.*\}) \d+", r"\1 N/A", good(now)),
        "html": lambda now: "<html><body>502 Bad Gateway</body></html>\n",
        "no GPU": lambda now: "# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).\n",
        "500": good,
    }[answer]
    serve(exporter, clock, lambda now: bad(now) if now == T0 + 5 else good(now))
    agent = agent_on(exporter, clock)
    with caplog.at_level(logging.WARNING, logger="gpufleet.agent"):
        out = run(agent, clock, T0, T0 + 4)
        exporter.mode = "500" if answer == "500" else "ok"
        out += run(agent, clock, T0 + 5, T0 + 5)
        exporter.mode = "ok"
        out += run(agent, clock, T0 + 6, T0 + 10)
    s = only(out, U1, START)
    assert s["seconds"] == 9  # second 4 is missing, not 0 %
    assert s["util_pct"] == 46.67  # (4×80 + 5×20) / 9
    assert s["energy_j"] == 3800.0  # 8 deltas × 450 J + second 5 at its power, 200 J
    msgs = [r.getMessage() for r in caplog.records if "did not answer" in r.getMessage()]
    assert len(msgs) == 1
    why = {"500": "HTTP 500", "bad line": "N/A", "html": "without any GPU"}
    assert why.get(answer, "without any GPU") in msgs[0]


def test_an_exporter_restart_between_two_scrapes_costs_nothing(
    exporter: FakeExporter, caplog: pytest.LogCaptureFixture
) -> None:
    gpu = ScriptedGpu(U1, 0, H100, script, energy=counter)
    clock = VirtualClock(T0)
    serve_gpus(exporter, clock, [gpu])
    agent = agent_on(exporter, clock)
    with caplog.at_level(logging.WARNING, logger="gpufleet.agent"):
        out = run(agent, clock, T0, T0 + 4)
        exporter.down()  # closes the connection the source keeps alive …
        exporter.up()  # … and is back before the next scrape
        out += run(agent, clock, T0 + 5, T0 + 10)
    assert only(out, U1, START)["seconds"] == 10
    assert not [r for r in caplog.records if "did not answer" in r.getMessage()]


def test_an_energy_counter_reset_falls_back_to_power_for_that_interval(
    exporter: FakeExporter,
) -> None:
    def reloading(t: int) -> int:
        return counter(t) if t < T0 + 5 else 450_000 * (t - (T0 + 5))

    gpu = ScriptedGpu(U1, 0, H100, script, energy=reloading)
    clock = VirtualClock(T0)
    serve_gpus(exporter, clock, [gpu])
    out = run(agent_on(exporter, clock), clock, T0, T0 + 20)
    assert only(out, U1, START)["energy_j"] == 3000.0  # mean power 300 W × 10 s
    assert only(out, U1, START2)["energy_j"] == 4500.0  # the new counter, 10 × 450 J


def test_blank_values_are_not_read(exporter: FakeExporter) -> None:
    # the exporter says "not supported" (DCGM_INT64_BLANK + 2) for the energy counter and
    # DCGM_FP64_BLANK for the power: energy falls back to … nothing to fall back to
    def text(now: int) -> str:
        return (
            exposition([ScriptedGpu(U1, 0, H100, script, energy=counter)], now)
            .replace(f"{counter(now)}\n", "9223372036854775794\n")
            .replace("400.000\n", "140737488355328.000\n")
        )

    clock = VirtualClock(T0)
    serve(exporter, clock, text)
    s = only(run(agent_on(exporter, clock), clock, T0, T0 + 10), U1, START)
    # power is read in seconds 5–9 only (200 W); the blank seconds 0–4 are not 140 TW
    assert s["power_w"] == 200.0
    assert s["energy_j"] == 2000.0  # no counter: mean power 200 W × 10 s
    assert s["util_pct"] == 50.0


def test_a_gpu_gone_from_the_answer_is_lost_and_may_come_back(
    exporter: FakeExporter, caplog: pytest.LogCaptureFixture
) -> None:
    a = ScriptedGpu(U1, 0, H100, script, energy=counter)
    b = ScriptedGpu(U2, 1, H100, script, energy=counter)
    clock = VirtualClock(T0)
    # GPU 1 is missing from the answers at T0+5 … T0+14
    serve(
        exporter,
        clock,
        lambda now: exposition([a] if T0 + 5 <= now < T0 + 15 else [a, b], now),
    )
    agent = agent_on(exporter, clock)
    with caplog.at_level(logging.INFO, logger="gpufleet.agent"):
        out = run(agent, clock, T0, T0 + 12)
        inv = {g["uuid"]: g for g in agent.source.inventory()}
        out += run(agent, clock, T0 + 13, T0 + 20)
    assert inv[U2]["status"] == "lost" and "status" not in inv[U1]
    assert only(out, U1, START) == as_dcgm_says(FULL)
    lost = only(out, U2, START)
    # ticks T0+1 … T0+4 read seconds 0–3: 4 seconds at 80 %, 400 W, 450 J/s; closed at once
    assert (lost["seconds"], lost["util_pct"], lost["energy_j"]) == (4, 80.0, 1800.0)
    back = only(out, U2, START2)
    # back at the tick T0+15 (second 14): seconds 14–19; second 14 has no counter baseline
    # one second earlier, so it counts its power (a busy second, 400 W), the rest 450 J each
    assert back["seconds"] == 6
    assert back["energy_j"] == 400.0 + 5 * 450.0
    assert "status" not in {g["uuid"]: g for g in agent.source.inventory()}[U2]
    msgs = [r.getMessage() for r in caplog.records if U2 in r.getMessage()]
    assert sum("gone from dcgm-exporter" in m for m in msgs) == 1
    assert sum("is back" in m for m in msgs) == 1


# -- the command line ---------------------------------------------------------------------------


def cli(*args: str, pre: str = "") -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUFLEET_")}
    code = f"import sys; {pre}from telemetry.agent.cli import main; sys.exit(main({list(args)!r}))"
    return subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )


def test_once_print_from_an_exporter(exporter: FakeExporter) -> None:
    gpus: list[FakeGpu] = [
        ScriptedGpu(U1, 0, H100, script, prof=prof),
        ScriptedGpu(U2, 1, H100, script),
    ]
    exporter.body = lambda: exposition(gpus, int(time.time()))
    r = cli("--source", "dcgm", "--dcgm-url", exporter.url, "--once", "--print", "--interval", "2")
    assert r.returncode == 0, r.stderr
    payload = json.loads(r.stdout)
    assert [g["uuid"] for g in payload["gpus"]] == [U1, U2]
    assert payload["node"]["driver_version"] == "550.54.15"
    by_gpu = {s["gpu"]: s for s in payload["samples"]}
    assert set(by_gpu) == {U1, U2}
    assert all(s["seconds"] == 2 for s in by_gpu.values())
    assert by_gpu[U1]["prof_s"] == 2 and not PROF_KEYS & set(by_gpu[U2])


def test_once_print_without_an_exporter_says_so() -> None:
    url = "http://127.0.0.1:9/metrics"  # the discard port: nothing listens
    r = cli("--source", "dcgm", "--dcgm-url", url, "--once", "--print", "--interval", "1")
    assert r.returncode == 1
    assert "dcgm-exporter at http://127.0.0.1:9/metrics did not answer" in r.stderr
    assert "Traceback" not in r.stderr


def test_without_prometheus_client_nvml_works_and_dcgm_says_what_to_install() -> None:
    block = "sys.modules['prometheus_client'] = None; "  # import prometheus_client fails
    r = cli("--source", "dcgm", "--once", "--print", pre=block)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "gpufleet-agent: --source dcgm needs prometheus-client: pip install 'gpufleet[agent]' "
        "(or pip install prometheus-client)"
    ]
    r = cli("--fake", "small", "--once", "--print", "--interval", "10", pre=block)
    assert r.returncode == 0, r.stderr
    assert len(json.loads(r.stdout)["samples"]) == 2


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--source", "dcgm", "--dcgm-url", "ftp://x/metrics", "--once", "--print"], "http(s)"),
        (["--source", "dcgm", "--fake", "small", "--once", "--print"], "--fake simulates NVML"),
    ],
)
def test_bad_dcgm_flags_exit_2_with_one_line(args: list[str], message: str) -> None:
    r = cli(*args)
    assert r.returncode == 2
    assert message in r.stderr and len(r.stderr.strip().splitlines()) == 1
