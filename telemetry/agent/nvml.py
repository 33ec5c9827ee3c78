"""NVML access: the backend protocol, the real pynvml backend, and the per-second collector.

The collector talks to a backend that has the same function names and signatures as the
``pynvml`` module (nvidia-ml-py). The real backend is a thin typed wrapper round the module;
``fake.FakeNvml`` implements the same protocol and raises pynvml's own ``NVMLError`` subclasses,
so every fallback and error path below runs unchanged under test.

NVML errors fall into three classes (plus transient ones):

* a field not supported on this GPU or driver → omit that field from now on, use its fallback
  (utilisation samples → utilisation rates; memory info v2 → v1; clocks-event reasons →
  the older throttle-reasons call; energy counter → power × time);
* the GPU is lost or needs a reset → report the other GPUs, mark that one ``lost``;
* the driver or library is gone → drop every handle and re-initialise with backoff.

The collector is the agent's NVML source (source.py): one :class:`~.source.Reading` per GPU per
tick. On GPUs where ``nvmlGpmQueryDeviceSupport`` says so it also fills the profiling fields
from GPM (gpm.py); where GPM is missing or fails, those fields stay ``None`` and nothing else
changes. Given a :class:`~.workloads.Discovery`, it also says who held each GPU: the workloads
of the compute and graphics processes NVML lists on it, and the allocations naming it
(``None`` where the process list cannot be read: NOT_SUPPORTED, or NO_PERMISSION as NVML
answers an unprivileged caller for a MIG-enabled GPU's whole handle).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import pynvml

from .gpm import METRICS, MIG_METRICS, GpmApi, GpmPair
from .source import (
    GpuInfo,
    InstanceReading,
    MigInstance,
    Reading,
    TickResult,
    Workload,
    inventory,
    mig_combine,
)
from .workloads import Discovery

log = logging.getLogger("gpufleet.agent")


class NvmlApi(GpmApi, Protocol):
    """The subset of pynvml the agent calls (same names, arguments and return values)."""

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlSystemGetDriverVersion(self) -> str: ...
    def nvmlDeviceGetCount(self) -> int: ...
    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any: ...
    def nvmlDeviceGetUUID(self, handle: Any) -> str: ...
    def nvmlDeviceGetMinorNumber(self, handle: Any) -> int: ...
    def nvmlDeviceGetName(self, handle: Any) -> str: ...
    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: int | None = None) -> Any: ...
    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any) -> int: ...
    def nvmlDeviceGetSamples(
        self, device: Any, sampling_type: int, timeStamp: int
    ) -> tuple[int, Sequence[Any]]: ...
    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any: ...
    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> Sequence[Any]: ...
    def nvmlDeviceGetComputeRunningProcesses_v2(self, handle: Any) -> Sequence[Any]: ...
    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: Any) -> Sequence[Any]: ...
    def nvmlDeviceGetGraphicsRunningProcesses_v2(self, handle: Any) -> Sequence[Any]: ...
    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int: ...
    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int: ...
    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int: ...
    def nvmlDeviceGetClockInfo(self, handle: Any, type: int) -> int: ...
    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int: ...
    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: Any) -> int: ...
    # MIG (docs/agent.md, "MIG")
    def nvmlDeviceGetMigMode(self, device: Any) -> list[int]: ...
    def nvmlDeviceGetMaxMigDeviceCount(self, device: Any) -> int: ...
    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: Any, index: int) -> Any: ...
    def nvmlDeviceGetGpuInstanceId(self, device: Any) -> int: ...
    def nvmlDeviceGetComputeInstanceId(self, device: Any) -> int: ...
    def nvmlDeviceGetAttributes(self, device: Any) -> Any: ...
    def nvmlDeviceGetGpuInstanceProfileInfo(self, device: Any, profile: int) -> Any: ...


class PynvmlApi:
    """The real backend: the pynvml module, typed. The library loads on ``nvmlInit``."""

    def nvmlInit(self) -> None:
        pynvml.nvmlInit()

    def nvmlShutdown(self) -> None:
        pynvml.nvmlShutdown()

    def nvmlSystemGetDriverVersion(self) -> str:
        return _text(pynvml.nvmlSystemGetDriverVersion())

    def nvmlDeviceGetCount(self) -> int:
        return int(pynvml.nvmlDeviceGetCount())

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        return pynvml.nvmlDeviceGetHandleByIndex(index)

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        return _text(pynvml.nvmlDeviceGetUUID(handle))

    def nvmlDeviceGetMinorNumber(self, handle: Any) -> int:
        return int(pynvml.nvmlDeviceGetMinorNumber(handle))

    def nvmlDeviceGetName(self, handle: Any) -> str:
        return _text(pynvml.nvmlDeviceGetName(handle))

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: int | None = None) -> Any:
        return pynvml.nvmlDeviceGetMemoryInfo(handle, version=version)

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any) -> int:
        return int(pynvml.nvmlDeviceGetEnforcedPowerLimit(handle))

    def nvmlDeviceGetSamples(
        self, device: Any, sampling_type: int, timeStamp: int
    ) -> tuple[int, Sequence[Any]]:
        vtype, samples = pynvml.nvmlDeviceGetSamples(device, sampling_type, timeStamp)
        return int(vtype), samples

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        return pynvml.nvmlDeviceGetUtilizationRates(handle)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> Sequence[Any]:
        procs: Sequence[Any] = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
        return procs

    def nvmlDeviceGetComputeRunningProcesses_v2(self, handle: Any) -> Sequence[Any]:
        procs: Sequence[Any] = pynvml.nvmlDeviceGetComputeRunningProcesses_v2(handle)
        return procs

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: Any) -> Sequence[Any]:
        procs: Sequence[Any] = pynvml.nvmlDeviceGetGraphicsRunningProcesses(handle)
        return procs

    def nvmlDeviceGetGraphicsRunningProcesses_v2(self, handle: Any) -> Sequence[Any]:
        procs: Sequence[Any] = pynvml.nvmlDeviceGetGraphicsRunningProcesses_v2(handle)
        return procs

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        return int(pynvml.nvmlDeviceGetPowerUsage(handle))

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int:
        return int(pynvml.nvmlDeviceGetTotalEnergyConsumption(handle))

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        return int(pynvml.nvmlDeviceGetTemperature(handle, sensor))

    def nvmlDeviceGetClockInfo(self, handle: Any, type: int) -> int:
        return int(pynvml.nvmlDeviceGetClockInfo(handle, type))

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int:
        fn = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
        if fn is None:  # nvidia-ml-py older than the rename
            raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        return int(fn(handle))

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: Any) -> int:
        return int(pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle))

    def nvmlDeviceGetMigMode(self, device: Any) -> list[int]:
        current, pending = pynvml.nvmlDeviceGetMigMode(device)
        return [int(current), int(pending)]

    def nvmlDeviceGetMaxMigDeviceCount(self, device: Any) -> int:
        return int(pynvml.nvmlDeviceGetMaxMigDeviceCount(device))

    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: Any, index: int) -> Any:
        return pynvml.nvmlDeviceGetMigDeviceHandleByIndex(device, index)

    def nvmlDeviceGetGpuInstanceId(self, device: Any) -> int:
        return int(pynvml.nvmlDeviceGetGpuInstanceId(device))

    def nvmlDeviceGetComputeInstanceId(self, device: Any) -> int:
        return int(pynvml.nvmlDeviceGetComputeInstanceId(device))

    def nvmlDeviceGetAttributes(self, device: Any) -> Any:
        return pynvml.nvmlDeviceGetAttributes(device)

    def nvmlDeviceGetGpuInstanceProfileInfo(self, device: Any, profile: int) -> Any:
        return pynvml.nvmlDeviceGetGpuInstanceProfileInfo(device, profile)

    def nvmlGpmMigSampleGet(self, device: Any, gpuInstanceId: int, gpmSample: Any) -> Any:
        return pynvml.nvmlGpmMigSampleGet(device, gpuInstanceId, gpmSample)

    def nvmlGpmQueryDeviceSupport(self, device: Any) -> Any:
        return pynvml.nvmlGpmQueryDeviceSupport(device)

    def nvmlGpmSampleAlloc(self) -> Any:
        return pynvml.nvmlGpmSampleAlloc()

    def nvmlGpmSampleFree(self, gpmSample: Any) -> None:
        pynvml.nvmlGpmSampleFree(gpmSample)

    def nvmlGpmSampleGet(self, device: Any, gpmSample: Any) -> Any:
        return pynvml.nvmlGpmSampleGet(device, gpmSample)

    def nvmlGpmMetricsGet(self, metricsGet: Any) -> Any:
        return pynvml.nvmlGpmMetricsGet(metricsGet)


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _codes(*names: str) -> frozenset[int]:
    # getattr: older nvidia-ml-py releases lack some of the newer codes
    return frozenset(int(getattr(pynvml, n)) for n in names if hasattr(pynvml, n))


UNSUPPORTED = "unsupported"
LOST = "lost"
DRIVER = "driver"
TRANSIENT = "transient"

_UNSUPPORTED_CODES = _codes(
    "NVML_ERROR_NOT_SUPPORTED",
    "NVML_ERROR_FUNCTION_NOT_FOUND",
    "NVML_ERROR_NO_PERMISSION",
    "NVML_ERROR_ARGUMENT_VERSION_MISMATCH",
    "NVML_ERROR_DEPRECATED",
)
_LOST_CODES = _codes(
    "NVML_ERROR_GPU_IS_LOST", "NVML_ERROR_RESET_REQUIRED", "NVML_ERROR_GPU_NOT_FOUND"
)
_DRIVER_CODES = _codes(
    "NVML_ERROR_UNINITIALIZED",
    "NVML_ERROR_DRIVER_NOT_LOADED",
    "NVML_ERROR_LIBRARY_NOT_FOUND",
    "NVML_ERROR_LIB_RM_VERSION_MISMATCH",
)


# Raised (not as an NVMLError) by unversioned pynvml calls whose versioned symbol the driver lacks;
# absent from old nvidia-ml-py releases.
_MISMATCH: type[Exception] = getattr(pynvml, "NVMLLibraryMismatchError", pynvml.NVMLError)


def classify(err: Exception) -> str:
    """Which of the error classes above an exception from a backend call belongs to.

    ``NVMLError`` objects are unhashable and compare by value: use ``err.value``.
    """
    if isinstance(err, _MISMATCH) and not isinstance(err, pynvml.NVMLError):
        return UNSUPPORTED  # an unversioned call whose versioned symbol the driver lacks
    value = getattr(err, "value", None)
    if value in _UNSUPPORTED_CODES:
        return UNSUPPORTED
    if value in _LOST_CODES:
        return LOST
    if value in _DRIVER_CODES:
        return DRIVER
    return TRANSIENT


class GpuLostError(Exception):
    pass


class DriverGoneError(Exception):
    pass


_NOT_FOUND = int(pynvml.NVML_ERROR_NOT_FOUND)
_MIG_ENABLE = int(pynvml.NVML_DEVICE_MIG_ENABLE)
_MIG_DISABLE = int(pynvml.NVML_DEVICE_MIG_DISABLE)
# The profiles that can span a whole GPU, largest first (the first a GPU knows is its size).
_WHOLE_GPU_PROFILES = tuple(
    int(getattr(pynvml, f"NVML_GPU_INSTANCE_PROFILE_{n}_SLICE"))
    for n in (8, 7, 6, 4)
    if hasattr(pynvml, f"NVML_GPU_INSTANCE_PROFILE_{n}_SLICE")
)


def mig_profile(slices: int, ci_slices: int, memory_mb: int) -> str:
    """NVIDIA's name of a MIG profile from an instance's attributes: ``3g.40gb`` (GPU
    instance slices, memory rounded up to whole GB as NVIDIA names them: 39.5 GiB → 40gb),
    ``1c.3g.40gb`` for a compute instance smaller than its GPU instance."""
    gb = -(-memory_mb // 1024)
    name = f"{slices}g.{gb}gb"
    return f"{ci_slices}c.{name}" if 0 < ci_slices < slices else name


# GPM that fails this many ticks in a row on a GPU (and was not reported unsupported) is
# switched off there until NVML is initialised again: a minute of one line in the log is
# enough to say it does not work, and a broken call is not worth making every second.
GPM_GIVE_UP = 60


@dataclass
class Gpu(GpuInfo):
    """One GPU as the collector knows it, keyed by UUID (indices change across reboots)."""

    handle: Any = None
    unsupported: set[str] = field(default_factory=set)
    util_ts: int = 0  # newest NVML utilisation sample timestamp seen, µs
    use_samples: bool = True
    mem_v2: bool = True
    procs_v3: bool = True
    graphics_v3: bool = True
    event_reasons: bool = True
    transient_errors: int = 0
    gpm: GpmPair | None = None  # None: no GPM on this GPU (or not set up yet)
    gpm_failures: int = 0  # consecutive failed GPM ticks
    # MIG: the instances' state by MIG UUID (``GpuInfo.mig`` lists them for the push)
    inst: dict[str, Inst] = field(default_factory=dict)


@dataclass
class Inst:
    """One MIG instance as the collector reads it."""

    info: MigInstance
    handle: Any
    gpm: GpmPair | None = None
    gpm_failures: int = 0


def _sample_value(vtype: int, v: Any) -> float:
    if vtype == pynvml.NVML_VALUE_TYPE_DOUBLE:
        return float(v.dVal)
    if vtype == pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG:
        return float(v.ulVal)
    if vtype == pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG:
        return float(v.ullVal)
    if vtype == pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG:
        return float(v.sllVal)
    if vtype == pynvml.NVML_VALUE_TYPE_SIGNED_INT:
        return float(v.siVal)
    return float(v.uiVal)  # utilisation samples are documented as unsigned int


class Collector:
    """Reads every GPU once per tick and survives unsupported fields, lost GPUs and a
    driver that goes away. Times are seconds on the agent's clock (``now`` arguments)."""

    BACKOFF_MAX_S = 60.0

    def __init__(
        self,
        api: NvmlApi,
        *,
        clock: Callable[[], float] = time.time,
        workloads: Discovery | None = None,
    ) -> None:
        self.api = api
        self.workloads = workloads  # who holds each GPU; None: not asked (no workloads key)
        # the agent's clock: how far apart two GPM samples were taken (gpm.MIN_GAP_S)
        self.clock = clock
        self.gpus: dict[str, Gpu] = {}
        self.driver_version: str | None = None
        self.up = False
        self.discovered = False  # the GPUs have been listed once since the start
        self._next_init = 0.0
        self._init_failures = 0
        self._last_error: str | None = None

    # -- life cycle -------------------------------------------------------------------------

    def ensure(self, now: float) -> bool:
        """Initialise NVML and discover GPUs if needed; ``False`` while it is unavailable."""
        if self.up:
            return True
        if now < self._next_init:
            return False
        try:
            self.api.nvmlInit()
            self.driver_version = self.api.nvmlSystemGetDriverVersion()
            self._discover()
        except (pynvml.NVMLError, DriverGoneError) as e:
            self._went_down(now, e)
            return False
        if self._init_failures:
            log.warning("NVML is back after %d failed attempts", self._init_failures)
        self.up = self.discovered = True
        self._init_failures = 0
        self._last_error = None
        return True

    def shutdown(self) -> None:
        for g in self.gpus.values():
            self._gpm_drop(g)
        if self.up:
            try:
                self.api.nvmlShutdown()
            except pynvml.NVMLError:
                pass
            self.up = False

    def _went_down(self, now: float, err: BaseException) -> None:
        # Balance the earlier nvmlInit (NVML counts them) before initialising again.
        self.shutdown()
        for g in self.gpus.values():
            g.handle = None
        self._init_failures += 1
        delay = min(self.BACKOFF_MAX_S, 2.0 ** (self._init_failures - 1))
        self._next_init = now + delay
        cause = err.__cause__ if isinstance(err, DriverGoneError) and err.__cause__ else err
        log.error("NVML unavailable (%s); retrying in %.0f s", cause, delay)
        self._last_error = str(cause)

    def _discover(self) -> None:
        api = self.api
        count = api.nvmlDeviceGetCount()
        seen: set[str] = set()
        for index in range(count):
            try:
                h = api.nvmlDeviceGetHandleByIndex(index)
                uuid = api.nvmlDeviceGetUUID(h)
                name = api.nvmlDeviceGetName(h)
            except pynvml.NVMLError as e:
                kind = classify(e)
                if kind == DRIVER:
                    raise DriverGoneError(str(e)) from e
                log.error(
                    "GPU at index %d unusable at discovery (%s); reporting the others", index, e
                )
                continue
            seen.add(uuid)
            g = self.gpus.get(uuid)
            if g is None:
                g = self.gpus[uuid] = Gpu(uuid=uuid, index=index, name=name, handle=h)
                log.info("found GPU %d %s %s", index, uuid, name)
            else:
                if g.lost:
                    log.warning("GPU %s is back after re-initialisation", uuid)
                g.handle, g.index, g.name, g.lost = h, index, name, False
                g.util_ts = 0
            try:
                self._static(g)
            except GpuLostError as e:
                g.lost = True
                log.error("GPU %d %s lost at discovery (%s); reporting the others", index, uuid, e)
        for g in self.gpus.values():
            if g.uuid not in seen and not g.lost:
                g.lost = True
                log.error("GPU %s is gone after re-initialisation; reporting the others", g.uuid)

    def _static(self, g: Gpu) -> None:
        mem = self._mem(g)
        if mem is not None:
            g.memory_total_bytes = int(mem.total)
        limit = self._try(g, "power_limit", self.api.nvmlDeviceGetEnforcedPowerLimit, g.handle)
        if limit is not None:
            g.power_limit_w = round(limit / 1000.0, 1)  # NVML reports milliwatts
        self._gpm_start(g)
        if g.use_samples:
            # Set the sample cursor one second before the newest buffered sample: the first
            # tick then averages the last second, not the driver's whole buffer.
            try:
                _, samples = self.api.nvmlDeviceGetSamples(
                    g.handle, pynvml.NVML_GPU_UTILIZATION_SAMPLES, 0
                )
                if samples:
                    g.util_ts = max(int(s.timeStamp) for s in samples) - 1_000_000
            except pynvml.NVMLError as e:
                if classify(e) == UNSUPPORTED:
                    self._samples_off(g, e)  # at once: the first tick must not ask again
                else:
                    self._handle(g, "util_samples", e)

    def _samples_off(self, g: Gpu, e: BaseException) -> None:
        g.use_samples = False
        log.info(
            "GPU %d %s: utilisation samples unavailable (%s); using utilisation rates",
            g.index,
            g.uuid,
            e,
        )

    def inventory(self) -> list[dict[str, Any]]:
        return inventory(self.gpus.values())

    # -- one tick ---------------------------------------------------------------------------

    def read(self, now: float) -> TickResult:
        if not self.ensure(now):
            return TickResult({}, [], True)
        readings: dict[str, Reading] = {}
        lost: list[str] = []
        if self.workloads is not None:
            # lost GPUs too: an allocation naming one is not a file naming a GPU of another node
            self.workloads.begin(now, {g.uuid: g.index for g in self.gpus.values()})
        for g in self.gpus.values():
            if g.lost or g.handle is None:
                continue
            try:
                readings[g.uuid] = self._read_gpu(g)
            except GpuLostError as e:
                g.lost = True
                self._gpm_drop(g)
                lost.append(g.uuid)
                log.error(
                    "GPU %d %s lost (%s): no more samples for it; reporting the others",
                    g.index,
                    g.uuid,
                    e,
                )
            except DriverGoneError as e:
                self._went_down(now, e)
                return TickResult({}, lost, True)
        return TickResult(readings, lost, False)

    def _handle(self, g: Gpu, what: str, e: BaseException) -> None:
        """Classify an error from one call; raise for lost GPU / driver gone."""
        kind = classify(e) if isinstance(e, Exception) else TRANSIENT
        if kind == LOST:
            raise GpuLostError(str(e)) from e
        if kind == DRIVER:
            raise DriverGoneError(str(e)) from e
        if kind == UNSUPPORTED:
            if what not in g.unsupported:
                g.unsupported.add(what)
                log.info("GPU %d %s: %s not supported (%s); omitting it", g.index, g.uuid, what, e)
            return
        g.transient_errors += 1
        log.debug("GPU %d %s: %s failed (%s)", g.index, g.uuid, what, e)

    def _try(self, g: Gpu, what: str, fn: Any, *args: Any) -> Any:
        if what in g.unsupported:
            return None
        try:
            return fn(*args)
        except (pynvml.NVMLError, _MISMATCH) as e:
            self._handle(g, what, e)
            return None

    def _mem(self, g: Gpu) -> Any:
        api = self.api
        if g.mem_v2:
            try:
                # v2 does not count memory the driver reserves as used (v1 does)
                return api.nvmlDeviceGetMemoryInfo(g.handle, version=pynvml.nvmlMemory_v2)
            except pynvml.NVMLError as e:
                if classify(e) != UNSUPPORTED:
                    self._handle(g, "memory", e)
                    return None
                g.mem_v2 = False
                log.info("GPU %d %s: memory info v2 unavailable (%s); using v1", g.index, g.uuid, e)
        return self._try(g, "memory", api.nvmlDeviceGetMemoryInfo, g.handle)

    def _util_from_samples(self, g: Gpu) -> float | None:
        try:
            vtype, samples = self.api.nvmlDeviceGetSamples(
                g.handle, pynvml.NVML_GPU_UTILIZATION_SAMPLES, g.util_ts
            )
        except pynvml.NVMLError as e:
            if e.value == _NOT_FOUND:
                return 0.0  # no sample since the last tick: the GPU ran no kernel
            if classify(e) == UNSUPPORTED:
                self._samples_off(g, e)
                return None
            self._handle(g, "util_samples", e)
            return None
        fresh = [s for s in samples if int(s.timeStamp) > g.util_ts]
        if not fresh:
            return 0.0
        newest = max(int(s.timeStamp) for s in fresh)
        if g.util_ts == 0:
            # no cursor yet: keep only the last second of the driver's buffer
            fresh = [s for s in fresh if newest - int(s.timeStamp) < 1_000_000]
        g.util_ts = newest
        return sum(_sample_value(vtype, s.sampleValue) for s in fresh) / len(fresh)

    def _read_gpu(self, g: Gpu) -> Reading:
        api, h = self.api, g.handle
        r = Reading()
        insts = self._mig_scan(g)
        if insts is not None:
            # MIG mode: NVML reports no utilisation for the GPU (NOT_SUPPORTED), nor its
            # processes to an unprivileged caller; both come from the instances
            self._mig_read(g, insts, r)
        util: float | None = r.util
        if insts is None and g.use_samples:
            util = self._util_from_samples(g)
        rates = (
            None
            if insts is not None
            else self._try(g, "utilization", api.nvmlDeviceGetUtilizationRates, h)
        )
        if rates is not None:
            r.mem_util = float(rates.memory)
            if util is None:
                util = float(rates.gpu)
        r.util = util
        if util is None and not g.use_samples and "utilization" in g.unsupported:
            if "no_util" not in g.unsupported:
                g.unsupported.add("no_util")
                log.error(
                    "GPU %d %s: utilisation cannot be read (a MIG instance?); "
                    "no samples will be sent for it",
                    g.index,
                    g.uuid,
                )
        mem = self._mem(g)
        if mem is not None:
            r.mem_used = int(mem.used)
        compute: Sequence[Any] | None = None
        if insts is not None:
            pass  # the instances' processes (r.procs is their sum)
        elif g.procs_v3:
            try:
                compute = api.nvmlDeviceGetComputeRunningProcesses(h)
            except pynvml.NVMLError as e:
                self._handle(g, "procs", e)
            except _MISMATCH:
                g.procs_v3 = False  # driver older than the v3 process list
        if insts is None and not g.procs_v3:
            compute = self._try(g, "procs", api.nvmlDeviceGetComputeRunningProcesses_v2, h)
        if compute is not None:
            r.procs = len(compute)
            if self.workloads is not None:
                r.workloads = self._holders(g, compute)
        r.power_mw = self._try(g, "power", api.nvmlDeviceGetPowerUsage, h)
        r.energy_mj = self._try(g, "energy", api.nvmlDeviceGetTotalEnergyConsumption, h)
        r.temp_c = self._try(
            g, "temperature", api.nvmlDeviceGetTemperature, h, pynvml.NVML_TEMPERATURE_GPU
        )
        r.sm_clock_mhz = self._try(
            g, "sm_clock", api.nvmlDeviceGetClockInfo, h, pynvml.NVML_CLOCK_SM
        )
        if g.event_reasons and "throttle" not in g.unsupported:
            try:
                r.reasons = api.nvmlDeviceGetCurrentClocksEventReasons(h)
            except pynvml.NVMLError as e:
                if classify(e) == UNSUPPORTED:
                    g.event_reasons = False  # drivers before 535 only know the old name
                else:
                    self._handle(g, "throttle", e)
        if not g.event_reasons:
            r.reasons = self._try(g, "throttle", api.nvmlDeviceGetCurrentClocksThrottleReasons, h)
        if g.gpm is not None and insts is None:
            self._gpm_read(g, r)
        return r

    # -- MIG ----------------------------------------------------------------------------------

    def _mig_scan(self, g: Gpu) -> list[Inst] | None:
        """The GPU's MIG instances now, or ``None`` when it is not in MIG mode. Listed every
        tick (a few calls per instance): an instance destroyed or created mid-run is seen in
        the second it happens, so every second of every slice is accounted for."""
        api, h = self.api, g.handle
        if "mig" in g.unsupported:
            return None
        try:
            current = int(api.nvmlDeviceGetMigMode(h)[0])
        except (pynvml.NVMLError, _MISMATCH) as e:
            self._handle(g, "mig", e)  # raises for a lost GPU or a driver gone
            current = _MIG_DISABLE
        if current != _MIG_ENABLE:
            if g.mig is not None:
                log.warning("GPU %d %s: MIG mode is off; reading it as one GPU", g.index, g.uuid)
                self._mig_drop(g)
            return None
        if g.mig is None:
            g.mig_slices = self._mig_slices(g)
            g.mig = ()
            log.info(
                "GPU %d %s: MIG mode (%d slices): sending one sample per instance too",
                g.index,
                g.uuid,
                g.mig_slices,
            )
        try:
            count = int(api.nvmlDeviceGetMaxMigDeviceCount(h))
        except (pynvml.NVMLError, _MISMATCH) as e:
            self._handle(g, "mig_count", e)
            return list(g.inst.values())  # this second: the instances last seen
        found: dict[str, Inst] = {}
        for i in range(count):
            try:
                mh = api.nvmlDeviceGetMigDeviceHandleByIndex(h, i)
                uuid = api.nvmlDeviceGetUUID(mh)
                inst = g.inst.get(uuid)
                if inst is None:
                    inst = Inst(self._mig_info(mh, uuid), mh)
                    log.info(
                        "GPU %d %s: MIG instance %s (GPU instance %d, compute instance %d, %s)",
                        g.index,
                        g.uuid,
                        uuid,
                        inst.info.gi,
                        inst.info.ci,
                        inst.info.profile,
                    )
                else:
                    inst.handle = mh
            except pynvml.NVMLError as e:
                if e.value == _NOT_FOUND:
                    continue  # no instance at this index (NVML's answer for an empty slot)
                self._handle(g, "mig_device", e)
                continue
            found[uuid] = inst
        for uuid, inst in g.inst.items():
            if uuid not in found:
                log.info("GPU %d %s: MIG instance %s is gone", g.index, g.uuid, uuid)
                self._mig_gpm_drop(inst)
        g.inst = found
        g.mig = tuple(sorted((i.info for i in found.values()), key=lambda m: (m.gi, m.ci)))
        return list(found.values())

    def _mig_info(self, mh: Any, uuid: str) -> MigInstance:
        api = self.api
        gi = int(api.nvmlDeviceGetGpuInstanceId(mh))
        ci = int(api.nvmlDeviceGetComputeInstanceId(mh))
        attrs = api.nvmlDeviceGetAttributes(mh)
        slices = int(attrs.gpuInstanceSliceCount)
        memory_mb = int(attrs.memorySizeMB)
        return MigInstance(
            uuid=uuid,
            gi=gi,
            ci=ci,
            profile=mig_profile(slices, int(attrs.computeInstanceSliceCount), memory_mb),
            slices=slices,
            memory_mb=memory_mb,
        )

    def _mig_slices(self, g: Gpu) -> int:
        """The GPU's slices: those of its whole-GPU profile (7 on A100/H100/H200, 4 on an
        A30), 7 where NVML cannot say."""
        for profile in _WHOLE_GPU_PROFILES:
            try:
                info = self.api.nvmlDeviceGetGpuInstanceProfileInfo(g.handle, profile)
            except (pynvml.NVMLError, _MISMATCH):
                continue
            if int(info.sliceCount) > 0:
                return int(info.sliceCount)
        log.info("GPU %d %s: MIG profiles unreadable; taking 7 slices", g.index, g.uuid)
        return 7

    def _mig_drop(self, g: Gpu) -> None:
        for inst in g.inst.values():
            self._mig_gpm_drop(inst)
        g.inst = {}
        g.mig = None

    def _mig_gpm_drop(self, inst: Inst) -> None:
        if inst.gpm is not None:
            inst.gpm.free()
            inst.gpm = None

    def _mig_read(self, g: Gpu, insts: list[Inst], r: Reading) -> None:
        """Read each instance; fill the GPU's reading from them (``mig_combine``)."""
        api = self.api
        out: list[InstanceReading] = []
        for inst in insts:
            ir = Reading()
            mem = self._try(g, "mig_memory", api.nvmlDeviceGetMemoryInfo, inst.handle)
            if mem is not None:
                ir.mem_used = int(mem.used)
            compute = self._mig_procs(g, inst)
            if compute is not None:
                ir.procs = len(compute)
                if self.workloads is not None:
                    pids = dict.fromkeys(int(p.pid) for p in compute)
                    ir.workloads = self.workloads.holders(inst.info.uuid, pids)
            if g.gpm is not None and "mig_gpm" not in g.unsupported:
                self._mig_gpm_read(g, inst, ir)
            if ir.util is None:
                # no activity: air 0 (DESIGN §9.5: held or parked by processes); said once
                # where GPM per instance is missing, not for a new instance's first second
                # (GPM needs a pair of samples)
                if (g.gpm is None or "mig_gpm" in g.unsupported) and (
                    "mig_activity" not in g.unsupported
                ):
                    g.unsupported.add("mig_activity")
                    log.warning(
                        "GPU %d %s: no activity for its MIG instances (GPM per instance "
                        "unavailable); their time counts as held or parked by processes",
                        g.index,
                        g.uuid,
                    )
                ir.util = 0.0
            out.append(InstanceReading(inst.info, ir))
        mig_combine(r, out, g.mig_slices)

    def _mig_procs(self, g: Gpu, inst: Inst) -> Sequence[Any] | None:
        api = self.api
        if g.procs_v3:
            try:
                return api.nvmlDeviceGetComputeRunningProcesses(inst.handle)
            except pynvml.NVMLError as e:
                self._handle(g, "mig_procs", e)
                return None
            except _MISMATCH:
                g.procs_v3 = False
        procs: Sequence[Any] | None = self._try(
            g, "mig_procs", api.nvmlDeviceGetComputeRunningProcesses_v2, inst.handle
        )
        return procs

    def _mig_gpm_read(self, g: Gpu, inst: Inst, ir: Reading) -> None:
        """The instance's GPM metrics (``nvmlGpmMigSampleGet``); none where it fails."""
        try:
            if inst.gpm is None:
                inst.gpm = GpmPair(self.api, gi=inst.info.gi, metrics=MIG_METRICS)
            out = inst.gpm.take(g.handle, self.clock())
        except (pynvml.NVMLError, _MISMATCH) as e:
            kind = classify(e)
            if kind in (LOST, DRIVER):
                self._handle(g, "mig_gpm", e)  # raises
            if inst.gpm is not None:
                inst.gpm.restart()
            inst.gpm_failures += 1
            if kind == UNSUPPORTED or inst.gpm_failures >= GPM_GIVE_UP:
                for other in g.inst.values():
                    self._mig_gpm_drop(other)
                g.unsupported.add("mig_gpm")
                log.info("GPU %d %s: no GPM per MIG instance (%s)", g.index, g.uuid, e)
            return
        inst.gpm_failures = 0
        if out is None:
            return
        for (_, name), (value, _code) in zip(MIG_METRICS, out, strict=True):
            if value is not None:
                setattr(ir, name, value)

    # -- workloads ----------------------------------------------------------------------------

    def _holders(self, g: Gpu, compute: Sequence[Any]) -> tuple[Workload, ...] | None:
        """The workloads of the GPU's compute and graphics processes and of the allocations
        naming it; ``None`` when the graphics list failed this second."""
        assert self.workloads is not None
        graphics = self._graphics(g)
        if graphics is None:
            return None
        pids = dict.fromkeys(int(p.pid) for p in (*compute, *graphics))
        return self.workloads.holders(g.uuid, pids)

    def _graphics(self, g: Gpu) -> Sequence[Any] | None:
        """Graphics processes (a display or render client); ``()`` where the GPU or driver
        cannot list them (said once): compute processes are what data-centre GPUs run."""
        if "graphics_procs" in g.unsupported:
            return ()
        api, h = self.api, g.handle
        if g.graphics_v3:
            try:
                return api.nvmlDeviceGetGraphicsRunningProcesses(h)
            except pynvml.NVMLError as e:
                return self._graphics_failed(g, e)
            except _MISMATCH:
                g.graphics_v3 = False  # driver older than the v3 process list
        try:
            return api.nvmlDeviceGetGraphicsRunningProcesses_v2(h)
        except pynvml.NVMLError as e:
            return self._graphics_failed(g, e)

    def _graphics_failed(self, g: Gpu, e: pynvml.NVMLError) -> Sequence[Any] | None:
        self._handle(g, "graphics_procs", e)  # raises for a lost GPU or a driver gone
        return () if "graphics_procs" in g.unsupported else None

    # -- GPM --------------------------------------------------------------------------------

    def _gpm_start(self, g: Gpu) -> None:
        """Set GPM up on a GPU that supports it (at discovery, and after re-initialising)."""
        if g.gpm is not None or "gpm" in g.unsupported:
            return
        try:
            if not self.api.nvmlGpmQueryDeviceSupport(g.handle).isSupportedDevice:
                self._gpm_off(g, "this GPU has no GPM (Hopper or later)")
                return
            g.gpm = GpmPair(self.api)
        except (pynvml.NVMLError, _MISMATCH) as e:
            if classify(e) in (LOST, DRIVER):
                self._handle(g, "gpm", e)  # raises
            self._gpm_off(g, f"GPM unavailable ({e})")
            return
        g.gpm_failures = 0
        log.info("GPU %d %s: GPM on: sending SM, tensor and DRAM activity", g.index, g.uuid)

    def _gpm_off(self, g: Gpu, why: str) -> None:
        """No GPM on this GPU from now on (until NVML is initialised again, for failures)."""
        self._gpm_drop(g)
        g.unsupported.add("gpm")
        log.info(
            "GPU %d %s: %s; SM, tensor and DRAM activity are not sent for it",
            g.index,
            g.uuid,
            why,
        )

    def _gpm_drop(self, g: Gpu) -> None:
        if g.gpm is not None:
            g.gpm.free()
            g.gpm = None

    def _gpm_read(self, g: Gpu, r: Reading) -> None:
        """Fill ``r``'s profiling fields from GPM; leave them ``None`` where it fails."""
        assert g.gpm is not None
        try:
            out = g.gpm.take(g.handle, self.clock())
        except (pynvml.NVMLError, _MISMATCH) as e:
            g.gpm.restart()
            kind = classify(e)
            if kind in (LOST, DRIVER):
                self._handle(g, "gpm", e)  # raises
            if kind == UNSUPPORTED:
                self._gpm_off(g, f"GPM not supported ({e})")
                return
            g.gpm_failures += 1
            g.transient_errors += 1
            if "gpm_failed" not in g.unsupported:
                g.unsupported.add("gpm_failed")  # say it once per GPU, not every second
                log.warning(
                    "GPU %d %s: GPM failed (%s); SM, tensor and DRAM activity are left out "
                    "of the seconds it fails",
                    g.index,
                    g.uuid,
                    e,
                )
            if g.gpm_failures >= GPM_GIVE_UP:
                self._gpm_off(g, f"GPM failed {g.gpm_failures} seconds in a row ({e})")
                g.unsupported.discard("gpm")  # a failure, not a fact: try again after re-init
            return
        g.gpm_failures = 0
        if out is None:
            return
        for (metric_id, name), (value, code) in zip(METRICS, out, strict=True):
            if value is not None:
                setattr(r, name, value)
            elif f"gpm:{metric_id}" not in g.unsupported:
                g.unsupported.add(f"gpm:{metric_id}")
                log.info(
                    "GPU %d %s: GPM metric %d (%s) gave no value (NVML return %d); omitted "
                    "from the seconds it gives none",
                    g.index,
                    g.uuid,
                    metric_id,
                    name.removesuffix("_pct"),
                    code,
                )
