"""NVML GPM (GPU Performance Monitoring): SM, tensor and DRAM activity, Hopper and later.

GPM keeps hardware counters; ``nvmlGpmSampleGet`` copies them into a sample buffer and
``nvmlGpmMetricsGet`` turns two samples into metrics over the time between them. So the
collector takes one sample per GPU per tick and asks for the metrics of the newest pair: at the
tick ``t`` that pair spans the second ``[t-1, t)``, the second every other field of that tick
describes (summarise.py's timing convention).

The calls, as nvidia-ml-py 13.x defines them (pynvml.py):

* ``nvmlGpmQueryDeviceSupport(handle)`` → ``c_nvmlGpmSupport_t`` (``version``,
  ``isSupportedDevice``); raises ``FUNCTION_NOT_FOUND`` where the library has no GPM (old
  drivers, NVIDIA's mock NVML);
* ``nvmlGpmSampleAlloc()`` → ``c_nvmlGpmSample_t`` (an opaque pointer), freed with
  ``nvmlGpmSampleFree(sample)``; ``nvmlGpmSampleGet(handle, sample)`` fills it;
* ``nvmlGpmMetricsGet(c_nvmlGpmMetricsGet_t)`` fills, for each of ``numMetrics`` entries of
  ``metrics`` (``metricId`` set by the caller), ``nvmlReturn`` and ``value``; ``sample1`` is
  the older sample, ``sample2`` the newer, ``version`` = ``NVML_GPM_METRICS_GET_VERSION``.

The four metrics are percentages (0.0–100.0): SM_UTIL (SMs busy), SM_OCCUPANCY (resident
warps against the maximum), ANY_TENSOR_UTIL (any tensor pipe busy) and DRAM_BW_UTIL (memory
bandwidth used against the peak).
"""

from __future__ import annotations

import math
from typing import Any, Protocol

import pynvml

# (GPM metric id, the Reading field it fills)
METRICS = (
    (int(pynvml.NVML_GPM_METRIC_SM_UTIL), "sm_active_pct"),
    (int(pynvml.NVML_GPM_METRIC_SM_OCCUPANCY), "sm_occupancy_pct"),
    (int(pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL), "tensor_active_pct"),
    (int(pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL), "dram_active_pct"),
)

# A pair of samples is a measure of "the last second" only if it spans about a second on the
# agent's clock. Closer than MIN_GAP_S (ticks bunched up after a stall) the counters have
# barely moved: the newer sample is not used and the older stays the start of the next pair.
# Further apart than MAX_GAP_S (NVML was away, the agent was starved) the metrics are a mean
# over several seconds the agent did not see: that second goes without, the pair restarts.
MIN_GAP_S = 0.5
MAX_GAP_S = 2.5

# A MIG instance's metrics (nvmlGpmMigSampleGet): the four above, and GRAPHICS_UTIL (the share
# of time any compute or graphics work ran on the instance), which stands in for the
# utilisation NVML does not report for MIG instances (docs/agent.md, "MIG").
MIG_METRICS = (*METRICS, (int(pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL), "util"))

_SUCCESS = int(pynvml.NVML_SUCCESS)


class GpmApi(Protocol):
    """The GPM calls (pynvml's names, arguments and return values)."""

    def nvmlGpmQueryDeviceSupport(self, device: Any) -> Any: ...
    def nvmlGpmSampleAlloc(self) -> Any: ...
    def nvmlGpmSampleFree(self, gpmSample: Any) -> None: ...
    def nvmlGpmSampleGet(self, device: Any, gpmSample: Any) -> Any: ...
    def nvmlGpmMigSampleGet(self, device: Any, gpuInstanceId: int, gpmSample: Any) -> Any: ...
    def nvmlGpmMetricsGet(self, metricsGet: Any) -> Any: ...


def percent(value: float) -> float | None:
    """A GPM percentage as sent on: ``None`` when it is no number or far outside 0–100; a hair
    over 100 (counter timing) is 100."""
    if not math.isfinite(value) or value < 0.0 or value > 101.0:
        return None
    return min(value, 100.0)


class GpmPair:
    """The two sample buffers of one GPU and the request that reads metrics from them.

    :meth:`take` raises pynvml's ``NVMLError`` as the calls do; the collector classifies it.
    """

    def __init__(
        self,
        api: GpmApi,
        *,
        gi: int | None = None,
        metrics: tuple[tuple[int, str], ...] = METRICS,
    ) -> None:
        """``gi``: sample this GPU instance of the GPU (``nvmlGpmMigSampleGet``), not the whole
        GPU; ``metrics``: what :meth:`take` returns, in this order."""
        self.api = api
        self.gi = gi
        self.metrics = metrics
        first = api.nvmlGpmSampleAlloc()
        try:
            second = api.nvmlGpmSampleAlloc()
        except pynvml.NVMLError:
            api.nvmlGpmSampleFree(first)
            raise
        self.samples = [first, second]  # [older, the one to fill next]
        self.taken_at: float | None = None  # agent clock when samples[0] was filled
        # one request reused every second (its metrics array is ~19 KB)
        req = self.request = pynvml.c_nvmlGpmMetricsGet_t()
        req.version = pynvml.NVML_GPM_METRICS_GET_VERSION
        req.numMetrics = len(metrics)
        for i, (metric_id, _) in enumerate(metrics):
            req.metrics[i].metricId = metric_id

    def restart(self) -> None:
        """Forget the older sample (after a failed call): the next tick starts a new pair."""
        self.taken_at = None

    def take(self, handle: Any, now: float) -> list[tuple[float | None, int]] | None:
        """Sample now; the metrics over the time since the previous sample, one
        ``(percent or None, NVML return code)`` per entry of ``metrics``, or ``None``
        when there is no usable previous sample. ``handle``: the GPU's (for an instance too)."""
        older, cur = self.samples
        if self.gi is None:
            self.api.nvmlGpmSampleGet(handle, cur)
        else:
            self.api.nvmlGpmMigSampleGet(handle, self.gi, cur)
        gap = None if self.taken_at is None else now - self.taken_at
        if gap is not None and gap < MIN_GAP_S:
            return None  # keep the older sample as the start of the next pair
        out: list[tuple[float | None, int]] | None = None
        if gap is not None and gap <= MAX_GAP_S:
            req = self.request
            req.sample1, req.sample2 = older, cur
            self.api.nvmlGpmMetricsGet(req)
            out = []
            for i in range(len(self.metrics)):
                m = req.metrics[i]
                code = int(m.nvmlReturn)
                out.append((percent(float(m.value)) if code == _SUCCESS else None, code))
        self.samples.reverse()
        self.taken_at = now
        return out

    def free(self) -> None:
        for s in self.samples:
            try:
                self.api.nvmlGpmSampleFree(s)
            except pynvml.NVMLError:
                pass  # the library is going or gone; nothing more to do for this buffer
        self.samples = []
