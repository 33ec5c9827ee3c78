"""The fake fleet: spec, determinism, the wire format of simulate(), and agreement between the
tick-by-tick agent on FakeNvml and the closed-form simulator."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pynvml
import pytest

from telemetry.agent.agent import Agent
from telemetry.agent.clock import VirtualClock
from telemetry.agent.fake import (
    MODELS,
    FakeFleet,
    PatternGpu,
    make_uuid,
    parse_spec,
    simulate,
)

T0 = 1796029200  # 2026-11-30T09:00:00Z, a Monday
UUID_RE = re.compile(r"^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
ISO_RE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")
REAL_NAMES = {
    "NVIDIA H100 80GB HBM3",
    "NVIDIA H100 PCIe",
    "NVIDIA H200",
    "NVIDIA A100-SXM4-80GB",
    "NVIDIA A100 80GB PCIe",
    "NVIDIA L40S",
    "NVIDIA L4",
    "NVIDIA A40",
    "NVIDIA GeForce RTX 4090",
    "NVIDIA RTX 6000 Ada Generation",
}


def test_compact_and_dict_specs_agree() -> None:
    compact = (
        "nodes=2,gpus=4,model=H100,pattern=training,power_throttle=1;"
        "nodes=1,gpus=8,model=L40S,pattern=inference,site=ams1,falls_off_bus=0.3@+36h,"
        "energy_reset=+2d,unsupported=energy|memory_v2"
    )
    as_dict = {
        "groups": [
            {
                "nodes": 2,
                "gpus": 4,
                "model": "H100",
                "pattern": "training",
                "faults": {"power_throttle": [0]},
            },
            {
                "nodes": 1,
                "gpus": 8,
                "model": "L40S",
                "pattern": "inference",
                "site": "ams1",
                "faults": {
                    "falls_off_bus": {"node": 0, "gpu": 3, "at": "+36h"},
                    "energy_reset": {"node": 0, "at": "+2d"},
                    "unsupported": ["energy", "memory_v2"],
                },
            },
        ]
    }
    a = FakeFleet(compact, seed=4, epoch=T0)
    b = FakeFleet(as_dict, seed=4, epoch=T0)
    assert a.nodes == b.nodes == ["gpu-fra1-01", "gpu-fra1-02", "gpu-ams1-01"]
    for h in a.nodes:
        ga, gb = a.node(h).gpus, b.node(h).gpus
        assert [g.uuid for g in ga] == [g.uuid for g in gb]
        assert [g.lost_at for g in ga] == [g.lost_at for g in gb]
    ams = a.node("gpu-ams1-01").gpus
    assert ams[3].lost_at == T0 + 36 * 3600 and ams[0].lost_at is None
    assert ams[0].resets == [T0 + 2 * 86400]
    assert ams[0].unsupported == {"energy", "memory_v2"}
    fra = [a.node(h).gpus[0] for h in ("gpu-fra1-01", "gpu-fra1-02")]
    assert [isinstance(g, PatternGpu) and g.power_throttle for g in fra] == [True, False]


def test_json_text_spec_and_errors() -> None:
    assert parse_spec('[{"nodes": 1, "gpus": 2, "model": "a100"}]')[0].model == "a100"
    with pytest.raises(ValueError, match="unknown GPU model"):
        FakeFleet("model=V99")
    with pytest.raises(ValueError, match="unknown pattern"):
        FakeFleet("pattern=crypto")
    with pytest.raises(ValueError, match="unknown fleet spec key"):
        FakeFleet("nodes=1,colour=red")


def test_fleet_is_deterministic_with_real_names_and_uuids() -> None:
    a = FakeFleet("demo", seed=7, epoch=T0)
    b = FakeFleet("demo", seed=7, epoch=T0)
    c = FakeFleet("demo", seed=8, epoch=T0)
    gpus = [g for h in a.nodes for g in a.node(h).gpus]
    assert len(gpus) == 64 and len(a.nodes) == 8
    assert all(UUID_RE.match(g.uuid) for g in gpus)
    assert len({g.uuid for g in gpus}) == 64
    assert {g.model.name for g in gpus} <= REAL_NAMES
    assert all(re.match(r"^gpu-[a-z0-9]+-\d\d$", h) for h in a.nodes)
    assert [g.uuid for h in b.nodes for g in b.node(h).gpus] == [g.uuid for g in gpus]
    assert not {g.uuid for h in c.nodes for g in c.node(h).gpus} & {g.uuid for g in gpus}
    assert make_uuid(7, 0) == gpus[0].uuid


def test_power_figures_follow_the_catalogue() -> None:
    h100 = MODELS["H100"]
    # fleet/catalogue.py: H100 SXM 700 W max, ≈69 W idle, ≈629 W under load
    assert (h100.max_w, h100.idle_w, h100.load_w) == (700, 69, 629)
    fleet = FakeFleet("nodes=1,gpus=1,model=H100,pattern=parked", epoch=T0)
    g = fleet.node(fleet.nodes[0]).gpus[0]
    s = g.window(T0, T0 + 3600)
    assert s is not None
    # parked: idle power with ±1 % noise
    assert 69 * 0.99 <= s["power_w"] <= 69 * 1.01
    assert s["procs"] == 0 and s["util_pct"] == 0.0


def collect(payloads: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    return [s for _, p in payloads for s in p["samples"]]


def test_simulate_wire_format_and_order() -> None:
    start = datetime(2026, 11, 30, 0, 0, tzinfo=UTC)
    end = start + timedelta(hours=3)
    out = list(simulate("demo", start=start, end=end, interval_s=60, seed=1))
    # 8 nodes × 180 minutes, one payload each; 64 GPUs × 180 samples
    assert len(out) == 8 * 180
    samples = collect(out)
    assert len(samples) == 64 * 180
    starts = [s["start"] for s in samples]
    assert starts == sorted(starts)  # chronological
    host, p = out[0]
    assert set(p) == {"node", "gpus", "samples"}
    assert p["node"]["hostname"] == host
    assert {g["name"] for g in p["gpus"]} <= REAL_NAMES
    allowed = {
        "gpu",
        "start",
        "seconds",
        "util_pct",
        "mem_util_pct",
        "mem_used_bytes",
        "procs",
        "power_w",
        "energy_j",
        "temp_c",
        "sm_clock_mhz",
        "throttle_s",
    }
    for s in samples:
        assert set(s) <= allowed and {"gpu", "start", "seconds", "util_pct"} <= set(s)
        assert ISO_RE.match(s["start"]) and s["start"].endswith(":00Z")
        assert s["seconds"] == 60
        assert 0 <= s["util_pct"] <= 100 and 0 <= s["mem_util_pct"] <= 100
        assert 0 <= s["power_w"] <= 5000 and s["energy_j"] >= 0
        numbers = [v for k, v in s.items() if k not in ("gpu", "start", "throttle_s")]
        assert all(isinstance(v, int | float) and v == v for v in numbers)  # no null, no NaN
        assert all(0 <= v <= s["seconds"] for v in s["throttle_s"].values())
        assert set(s["throttle_s"]) == {"power_cap", "thermal", "hw_slowdown", "other", "any"}


def test_simulate_batches_and_five_minute_intervals_stay_inside_hours() -> None:
    start = datetime(2026, 11, 30, 0, 2, tzinfo=UTC)  # not aligned: rounded up to 00:05
    end = start + timedelta(hours=2)
    out = list(simulate("small", start=start, end=end, interval_s=300, seed=3, batch_intervals=6))
    samples = collect(out)
    # [00:05, 02:00) has 23 whole 5-minute intervals; 2 GPUs; batches of 6 intervals
    assert len(samples) == 2 * 23
    assert [len(p["samples"]) for _, p in out] == [12, 12, 12, 10]
    assert samples[0]["start"] == "2026-11-30T00:05:00Z"
    for s in samples:
        t = datetime.fromisoformat(s["start"].replace("Z", "+00:00"))
        assert (t.minute * 60 + t.second) % 300 == 0
        assert (t.minute * 60 + t.second + s["seconds"]) <= 3600  # never crosses the hour


def test_simulate_is_deterministic_and_models_the_patterns() -> None:
    start = datetime(2026, 11, 30, tzinfo=UTC)
    end = start + timedelta(days=2)
    spec = (
        "nodes=1,gpus=4,model=H100,pattern=training;nodes=1,gpus=4,model=H200,pattern=inference;"
        "nodes=1,gpus=2,model=A100,pattern=batch;nodes=1,gpus=2,model=RTX4090,pattern=notebook;"
        "nodes=1,gpus=2,model=L4,pattern=parked"
    )
    a = collect(list(simulate(spec, start=start, end=end, seed=5)))
    assert a == collect(list(simulate(spec, start=start, end=end, seed=5)))
    fleet = FakeFleet(spec, seed=5, epoch=start)
    by_pattern: dict[str, list[dict[str, Any]]] = {}
    pattern_of = {
        g.uuid: g.pattern
        for h in fleet.nodes
        for g in fleet.node(h).gpus
        if isinstance(g, PatternGpu)
    }
    for s in a:
        by_pattern.setdefault(pattern_of[s["gpu"]], []).append(s)

    def mean_util(p: str) -> float:
        return sum(s["util_pct"] for s in by_pattern[p]) / len(by_pattern[p])

    assert mean_util("training") > 60
    assert 15 < mean_util("inference") < 50
    assert mean_util("batch") < 25 and max(s["util_pct"] for s in by_pattern["batch"]) >= 85
    assert mean_util("notebook") < 5
    # notebooks hold the GPU without computing: procs > 0 at 0 % most of the time
    nb_held = [s for s in by_pattern["notebook"] if s["util_pct"] == 0 and s["procs"] > 0]
    assert len(nb_held) > 0.9 * len(by_pattern["notebook"])
    assert all(s["util_pct"] == 0 and s["procs"] == 0 for s in by_pattern["parked"])
    # inference peaks in the afternoon (UTC) and is quiet at night
    day = [s["util_pct"] for s in by_pattern["inference"] if s["start"][11:13] == "14"]
    night = [s["util_pct"] for s in by_pattern["inference"] if s["start"][11:13] == "02"]
    assert sum(day) / len(day) > 2 * sum(night) / len(night)


def test_faults_in_simulate() -> None:
    start = datetime(2026, 11, 30, tzinfo=UTC)
    spec = (
        "nodes=2,gpus=2,model=H100,pattern=training,power_throttle=1,"
        "falls_off_bus=1.1@+1h30m,energy_reset=0@+20m"
    )
    with pytest.raises(ValueError):
        FakeFleet(spec)  # "+1h30m" is not a duration this format knows
    spec = spec.replace("+1h30m", "+90m")
    out = list(simulate(spec, start=start, end=start + timedelta(hours=3), seed=2))
    fleet = FakeFleet(spec, seed=2, epoch=start)
    n1, n2 = (fleet.node(h).gpus for h in fleet.nodes)
    samples = collect(out)
    lost = [s for s in samples if s["gpu"] == n2[1].uuid]
    assert len(lost) == 90 and lost[-1]["start"] == "2026-11-30T01:29:00Z"
    last_inv = [p["gpus"] for h, p in out if h == fleet.nodes[1]][-1]
    assert [g.get("status") for g in last_inv] == [None, "lost"]
    # the throttling node hits its power cap (0.75 × 700 W = 525 W) under load; the other not
    throttled = [s for s in samples if s["gpu"] in (n1[0].uuid, n1[1].uuid)]
    free = [s for s in samples if s["gpu"] in (n2[0].uuid, n2[1].uuid)]
    assert any(s["throttle_s"]["power_cap"] >= 30 for s in throttled)
    assert max(s["power_w"] for s in throttled) <= 527.0  # cap + 2 W of jitter at most
    assert all(s["throttle_s"]["power_cap"] == 0 for s in free)


def tick_path(
    fleet: FakeFleet, host: str, t_from: int, t_to: int, interval: int, *, workloads: bool = False
) -> list[dict[str, Any]]:
    """The agent ticking every second over the node's fake NVML (``workloads``: with the fake's
    own process table and allocations, as the CLI wires them)."""
    clock = VirtualClock(t_from)
    api = fleet.backend(host, clock.time)
    discovery = api.discovery() if workloads else None
    agent = Agent(api, spool_dir=None, interval_s=interval, clock=clock, workloads=discovery)
    out: list[dict[str, Any]] = []
    for t in range(t_from, t_to + 1):
        clock.set(t + 0.003)
        out.extend(agent.tick(t))
    return out


@pytest.mark.parametrize(
    ("start_hms", "minutes", "interval"),
    [((1, 0), 90, 60), ((13, 55), 20, 10), ((10, 0), 30, 300)],
)
def test_tick_path_matches_simulator(
    start_hms: tuple[int, int], minutes: int, interval: int
) -> None:
    """The real collector and summariser ticking every second over FakeNvml give exactly the
    samples simulate() computes in closed form: two independent paths, one answer."""
    t0 = T0 - 9 * 3600 + start_hms[0] * 3600 + start_hms[1] * 60
    # one node, one GPU per pattern (two training, one of them on the power-throttled node)
    spec = {
        "nodes": 1,
        "gpus": 6,
        "model": "H100",
        "pattern": ["training", "training", "inference", "batch", "notebook", "parked"],
        "power_throttle": 1,
    }
    flat = FakeFleet(spec, seed=11, epoch=t0)
    gpus = flat.node(flat.nodes[0]).gpus
    ticked = tick_path(flat, flat.nodes[0], t0, t0 + minutes * 60, interval)
    # drop the 1-second sample for the interval before t0 (see test_agent_collect)
    ticked = [s for s in ticked if s["seconds"] == interval]
    sim = [
        s
        for _, p in simulate(
            flat,
            start=datetime.fromtimestamp(t0, UTC),
            end=datetime.fromtimestamp(t0 + minutes * 60, UTC),
            interval_s=interval,
        )
        for s in p["samples"]
    ]
    key = lambda s: (s["start"], s["gpu"])  # noqa: E731
    assert len(sim) == len(gpus) * minutes * 60 // interval
    assert sorted(ticked, key=key) == sorted(sim, key=key)
    # the window is not trivial: something computed and something throttled
    assert any(s["util_pct"] > 50 for s in sim)


def test_tick_path_matches_simulator_through_faults() -> None:
    t0 = T0
    spec = (
        "nodes=1,gpus=3,model=H100,pattern=training,power_throttle=1,"
        "falls_off_bus=0.1@+7m30s,energy_reset=+12m,unsupported=energy"
    )
    with pytest.raises(ValueError):
        FakeFleet(spec, epoch=t0)
    spec = spec.replace("+7m30s", "+450s")
    fleet = FakeFleet(spec, seed=2, epoch=t0)
    host = fleet.nodes[0]
    ticked = [s for s in tick_path(fleet, host, t0, t0 + 1200, 60) if s["start"] >= "2026-11-30T09"]
    sim = [
        s
        for _, p in simulate(
            FakeFleet(spec, seed=2, epoch=t0),
            start=datetime.fromtimestamp(t0, UTC),
            end=datetime.fromtimestamp(t0 + 1200, UTC),
        )
        for s in p["samples"]
    ]
    key = lambda s: (s["start"], s["gpu"])  # noqa: E731
    assert sorted(ticked, key=key) == sorted(sim, key=key)
    lost = [s for s in sim if s["gpu"] == fleet.node(host).gpus[1].uuid]
    # lost at +450 s: minutes 0–6 whole, minute 7 has 30 seconds, nothing after
    assert [s["seconds"] for s in lost] == [60] * 7 + [30]


def test_fake_raises_real_pynvml_errors() -> None:
    clock = VirtualClock(T0)
    fleet = FakeFleet("nodes=1,gpus=1,model=L4,pattern=parked,falls_off_bus=+10s", epoch=T0)
    api = fleet.backend(fleet.nodes[0], clock.time)
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        api.nvmlDeviceGetCount()
    api.nvmlInit()
    h = api.nvmlDeviceGetHandleByIndex(0)
    assert api.nvmlDeviceGetName(h) == "NVIDIA L4"
    # parked: no kernel ran, so no utilisation sample since the cursor
    with pytest.raises(pynvml.NVMLError_NotFound) as e:
        api.nvmlDeviceGetSamples(h, pynvml.NVML_GPU_UTILIZATION_SAMPLES, 0)
    assert e.value.value == pynvml.NVML_ERROR_NOT_FOUND
    mem = api.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
    assert isinstance(mem, pynvml.c_nvmlMemory_v2_t) and mem.total == 23034 * 1024 * 1024
    clock.set(T0 + 11)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        api.nvmlDeviceGetPowerUsage(h)
    api.outage(T0 + 20, T0 + 30)
    clock.set(T0 + 25)
    with pytest.raises(pynvml.NVMLError_DriverNotLoaded):
        api.nvmlInit()
