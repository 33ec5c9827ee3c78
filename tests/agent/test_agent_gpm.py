"""NVML GPM through the fake backend: SM, tensor and DRAM activity as interval means with
``prof_s`` (docs/agent.md), and every way GPM can be missing or fail.

Same conventions as test_agent_collect.py (10-second intervals from T0, the tick at t reads
the second [t-1, t)). GPM needs two samples: the tick at t takes one and reads the metrics of
the pair (t-1, t), so the first tick after discovery has no profiling fields.
"""

from __future__ import annotations

import ctypes
import itertools
import logging
from collections import Counter
from datetime import UTC, datetime
from typing import Any

import pynvml
import pytest

from telemetry.agent.agent import Agent
from telemetry.agent.clock import VirtualClock
from telemetry.agent.fake import MODELS, FakeFleet, FakeNvml, ScriptedGpu, simulate
from telemetry.agent.gpm import GpmPair
from telemetry.agent.nvml import PynvmlApi
from tests.agent.test_agent_collect import FULL, H100, START, T0, U1, U2, counter, only, run, script

A100 = MODELS["A100"]


def prof(t: int) -> tuple[int | None, int | None, int | None, int | None]:
    """GPM in % for second t: seconds 0–4 of each 10 (80 % util in ``script``): SM active 60,
    occupancy 30, tensor 40, DRAM 50; seconds 5–9 (20 % util): 20, 10, 0, 10."""
    return (60, 30, 40, 50) if t % 10 < 5 else (20, 10, 0, 10)


def make(
    gpus: list[ScriptedGpu], *, api_cls: type[FakeNvml] = FakeNvml, **kw: Any
) -> tuple[Agent, VirtualClock, FakeNvml]:
    clock = VirtualClock(T0)
    api = api_cls(gpus, clock.time, **kw)
    agent = Agent(api, spool_dir=None, interval_s=10, hostname="gpu-test-01", clock=clock)
    return agent, clock, api


def h100(uuid: str = U1, index: int = 0, **kw: Any) -> ScriptedGpu:
    return ScriptedGpu(uuid, index, H100, script, energy=counter, prof=prof, **kw)


PROF_FULL = {
    "sm_active": 0.4,  # (5×60 + 5×20) / 10 = 40 %
    "sm_occupancy": 0.2,  # (5×30 + 5×10) / 10 = 20 %
    "tensor_active": 0.2,  # (5×40 + 5×0) / 10 = 20 %
    "dram_active": 0.3,  # (5×50 + 5×10) / 10 = 30 %
    "prof_s": 10,
}
PROF_KEYS = set(PROF_FULL)

# The six seconds 0, 1, 6, 7, 8, 9 (two at the high values, four at the low ones).
PROF_SIX = {
    "sm_active": 0.3333,  # (2×60 + 4×20) / 6 = 33.33 %
    "sm_occupancy": 0.1667,  # (2×30 + 4×10) / 6 = 16.67 %
    "tensor_active": 0.1333,  # (2×40 + 4×0) / 6 = 13.33 %
    "dram_active": 0.2333,  # (2×50 + 4×10) / 6 = 23.33 %
    "prof_s": 6,
}


GPM_CALLS = (
    "nvmlGpmQueryDeviceSupport",
    "nvmlGpmSampleAlloc",
    "nvmlGpmSampleFree",
    "nvmlGpmSampleGet",
    "nvmlGpmMetricsGet",
)


class Counting(FakeNvml):
    """Counts the GPM calls by name."""

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.gpm_calls: Counter[str] = Counter()
        for name in GPM_CALLS:
            setattr(self, name, self._counted(name, getattr(self, name)))

    def _counted(self, name: str, fn: Any) -> Any:
        def call(*a: Any) -> Any:
            self.gpm_calls[name] += 1
            return fn(*a)

        return call


