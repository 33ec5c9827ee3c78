"""Tick path: scripted fake GPUs → the exact summaries, worked out by hand.

Every test uses 10-second intervals starting at T0 = 2026-11-30T09:00:00Z (1796029200). The
agent ticks at whole seconds; the tick at t reads the second [t-1, t). Ticking from T0 to
T0+10 therefore covers seconds T0 … T0+9 of the interval (the tick at T0 reads second T0-1,
which belongs to the previous interval, and gives the energy counter its baseline).
"""

from __future__ import annotations

import logging
from typing import Any

import pynvml
import pytest

from telemetry.agent.agent import Agent
from telemetry.agent.clock import VirtualClock
from telemetry.agent.fake import MODELS, FakeGpu, FakeNvml, ScriptedGpu
from telemetry.agent.summarise import Summariser

T0 = 1796029200
START = "2026-11-30T09:00:00Z"
START2 = "2026-11-30T09:00:10Z"
U1 = "GPU-11111111-1111-1111-1111-111111111111"
U2 = "GPU-22222222-2222-2222-2222-222222222222"
H100 = MODELS["H100"]

POWER = pynvml.nvmlClocksThrottleReasonSwPowerCap
SW_THERMAL = pynvml.nvmlClocksThrottleReasonSwThermalSlowdown
HW_SLOW = pynvml.nvmlClocksThrottleReasonHwSlowdown
HW_BRAKE = pynvml.nvmlClocksThrottleReasonHwPowerBrakeSlowdown
SYNC_BOOST = pynvml.nvmlClocksThrottleReasonSyncBoost
IDLE = pynvml.nvmlClocksThrottleReasonGpuIdle

# second within the interval → clocks-event bits
BITS = {0: POWER, 1: POWER | SW_THERMAL, 2: HW_SLOW, 3: SYNC_BOOST, 4: IDLE, 5: IDLE | HW_BRAKE}


def script(t: int) -> tuple[int, int, int, int, int, int, int, int]:
    """Seconds 0–4 of each 10 s: 80 % util, 30 % mem util, 40 GB, 2 procs, 400 W, 1980 MHz;
    seconds 5–9: 20 %, 10 %, 30 GB, 1 proc, 200 W, 1500 MHz. Temperature 60 + second."""
    s = t % 10
    hi = s < 5
    return (
        80 if hi else 20,
        30 if hi else 10,
        40_000_000_000 if hi else 30_000_000_000,
        2 if hi else 1,
        400_000 if hi else 200_000,
        60 + s,
        1980 if hi else 1500,
        BITS.get(s, 0),
    )


def counter(t: int) -> int:
    """The energy counter grows 450 J every second, deliberately not the 400/200 W the power
    reading says, so a test can tell the counter from the power × time fallback."""
    return 5_000_000 + 450_000 * (t - T0 + 100)


def make(gpus: list[FakeGpu], interval: int = 10) -> tuple[Agent, VirtualClock, FakeNvml]:
    clock = VirtualClock(T0)
    api = FakeNvml(gpus, clock.time)
    agent = Agent(api, spool_dir=None, interval_s=interval, hostname="gpu-test-01", clock=clock)
    return agent, clock, api