def test_gpm_fields_are_interval_means_over_the_seconds_with_a_pair() -> None:
    agent, clock, _ = make([h100()])
    out = run(agent, clock, T0, T0 + 10)
    # the tick at T0 takes the first GPM sample: its second (T0-1) has no pair, and the
    # 1-second sample of the previous interval carries no profiling field at all (not 0)
    assert not PROF_KEYS & set(out[0]) and out[0]["seconds"] == 1
    assert only(out, U1, START) == {**FULL, **PROF_FULL}


def test_a_gpu_without_gpm_sends_what_it_sent_before_and_says_so_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    a100 = ScriptedGpu(U2, 1, A100, script, energy=counter)  # no prof: GPM support says 0
    agent, clock, api = make([h100(), a100], api_cls=Counting)
    with caplog.at_level(logging.INFO, logger="gpufleet.agent"):
        out = run(agent, clock, T0, T0 + 20)
    assert only(out, U1, START) == {**FULL, **PROF_FULL}
    assert only(out, U2, START) == {**FULL, "gpu": U2}
    lines = [r.getMessage() for r in caplog.records if "GPM" in r.getMessage()]
    assert len(lines) == 2, lines
    assert U1 in lines[0] and "GPM on" in lines[0]  # discovery order: GPU 0, then 1
    assert U2 in lines[1] and "has no GPM" in lines[1]
    assert isinstance(api, Counting)
    # asked once at discovery; 21 ticks sample the H100 only
    assert api.gpm_calls["nvmlGpmQueryDeviceSupport"] == 2
    assert api.gpm_calls["nvmlGpmSampleGet"] == 21
    assert api.gpm_calls["nvmlGpmMetricsGet"] == 20


def test_a_library_without_gpm_changes_nothing_else(caplog: pytest.LogCaptureFixture) -> None:
    # old drivers and NVIDIA's mock NVML: every nvmlGpm* call raises FUNCTION_NOT_FOUND
    agent, clock, api = make([h100(), h100(U2, 1)], api_cls=Counting, gpm_library=False)
    with caplog.at_level(logging.INFO, logger="gpufleet.agent"):
        out = run(agent, clock, T0, T0 + 20)
    assert only(out, U1, START) == FULL
    assert only(out, U2, START) == {**FULL, "gpu": U2}
    assert not any(PROF_KEYS & set(s) for s in out)
    lines = [r.getMessage() for r in caplog.records if "GPM" in r.getMessage()]
    assert len(lines) == 2 and all("GPM unavailable (Function Not Found)" in m for m in lines)
    assert isinstance(api, Counting)
    assert api.gpm_calls == {"nvmlGpmQueryDeviceSupport": 2}  # never asked again


def test_gpm_unsupported_at_the_query_is_asked_once() -> None:
    agent, clock, api = make([h100(unsupported=["gpm"])], api_cls=Counting)
    assert only(run(agent, clock, T0, T0 + 20), U1, START) == FULL
    assert isinstance(api, Counting)
    assert api.gpm_calls == {"nvmlGpmQueryDeviceSupport": 1}


def test_failing_gpm_seconds_are_left_out_and_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # nvmlGpmSampleGet raises UNKNOWN at the ticks T0+3, T0+4, T0+5: seconds 2, 3, 4 have no
    # pair; the tick at T0+6 starts a new pair, so second 5 has none either. Left: 0, 1, 6–9.
    agent, clock, _ = make([h100(gpm_fail=[(T0 + 3, T0 + 6)])])
    with caplog.at_level(logging.INFO, logger="gpufleet.agent"):
        out = run(agent, clock, T0, T0 + 20)
    assert only(out, U1, START) == {**FULL, **PROF_SIX}
    # the next interval is whole again
    assert only(out, U1, "2026-11-30T09:00:10Z")["prof_s"] == 10
    failed = [r for r in caplog.records if "GPM failed" in r.getMessage()]
    assert len(failed) == 1 and failed[0].levelno == logging.WARNING
    assert U1 in failed[0].getMessage() and "Unknown Error" in failed[0].getMessage()


def test_one_failed_gpm_tick_costs_its_second_and_the_next() -> None:
    # The tick at T0+3 fails (second 2); the pair restarts at T0+4, so second 3 has none
    # either (never a two-second mean passed off as one second). Left: 0, 1, 4 (high) and
    # 5–9 (low), 8 seconds.
    agent, clock, _ = make([h100(gpm_fail=[(T0 + 3, T0 + 4)])])
    s = only(run(agent, clock, T0, T0 + 10), U1, START)
    assert {k: s[k] for k in PROF_KEYS} == {
        "sm_active": 0.35,  # (3×60 + 5×20) / 8
        "sm_occupancy": 0.175,  # (3×30 + 5×10) / 8
        "tensor_active": 0.15,  # (3×40 + 5×0) / 8
        "dram_active": 0.25,  # (3×50 + 5×10) / 8
        "prof_s": 8,
    }


def test_gpm_that_keeps_failing_is_switched_off_after_a_minute(
    caplog: pytest.LogCaptureFixture,
) -> None:
    agent, clock, api = make([h100(gpm_fail=[(T0, T0 + 1000)])], api_cls=Counting)
    with caplog.at_level(logging.INFO, logger="gpufleet.agent"):
        out = run(agent, clock, T0, T0 + 100)
    assert not any(PROF_KEYS & set(s) for s in out)
    assert only(out, U1, START) == FULL  # nothing else changed
    assert isinstance(api, Counting)
    assert api.gpm_calls["nvmlGpmSampleGet"] == 60  # ticks T0 … T0+59, then no more
    assert api.gpm_calls.get("nvmlGpmMetricsGet", 0) == 0
    lines = [r.getMessage() for r in caplog.records if "GPM failed" in r.getMessage()]
    assert len(lines) == 2 and "failed 60 seconds in a row" in lines[1]
    assert not api.gpm_samples  # its buffers were freed