def run(agent: Agent, clock: VirtualClock, t_from: int, t_to: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for t in range(t_from, t_to + 1):
        clock.set(t + 0.002)
        out.extend(agent.tick(t))
    return out


def only(samples: list[dict[str, Any]], gpu: str, start: str) -> dict[str, Any]:
    found = [s for s in samples if s["gpu"] == gpu and s["start"] == start]
    assert len(found) == 1, samples
    return found[0]


FULL = {
    "gpu": U1,
    "start": START,
    "seconds": 10,
    "util_pct": 50.0,  # (5×80 + 5×20) / 10
    "mem_util_pct": 20.0,  # (5×30 + 5×10) / 10
    "mem_used_bytes": 40_000_000_000,  # the most held during the interval (v2: no reserve)
    "procs": 2,  # the most processes seen
    "power_w": 300.0,  # (5×400 + 5×200) / 10
    "energy_j": 4500.0,  # 10 one-second counter deltas × 450 J
    "temp_c": 69,  # max of 60 … 69
    "sm_clock_mhz": 1740,  # (5×1980 + 5×1500) / 10
    "throttle_s": {
        "power_cap": 2,  # seconds 0, 1
        "thermal": 1,  # second 1
        "hw_slowdown": 2,  # second 2 (HW slowdown), second 5 (HW power brake)
        "other": 1,  # second 3 (sync boost)
        "any": 5,  # seconds 0, 1, 2, 3, 5; second 4 is only GPU-idle, which is no throttle
    },
}


def test_full_interval_exact() -> None:
    agent, clock, _ = make([ScriptedGpu(U1, 0, H100, script, energy=counter)])
    out = run(agent, clock, T0, T0 + 10)
    # the tick at T0 also produced a 1-second sample for [T0-10, T0): second T0-1 only
    assert [s["start"] for s in out] == ["2026-11-30T08:59:50Z", START]
    assert out[0]["seconds"] == 1
    assert out[1] == FULL


def test_inventory_and_node_info() -> None:
    agent, clock, _ = make([ScriptedGpu(U1, 0, H100, script, energy=counter)])
    run(agent, clock, T0, T0 + 1)
    assert agent.collector.inventory() == [
        {
            "uuid": U1,
            "index": 0,
            "name": "NVIDIA H100 80GB HBM3",
            "memory_total_bytes": 81559 * 1024 * 1024,
            "power_limit_w": 700.0,  # EnforcedPowerLimit 700000 mW
        }
    ]
    assert agent.node_info()["driver_version"] == "550.54.15"


def test_energy_counter_reset_falls_back_to_power_for_that_interval() -> None:
    def reloading(t: int) -> int:
        # the driver reloads at T0+5: the counter restarts from 0
        return counter(t) if t < T0 + 5 else 450_000 * (t - (T0 + 5))

    agent, clock, _ = make([ScriptedGpu(U1, 0, H100, script, energy=reloading)])
    out = run(agent, clock, T0, T0 + 20)
    first = only(out, U1, START)
    # the tick at T0+5 sees the counter go backwards → mean power × seconds = 300 W × 10 s
    assert first["energy_j"] == 3000.0
    assert first["power_w"] == 300.0
    # the next interval diffs the new counter again: 10 × 450 J
    assert only(out, U1, START2)["energy_j"] == 4500.0


def test_idle_gpu_not_found_means_zero_and_idle_bit_is_no_throttle() -> None:
    def idle(t: int) -> tuple[int, int, int, int, int, int, int, int]:
        return (0, 0, 0, 0, 69_000, 31, 345, IDLE)

    agent, clock, _ = make([ScriptedGpu(U1, 0, H100, idle)])
    s = only(run(agent, clock, T0, T0 + 10), U1, START)
    # no utilisation sample in the buffer → NVML answers NOT_FOUND → 0 %
    assert s["util_pct"] == 0.0
    assert s["procs"] == 0
    assert s["power_w"] == 69.0
    # the counter is the fake's running sum of power: 10 s × 69 W
    assert s["energy_j"] == 690.0
    assert s["throttle_s"] == {
        "power_cap": 0,
        "thermal": 0,
        "hw_slowdown": 0,
        "other": 0,
        "any": 0,
    }


def test_unsupported_fields_use_fallbacks(caplog: pytest.LogCaptureFixture) -> None:
    g = ScriptedGpu(
        U1,
        0,
        H100,
        script,
        energy=counter,
        unsupported=["util_samples", "energy", "memory_v2"],
        old_driver=True,  # no ClocksEventReasons, no v3 process list
    )
    agent, clock, api = make([g])
    with caplog.at_level(logging.INFO, logger="gpufleet.agent"):
        s = only(run(agent, clock, T0, T0 + 10), U1, START)
    expected = dict(FULL)
    # no energy counter: mean power × seconds = 300 W × 10 s (not the counter's 4,500 J)
    expected["energy_j"] = 3000.0
    # memory info v1 counts the driver's reserve as used: 40 GB + 81559 MiB / 160
    expected["mem_used_bytes"] = 40_000_000_000 + (81559 * 1024 * 1024) // 160
    # utilisation from nvmlDeviceGetUtilizationRates instead of samples: the same 50 %;
    # throttle reasons from the old nvmlDeviceGetCurrentClocksThrottleReasons: the same bits
    assert s == expected
    gpu = agent.collector.gpus[U1]
    assert not gpu.use_samples and not gpu.mem_v2 and not gpu.procs_v3 and not gpu.event_reasons
    assert "energy" in gpu.unsupported
    # each fallback is logged once, in one line, not every second
    msgs = [r.getMessage() for r in caplog.records]
    assert sum("energy not supported" in m for m in msgs) == 1
    assert any("utilisation samples unavailable" in m for m in msgs)


def test_unsupported_fields_are_omitted_never_null() -> None:
    g = ScriptedGpu(
        U1,
        0,
        H100,
        script,
        energy=counter,
        unsupported=["temperature", "sm_clock", "throttle", "procs", "power", "utilization"],
    )
    agent, clock, _ = make([g])
    s = only(run(agent, clock, T0, T0 + 10), U1, START)
    assert s == {
        "gpu": U1,
        "start": START,
        "seconds": 10,
        "util_pct": 50.0,  # from samples; the rates call (mem util) is unsupported
        "mem_used_bytes": 40_000_000_000,
        "energy_j": 4500.0,  # the counter needs no power reading
    }


def test_lost_gpu_is_marked_and_the_others_reported(caplog: pytest.LogCaptureFixture) -> None:
    # GPU 2 falls off the bus at T0+4: every call at a second after T0+4 raises GPU_IS_LOST.
    a = ScriptedGpu(U1, 0, H100, script, energy=counter)
    b = ScriptedGpu(U2, 1, H100, script, energy=counter, lost_at=T0 + 4)
    agent, clock, api = make([a, b])
    with caplog.at_level(logging.ERROR, logger="gpufleet.agent"):
        out = run(agent, clock, T0, T0 + 20)
    assert only(out, U1, START) == FULL
    assert only(out, U1, START2)["seconds"] == 10
    lost = only(out, U2, START)
    # ticks T0+1 … T0+4 read seconds T0 … T0+3: 4 seconds at 80 %, 400 W, 450 J/s
    assert lost["seconds"] == 4
    assert lost["util_pct"] == 80.0
    assert lost["power_w"] == 400.0
    assert lost["energy_j"] == 1800.0  # 4 × 450 J
    assert not [s for s in out if s["gpu"] == U2 and s["start"] == START2]
    inv = {g["uuid"]: g for g in agent.collector.inventory()}
    assert inv[U2]["status"] == "lost" and "status" not in inv[U1]
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and U2 in errors[0] and "lost" in errors[0]
    assert "\n" not in errors[0]


def test_driver_gone_reinitialises_with_backoff() -> None:
    g = ScriptedGpu(U1, 0, H100, script, energy=counter)
    agent, clock, api = make([g])
    api.outage(T0 + 3, T0 + 6)  # driver unloaded for three seconds
    out = run(agent, clock, T0, T0 + 10)
    s = only(out, U1, START)
    # tick T0+3 fails → retry in 1 s; tick T0+4 fails again → retry in 2 s (T0+6); tick T0+6
    # re-initialises and reads second T0+5. Seen: seconds 0, 1 (ticks T0+1, T0+2) and 5–9.
    assert s["seconds"] == 7
    assert s["util_pct"] == 37.14  # (2×80 + 5×20) / 7 = 260/7 = 37.142…
    assert s["power_w"] == 257.14  # (2×400 + 5×200) / 7 = 1800/7 = 257.142…
    # counter deltas for seconds 0, 1 and 6–9 (6 × 450 J); second 5 has no baseline one second
    # earlier, so it counts its power: 200 J. 2700 + 200 = 2900.
    assert s["energy_j"] == 2900.0
    assert agent.collector.up
    assert api.generation == 2  # initialised twice


def test_interval_must_divide_an_hour() -> None:
    with pytest.raises(ValueError):
        Summariser(7)
    for ok in (1, 10, 60, 300, 3600):
        Summariser(ok)


def test_intervals_never_cross_an_hour() -> None:
    s = Summariser(300)
    # 09:58:20 belongs to [09:55, 10:00); 10:00:00 starts a new interval
    assert s.align(T0 + 3600 - 100) == T0 + 3600 - 300
    assert s.align(T0 + 3600) == T0 + 3600


def test_gpu_without_any_utilisation_sends_nothing_and_says_why(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # a MIG instance: neither utilisation call is supported; util_pct is required on the wire
    mig = ScriptedGpu(U2, 1, H100, script, unsupported=["util_samples", "utilization"])
    agent, clock, _ = make([ScriptedGpu(U1, 0, H100, script, energy=counter), mig])
    with caplog.at_level(logging.ERROR, logger="gpufleet.agent"):
        out = run(agent, clock, T0, T0 + 20)
    assert {s["gpu"] for s in out} == {U1}
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "utilisation cannot be read" in errors[0] and U2 in errors[0]


def test_stuck_energy_counter_falls_back_to_power_and_logs_once_per_episode(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def stuck(t: int) -> int:
        # the counter stops at T0 and moves again (450 J/s) from T0+30
        if t < T0:
            return counter(t)
        return counter(T0) + 450_000 * max(0, t - (T0 + 30))

    agent, clock, _ = make([ScriptedGpu(U1, 0, H100, script, energy=stuck)])
    with caplog.at_level(logging.INFO, logger="gpufleet.agent"):
        out = run(agent, clock, T0, T0 + 40)
    starts = [f"2026-11-30T09:00:{s:02d}Z" for s in (0, 10, 20, 30)]
    # three intervals in which the counter did not move while the GPU drew 400/200 W: mean
    # power × seconds = 300 W × 10 s each (not 0 J); then the counter again, 10 × 450 J
    assert [only(out, U1, s)["energy_j"] for s in starts] == [3000.0, 3000.0, 3000.0, 4500.0]
    msgs = [r.getMessage() for r in caplog.records if "energy counter" in r.getMessage()]
    # one line when the episode starts, one when it ends, with its count; none per second
    assert len(msgs) == 2, msgs
    assert U1 in msgs[0] and "grew 0 J in 10 s" in msgs[0] and "3000 J" in msgs[0]
    assert "moves again; 3 intervals (30 s)" in msgs[1]


@pytest.mark.parametrize(
    ("power_w", "counter_j_per_s", "energy_j"),
    [
        (300, 160, 1600.0),  # 160/300 = 0.53 of ∫power: plausible, the counter is kept
        (300, 140, 3000.0),  # 140/300 = 0.47: below half → power × time, 300 W × 10 s
        (9, 0, 0.0),  # a stopped counter at 9 W, under the 10 W floor: kept
        (11, 0, 110.0),  # at 11 W it counts as stuck: 11 W × 10 s
    ],
)
def test_stuck_counter_rule_boundaries(power_w: int, counter_j_per_s: int, energy_j: float) -> None:
    def flat(t: int) -> tuple[int, int, int, int, int, int, int, int]:
        return (50, 10, 1_000_000_000, 1, power_w * 1000, 50, 1500, 0)

    def slow(t: int) -> int:
        return 1_000_000 + counter_j_per_s * 1000 * (t - T0)

    agent, clock, _ = make([ScriptedGpu(U1, 0, H100, flat, energy=slow)])
    assert only(run(agent, clock, T0, T0 + 10), U1, START)["energy_j"] == energy_j


def test_utilisation_samples_unsupported_at_discovery_is_asked_once_and_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Counting(FakeNvml):
        samples_calls = 0

        def nvmlDeviceGetSamples(self, device: Any, sampling_type: int, timeStamp: int) -> Any:
            Counting.samples_calls += 1
            return super().nvmlDeviceGetSamples(device, sampling_type, timeStamp)

    clock = VirtualClock(T0)
    g = ScriptedGpu(U1, 0, H100, script, energy=counter, unsupported=["util_samples"])
    agent = Agent(Counting([g], clock.time), spool_dir=None, interval_s=10, clock=clock)
    with caplog.at_level(logging.DEBUG, logger="gpufleet.agent"):
        s = only(run(agent, clock, T0, T0 + 10), U1, START)
    assert s["util_pct"] == 50.0  # from the utilisation rates instead
    # NOT_SUPPORTED at discovery switches the buffered path off there: no tick asks again
    assert Counting.samples_calls == 1
    lines = [r.getMessage() for r in caplog.records if "sampl" in r.getMessage()]
    assert len(lines) == 1 and "utilisation samples unavailable" in lines[0], lines