def test_a_metric_the_gpu_does_not_give_is_omitted_alone(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def no_tensor(t: int) -> tuple[int | None, int | None, int | None, int | None]:
        sm, occ, _, dram = prof(t)
        return sm, occ, None, dram

    g = ScriptedGpu(U1, 0, H100, script, energy=counter, prof=no_tensor)
    agent, clock, _ = make([g])
    with caplog.at_level(logging.INFO, logger="gpufleet.agent"):
        s = only(run(agent, clock, T0, T0 + 20), U1, START)
    expected = {**FULL, **PROF_FULL}
    del expected["tensor_active"]
    assert s == expected
    lines = [r.getMessage() for r in caplog.records if "GPM metric" in r.getMessage()]
    assert len(lines) == 1 and "metric 5 (tensor_active)" in lines[0]


def test_gpm_buffers_are_freed_when_a_gpu_is_lost_and_at_shutdown() -> None:
    agent, clock, api = make([h100(), h100(U2, 1, lost_at=T0 + 4)])
    out = run(agent, clock, T0, T0 + 10)
    lost = only(out, U2, START)
    # ticks T0+1 … T0+4 read seconds 0–3, each with a GPM pair: 4 × 60 % SM active …
    assert {k: lost[k] for k in PROF_KEYS} == {
        "sm_active": 0.6,
        "sm_occupancy": 0.3,
        "tensor_active": 0.4,
        "dram_active": 0.5,
        "prof_s": 4,
    }
    assert len(api.gpm_samples) == 2  # the lost GPU's pair is gone, the other's is kept
    agent.source.shutdown()
    assert not api.gpm_samples


def test_gpm_starts_again_after_the_driver_comes_back() -> None:
    agent, clock, api = make([h100()])
    api.outage(T0 + 3, T0 + 6)
    s = only(run(agent, clock, T0, T0 + 10), U1, START)
    # as in test_driver_gone_reinitialises_with_backoff: seconds 0, 1 and 5–9 are read; the
    # re-initialising tick (T0+6) sets GPM up anew and takes the first sample of a new pair,
    # so second 5 has none: GPM covers 0, 1, 6–9
    assert s["seconds"] == 7
    assert {k: s[k] for k in PROF_KEYS} == PROF_SIX
    assert len(api.gpm_samples) == 2  # the pair from before the outage was freed


def test_a_pair_spans_about_a_second_or_is_not_used() -> None:
    clock = VirtualClock(T0)
    api = FakeNvml([h100()], clock.time)
    api.nvmlInit()
    h = api.nvmlDeviceGetHandleByIndex(0)
    pair = GpmPair(api)

    def take(at: float) -> list[float | None] | None:
        clock.set(at)
        out = pair.take(h, at)
        return None if out is None else [v for v, _ in out]

    assert take(T0 + 0.0) is None  # no previous sample
    assert take(T0 + 0.2) is None  # too close: the sample at T0 stays the start
    # T0 … T0+1: the fake's second T0 (a "high" second)
    assert take(T0 + 1.0) == [60.0, 30.0, 40.0, 50.0]
    assert take(T0 + 4.5) is None  # 3.5 s apart: a mean over seconds nobody saw one by one
    # T0+4 (floor of 4.5) … T0+6: seconds 4 (high) and 5 (low)
    assert take(T0 + 6.1) == [40.0, 20.0, 20.0, 30.0]
    pair.free()
    assert not api.gpm_samples


@pytest.mark.parametrize("spec_gpm", ["gpm=1", "gpm=true"])
def test_tick_path_matches_simulator_with_gpm(spec_gpm: str) -> None:
    """Hopper GPUs of a ``gpm=1`` group send the four fields from the real collector ticking
    over FakeNvml exactly as simulate() computes them; an A100 of such a group sends none."""
    t0 = T0 + 3600
    spec = (
        f"nodes=1,gpus=3,model=H100,pattern=training|inference|notebook,{spec_gpm};"
        f"nodes=1,gpus=1,model=A100,pattern=training,{spec_gpm}"
    )
    fleet = FakeFleet(spec, seed=3, epoch=t0)
    ticked: list[dict[str, Any]] = []
    for host in fleet.nodes:
        clock = VirtualClock(t0)
        agent = Agent(fleet.backend(host, clock.time), spool_dir=None, interval_s=60, clock=clock)
        ticked.extend(run(agent, clock, t0, t0 + 1200))
    ticked = [s for s in ticked if s["seconds"] == 60]
    sim = [
        s
        for _, p in simulate(
            fleet,
            start=datetime.fromtimestamp(t0, UTC),
            end=datetime.fromtimestamp(t0 + 1200, UTC),
        )
        for s in p["samples"]
    ]
    key = lambda s: (s["start"], s["gpu"])  # noqa: E731
    assert len(sim) == 4 * 20
    assert sorted(ticked, key=key) == sorted(sim, key=key)
    a100 = fleet.node(fleet.nodes[1]).gpus[0].uuid
    assert not any(PROF_KEYS & set(s) for s in sim if s["gpu"] == a100)
    hopper = [s for s in sim if s["gpu"] != a100]
    assert all(s["prof_s"] == 60 and 0 <= s["sm_active"] <= 1 for s in hopper)
    # busy but not working: kernels run most of the time, the SMs are far from all busy
    assert any(s["util_pct"] > 90 and s["sm_active"] < 0.65 for s in hopper)


def test_simulate_without_gpm_is_unchanged_by_it() -> None:
    start = datetime(2026, 11, 30, tzinfo=UTC)
    end = datetime(2026, 11, 30, 1, tzinfo=UTC)
    plain = [s for _, p in simulate("small", start=start, end=end) for s in p["samples"]]
    assert plain and not any(PROF_KEYS & set(s) for s in plain)


def test_gpm_through_nvidia_ml_py_s_own_wrappers(monkeypatch: pytest.MonkeyPatch) -> None:
    """PynvmlApi's GPM calls go through nvidia-ml-py's real wrappers (pynvml.nvmlGpm*), with
    the C library under them stood in for by ctypes callbacks of the C signatures: what the
    agent puts in ``c_nvmlGpmMetricsGet_t`` reaches C, and what C writes comes back."""
    sample_t = pynvml.c_nvmlGpmSample_t
    # (an exception inside a ctypes callback does not reach the caller: record, assert later)
    buffers: dict[int, Any] = {}
    order = itertools.count(1)
    taken: dict[int, int] = {}  # buffer address → when it was last filled
    seen: list[tuple[int, int, list[int], bool]] = []  # version, numMetrics, ids, oldest first

    def alloc(pp: Any) -> int:
        buf = ctypes.create_string_buffer(8)
        buffers[ctypes.addressof(buf)] = buf
        pp[0] = ctypes.cast(buf, sample_t)
        return pynvml.NVML_SUCCESS

    def free(p: Any) -> int:
        del buffers[ctypes.addressof(p.contents)]
        return pynvml.NVML_SUCCESS

    def get(device: Any, p: Any) -> int:
        taken[ctypes.addressof(p.contents)] = next(order)
        return pynvml.NVML_SUCCESS

    def metrics(pm: Any) -> int:
        m = pm.contents
        ids = [int(m.metrics[i].metricId) for i in range(m.numMetrics)]
        older = taken[ctypes.addressof(m.sample1.contents)]
        newer = taken[ctypes.addressof(m.sample2.contents)]
        seen.append((int(m.version), int(m.numMetrics), ids, older < newer))
        answers = {2: (0, 42.5), 3: (0, 17.25), 5: (pynvml.NVML_ERROR_NOT_SUPPORTED, 0.0)}
        for i, metric_id in enumerate(ids):
            # DRAM (10) says 100.4 %: counter timing, read as 100
            m.metrics[i].nvmlReturn, m.metrics[i].value = answers.get(metric_id, (0, 100.4))
        return pynvml.NVML_SUCCESS

    def support(device: Any, ps: Any) -> int:
        ps[0].isSupportedDevice = 1 if ps[0].version == pynvml.NVML_GPM_SUPPORT_VERSION else 0
        return pynvml.NVML_SUCCESS

    c_int, void_p = ctypes.c_int, ctypes.c_void_p
    fns = {
        "nvmlGpmSampleAlloc": ctypes.CFUNCTYPE(c_int, ctypes.POINTER(sample_t))(alloc),
        "nvmlGpmSampleFree": ctypes.CFUNCTYPE(c_int, sample_t)(free),
        "nvmlGpmSampleGet": ctypes.CFUNCTYPE(c_int, void_p, sample_t)(get),
        "nvmlGpmMetricsGet": ctypes.CFUNCTYPE(c_int, ctypes.POINTER(pynvml.c_nvmlGpmMetricsGet_t))(
            metrics
        ),
        "nvmlGpmQueryDeviceSupport": ctypes.CFUNCTYPE(
            c_int, void_p, ctypes.POINTER(pynvml.c_nvmlGpmSupport_t)
        )(support),
    }
    monkeypatch.setattr(pynvml, "_nvmlGetFunctionPointer", fns.__getitem__)
    api = PynvmlApi()
    device = 0x1000  # an opaque handle, as far as these calls go
    assert api.nvmlGpmQueryDeviceSupport(device).isSupportedDevice == 1
    pair = GpmPair(api)
    assert len(buffers) == 2
    assert pair.take(device, 100.0) is None
    assert pair.take(device, 101.0) == [
        (42.5, 0),
        (17.25, 0),
        (None, pynvml.NVML_ERROR_NOT_SUPPORTED),
        (100.0, 0),
    ]
    assert pair.take(device, 102.0) is not None  # the buffers swap: still older → newer
    # version 1, the four metrics, and sample1 the older sample, both times
    assert seen == [(1, 4, [2, 3, 5, 10], True)] * 2
    pair.free()
    assert not buffers
