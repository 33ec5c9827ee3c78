"""A fake NVML and a deterministic GPU fleet simulator.

``FakeNvml`` implements the same calls as pynvml (``nvml.NvmlApi``), returns pynvml's own ctypes
structures and raises pynvml's own ``NVMLError`` subclasses, so the real collector runs on it
unchanged. ``FakeFleet`` builds nodes and GPUs from a spec (see docs/agent.md); ``simulate``
computes the same per-interval summaries analytically, without ticking every second, for
demos, tests and benchmarks.

Every GPU follows a workload pattern evaluated per minute (a pure function of the GPU's seed
and the minute), with a small zero-sum jitter inside the minute: utilisation alternates
``+j, -j`` second by second, power ``+2 W, -2 W``. The analytic path adds the same seconds up
in closed form, so for any interval the tick-by-tick agent and ``simulate`` produce the same
sample (asserted in tests/agent/test_agent_fake.py).

Workloads (docs/agent.md): GPUs of a group with ``workloads=1`` say who holds them. Each pattern
has its story: training, starved and batch GPUs run Slurm jobs, inference GPUs Kubernetes pods,
notebook GPUs a user's kernel, and ``hog`` GPUs belong to one Slurm job that holds every GPU of
its node by allocation and computes on GPU 0 only. The fake NVML lists one process per workload
with a process on the GPU (:class:`FakeProcesses` maps its pid back), :class:`FakeAllocations`
gives the allocations; ``simulate`` adds the same shares in closed form. Names, users, accounts
and job ids are pure functions of the seed, the GPU and the time.

GPM: GPUs of a model that has it (Hopper: H100, H200), in a group with ``gpm=1``, answer
``nvmlGpmQueryDeviceSupport`` with 1 and report SM, tensor and DRAM activity derived from their
pattern; every other GPU answers 0. ``FakeNvml(..., gpm_library=False)`` is a library without
GPM (old drivers, NVIDIA's mock NVML): every GPM call raises ``FUNCTION_NOT_FOUND``.
"""

from __future__ import annotations

import ctypes
import json
import math
import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pynvml

from . import __version__
from .source import Workload
from .summarise import (
    REASON_GPU_IDLE,
    Accumulator,
    WorkloadSum,
    finalise,
    hold,
    iso,
    workloads_wire,
)
from .workloads import Allocation, Discovery

_M64 = (1 << 64) - 1


def _mix(*xs: int) -> int:
    """splitmix64 over a tuple of integers: deterministic across runs and Python versions."""
    h = 0x9E3779B97F4A7C15
    for x in xs:
        h = (h ^ (x & _M64)) * 0xBF58476D1CE4E5B9 & _M64
        h ^= h >> 31
        h = h * 0x94D049BB133111EB & _M64
        h ^= h >> 29
    return h


def _unit(*xs: int) -> float:
    return _mix(*xs) / 18446744073709551616.0


def _noise(key: int, m: int) -> int:
    """A cheap per-minute hash (one splitmix round): the simulator calls it for every sample."""
    h = (key ^ (m * 0x9E3779B97F4A7C15)) & _M64
    h = (h ^ (h >> 30)) * 0xBF58476D1CE4E5B9 & _M64
    return h ^ (h >> 27)


# ---------------------------------------------------------------------------------------------
# GPU model catalogue (reference figures of fleet/catalogue.py: NVIDIA product briefs and
# published nvidia-smi captures).
# held_w: a process holds memory, no kernel runs. load_w: ~full load.
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuModel:
    key: str
    name: str  # exactly what nvmlDeviceGetName returns
    memory_mib: int  # what nvidia-smi shows as total
    max_w: float  # default power limit
    idle_w: float
    held_w: float
    load_w: float
    clock_max_mhz: int
    clock_idle_mhz: int
    gpm: bool = False  # NVML GPM: Hopper and later

    @property
    def memory_total_bytes(self) -> int:
        return self.memory_mib * 1024 * 1024


MODELS: dict[str, GpuModel] = {
    m.key: m
    for m in (
        GpuModel("H100", "NVIDIA H100 80GB HBM3", 81559, 700, 69, 115, 629, 1980, 345, True),
        GpuModel("H100-PCIE", "NVIDIA H100 PCIe", 81559, 350, 48, 80, 310, 1755, 345, True),
        GpuModel("H200", "NVIDIA H200", 143771, 700, 77, 125, 628, 1980, 345, True),
        GpuModel("A100", "NVIDIA A100-SXM4-80GB", 81920, 400, 50, 85, 360, 1410, 210),
        GpuModel("A100-PCIE", "NVIDIA A100 80GB PCIe", 81920, 300, 40, 70, 260, 1410, 210),
        GpuModel("L40S", "NVIDIA L40S", 46068, 350, 35, 80, 300, 2520, 210),
        GpuModel("L4", "NVIDIA L4", 23034, 72, 16, 28, 65, 2040, 210),
        GpuModel("A40", "NVIDIA A40", 46068, 300, 30, 110, 280, 1740, 210),
        GpuModel("RTX4090", "NVIDIA GeForce RTX 4090", 24564, 450, 20, 63, 400, 2520, 210),
        GpuModel(
            "RTX6000ADA", "NVIDIA RTX 6000 Ada Generation", 49140, 300, 25, 70, 280, 2505, 210
        ),
    )
}
_ALIASES = {
    "H100-SXM": "H100",
    "H100-SXM5": "H100",
    "H200-SXM": "H200",
    "A100-SXM": "A100",
    "A100-SXM4": "A100",
    "4090": "RTX4090",
    "RTX-4090": "RTX4090",
    "RTX6000": "RTX6000ADA",
    "RTX-6000-ADA": "RTX6000ADA",
}


def model(key: str) -> GpuModel:
    k = key.strip().upper().replace("_", "-")
    k = _ALIASES.get(k, k)
    if k not in MODELS:
        raise ValueError(f"unknown GPU model {key!r}; known: {', '.join(MODELS)}")
    return MODELS[k]


PATTERNS = ("training", "inference", "batch", "notebook", "parked", "starved", "hog", "mixed")
# What the training loops of ``jobs=1`` groups report (FakeGpu.job): the model's name, MFU,
# data-starved share and tokens per second per GPU. The starved run's GPU is busy 26–34 % of
# the time (its utilisation); its loop says why: it waits on its data loader 55 % of the time.
JOB_PATTERNS: dict[str, tuple[str, float, float, float]] = {
    "training": ("llama-3-8b", 0.52, 0.06, 3100.0),
    "starved": ("vit-h-14", 0.18, 0.55, 900.0),
}
# Dense bf16 peaks per second of the fake's models (telemetry.efficiency has the server's table)
JOB_PEAKS = {"H100": 989e12, "H200": 989e12, "A100": 312e12, "L40S": 362e12}
JOB_CKPT_EVERY_MIN, JOB_CKPT_MIN = 120, 2  # the runs' checkpoint stall (PatternGpu._runs)
JOB_CKPT_BYTES = 32e9  # one GPU's share of a checkpoint
JOB_TOKENS_PER_STEP = 16384.0
JOB_TOKENS_PER_SAMPLE = 2048.0
_MIXED_CHOICES = ("training", "training", "inference", "notebook", "batch", "parked", "inference")
DRIVER_VERSION = "550.54.15"

# Seconds-of-day profile for diurnal inference: 1 at 14:00 UTC, 0 at 02:00 UTC.
_DIURNAL = [0.5 + 0.5 * math.cos(2 * math.pi * (m / 60.0 - 14.0) / 24.0) for m in range(1440)]

# One minute's state: util %, mem util %, mem used B, procs, power mW, temp °C, SM MHz,
# and the seconds (from the start of the minute) with power-cap, thermal, hw-slowdown events.
Minute = tuple[int, int, int, int, int, int, int, int, int, int]

_P_POWER = int(pynvml.nvmlClocksThrottleReasonSwPowerCap)
_P_THERMAL = int(pynvml.nvmlClocksThrottleReasonSwThermalSlowdown)
_P_HW = int(pynvml.nvmlClocksThrottleReasonHwSlowdown)

# One second's GPM metrics, in the order of gpm.METRICS: SM active, SM occupancy, any tensor
# active, DRAM bandwidth, each in % (None: the GPU does not give that metric).
Prof = tuple[int | None, int | None, int | None, int | None]
_NO_PROF: Prof = (None, None, None, None)
_GPM_INDEX = {
    int(pynvml.NVML_GPM_METRIC_SM_UTIL): 0,
    int(pynvml.NVML_GPM_METRIC_SM_OCCUPANCY): 1,
    int(pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL): 2,
    int(pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL): 3,
    int(pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL): 4,  # MIG instances only (_mig_prof)
}


def _mig_prof(util: float | None) -> Any:
    """A MIG instance's GPM metrics in a second of graphics utilisation ``util`` %: SM
    activity 80 % of it, occupancy 50 %, tensor 60 %, DRAM 40 % (all ``None`` without)."""
    if util is None:
        return (None, None, None, None, None)
    return (util * 0.8, util * 0.5, util * 0.6, util * 0.4, util)


# pattern → (SM active per point of utilisation, tensor and occupancy as shares of SM active),
# all in %: kernels that run most of the time yet keep only part of the SMs busy, the gap
# the work figures (docs/agent.md, GPM) exist to show.
_PROF_SHAPE = {
    "training": (62, 70, 45),
    "inference": (40, 50, 35),
    "batch": (68, 20, 50),
    "notebook": (30, 10, 25),
    "parked": (0, 0, 0),
    "starved": (62, 70, 45),
    "hog": (62, 70, 45),
}

# Who the fake workloads are (docs/agent.md), picked per GPU and time from the seed.
_USERS = ("alice", "bob", "chen", "dana", "emeka", "farah", "goran", "hana", "ivan", "jun")
_ACCOUNTS = ("nlp", "vision", "speech", "recsys")
_TRAIN_NAMES = ("train-llm", "pretrain-vit", "finetune-7b", "asr-conformer", "dlrm-sweep")
_STARVED_NAMES = ("train-video-diffusion", "pretrain-multimodal")
_BATCH_NAMES = ("nightly-eval", "embed-corpus", "batch-infer")
_HOG_NAMES = ("llm-sweep-8gpu",)
_SERVICES = (("inference", "vllm-llama3-70b"), ("search", "triton-embed"), ("chat", "tgi-mixtral"))
# the characters Kubernetes uses for the random suffix of a pod name
_POD_CHARS = "bcdfghjklmnpqrstvwxz2456789"
# Slurm job ids: period × 10,000 + kind × 1,000 + the GPU's ordinal (below 1,000), so two jobs
# never share an id (the server identifies a workload by site, kind and id).
_RUN, _RESERVATION, _BATCH, _HOG = 0, 1, 2, 3
_POD, _NOTEBOOK = 4, 5  # not Slurm jobs: no id of this form
_NO_HOLDERS: tuple[tuple[Workload, ...], tuple[Workload, ...]] = ((), ())


def _pick(options: Sequence[Any], *xs: int) -> Any:
    return options[_mix(*xs) % len(options)]


def _slurm_job(key: int, ordinal: int, kind: int, period: int, names: Sequence[str]) -> Workload:
    """A Slurm job of one kind (a run, a reservation, a nightly batch, the hog) in one period."""
    return Workload(
        "slurm",
        str(period * 10_000 + kind * 1000 + ordinal % 1000),
        user=_pick(_USERS, key, kind, period, 1),
        account=_pick(_ACCOUNTS, key, kind, period, 2),
        name=_pick(names, key, kind, period, 3),
    )


# ---------------------------------------------------------------------------------------------
# GPUs
# ---------------------------------------------------------------------------------------------


class FakeGpu:
    """One simulated GPU. Subclasses say what happens in each second."""

    def __init__(
        self,
        uuid: str,
        index: int,
        gpu_model: GpuModel,
        *,
        lost_at: int | None = None,
        resets: Sequence[int] = (),
        unsupported: Sequence[str] = (),
        old_driver: bool = False,
        gpm: bool = False,
        gpm_fail: Sequence[tuple[int, int]] = (),
        mig: Sequence[tuple[int, Sequence[str]]] = (),
        mig_script: Callable[[int, int], tuple[float | None, Sequence[int]]] | None = None,
    ) -> None:
        """``mig``: the GPU is in MIG mode, its instances from each second on (a layout of
        profile names of :data:`MIG_PROFILES_H100`, replaced by the next entry: a
        reconfiguration); ``mig_script(t, gi)``: the instance's activity in second ``t``
        (GPM graphics utilisation in %, or ``None`` for none) and its compute processes."""
        self.mig = sorted((int(at), tuple(layout)) for at, layout in mig)
        self.mig_script = mig_script
        self.uuid = uuid
        self.index = index
        self.model = gpu_model
        self.lost_at = lost_at  # readings at a second > lost_at raise GpuIsLost
        self.resets = sorted(resets)  # energy counter restarts from 0 at these seconds
        self.unsupported = frozenset(unsupported)
        self.old_driver = old_driver
        self.gpm = gpm  # nvmlGpmQueryDeviceSupport says 1
        self.gpm_fail = list(gpm_fail)  # [a, b): nvmlGpmSampleGet raises NVMLError_Unknown
        self.memory_total = gpu_model.memory_total_bytes
        # memory the driver reserves: counted as used by memory info v1, not by v2
        self.reserved = self.memory_total // 160
        self._e_load: int | None = None  # second the counter's running sum starts from
        self._e_t = 0
        self._e_val = 0

    # -- to override ------------------------------------------------------------------------

    def second(self, t: int) -> tuple[int, int, int, int, int, int, int, int]:
        """State during second ``[t, t+1)``: util %, mem util %, mem used B, procs, power mW,
        temp °C, SM clock MHz, clocks-event reason bits."""
        raise NotImplementedError

    def prof(self, t: int) -> Prof:
        """GPM metrics over second ``[t, t+1)``, in % (only asked of GPUs with ``gpm``)."""
        return _NO_PROF

    def compute_pids(self, t: int) -> Sequence[int] | None:
        """The compute processes in second ``t``; ``None``: as many as ``second(t)`` counts,
        or one per workload with a process (:meth:`holders`)."""
        return None

    def graphics_pids(self, t: int) -> Sequence[int]:
        return ()

    def holders(self, t: int) -> tuple[tuple[Workload, ...], tuple[Workload, ...]] | None:
        """Who holds the GPU in second ``t``: (workloads with a process on it, workloads
        holding it by allocation alone); ``None`` where the GPU does not say."""
        return None

    # -- MIG -------------------------------------------------------------------------------

    def mig_at(self, t: int) -> tuple[FakeMigInstance, ...] | None:
        """The MIG instances in second ``t``; ``None`` when the GPU is not in MIG mode."""
        if not self.mig:
            return None
        layout: tuple[int, tuple[str, ...]] | None = None
        for entry in self.mig:
            if entry[0] <= t:
                layout = entry
        if layout is None:
            return ()
        return _mig_instances(self.uuid, *layout)

    def mig_activity(self, t: int, gi: int) -> tuple[float | None, Sequence[int]]:
        return self.mig_script(t, gi) if self.mig_script is not None else (None, ())

    # -- energy counter ---------------------------------------------------------------------

    def energy_offset(self) -> int:
        return (_mix(len(self.uuid), hash_str(self.uuid)) % 10**9) * 1000  # mJ since load

    def energy_mj(self, t: int) -> int:
        """The NVML counter read at second ``t``: mJ since the driver loaded (or last reset)."""
        load = max((r for r in self.resets if r <= t), default=None)
        origin = -1 if load is None else load
        if self._e_load != origin or t < self._e_t:
            if load is None:
                # no reset yet: the counter was already running when first read
                self._e_load, self._e_t, self._e_val = -1, t, self.energy_offset()
            else:
                self._e_load, self._e_t, self._e_val = load, load, 0
        while self._e_t < t:
            self._e_val += self.second(self._e_t)[4]  # mW × 1 s = mJ
            self._e_t += 1
        return self._e_val

    def window(self, w0: int, w1: int) -> dict[str, Any] | None:
        """The sample the agent would send for ``[w0, w1)``, computed without ticking."""
        raise NotImplementedError


def hash_str(s: str) -> int:
    h = 0
    for ch in s.encode():
        h = _mix(h, ch)
    return h


class ScriptedGpu(FakeGpu):
    """A GPU whose every second a test spells out: ``script(t)`` returns the tuple of
    :meth:`FakeGpu.second`. ``energy(t)``, when given, is the raw counter read at ``t``
    (so a test can make it disagree with power, or go backwards)."""

    def __init__(
        self,
        uuid: str,
        index: int,
        gpu_model: GpuModel,
        script: Callable[[int], tuple[int, int, int, int, int, int, int, int]],
        *,
        energy: Callable[[int], int] | None = None,
        prof: Callable[[int], Prof] | None = None,
        pids: Callable[[int], Sequence[int]] | None = None,
        graphics: Callable[[int], Sequence[int]] | None = None,
        **kw: Any,
    ) -> None:
        """``prof(t)``, when given, makes the GPU one with GPM and says its metrics;
        ``pids(t)`` / ``graphics(t)`` the compute / graphics processes NVML lists."""
        super().__init__(uuid, index, gpu_model, gpm=prof is not None, **kw)
        self._script = script
        self._energy = energy
        self._prof = prof
        self._pids = pids
        self._graphics = graphics

    def second(self, t: int) -> tuple[int, int, int, int, int, int, int, int]:
        return self._script(t)

    def energy_mj(self, t: int) -> int:
        if self._energy is not None:
            return self._energy(t)
        return super().energy_mj(t)

    def prof(self, t: int) -> Prof:
        return self._prof(t) if self._prof is not None else _NO_PROF

    def compute_pids(self, t: int) -> Sequence[int] | None:
        return self._pids(t) if self._pids is not None else None

    def graphics_pids(self, t: int) -> Sequence[int]:
        return self._graphics(t) if self._graphics is not None else ()


class PatternGpu(FakeGpu):
    """A GPU following a workload pattern, evaluated minute by minute."""

    def __init__(
        self,
        uuid: str,
        index: int,
        gpu_model: GpuModel,
        pattern: str,
        key: int,
        *,
        power_throttle: bool = False,
        workloads: bool = False,
        jobs: bool = False,
        ordinal: int = 0,
        node_key: int = 0,
        node_ordinal: int = 0,
        **kw: Any,
    ) -> None:
        """``workloads``: say who holds the GPU (:meth:`holders`); ``ordinal`` numbers the GPU
        in its fleet, ``node_key`` / ``node_ordinal`` its node (for the workloads' ids)."""
        super().__init__(uuid, index, gpu_model, **kw)
        if pattern == "mixed":
            pattern = _MIXED_CHOICES[_mix(key, 9) % len(_MIXED_CHOICES)]
        if pattern not in PATTERNS:
            raise ValueError(f"unknown pattern {pattern!r}; known: {', '.join(PATTERNS)}")
        self.pattern = pattern
        self.key = key
        self.power_throttle = power_throttle
        self.workloads = workloads
        self.jobs = jobs and workloads and pattern in JOB_PATTERNS
        self.ordinal = ordinal
        self.node_key = node_key
        self.node_ordinal = node_ordinal
        self._hm = -1
        self._hv = _NO_HOLDERS
        self._who_cache: dict[tuple[int, int], Workload] = {}  # (kind, period) → workload
        self._slots: dict[int, bool] = {}
        self._day = -1
        self._begin = self._length = 0
        self._m = -1
        self._mv: Minute = (0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
        m = gpu_model
        self._cap_w = 0.75 * m.max_w  # a rack power budget below the board limit
        self._ambient = 38 if power_throttle else 30  # the throttling node also runs hot
        self._mem_frac = {
            "training": 0.92,
            "inference": 0.6 + 0.15 * _unit(key, 6),
            "batch": 0.7,
            "notebook": 0.25 + 0.2 * _unit(key, 6),
            "parked": 0.0,
            "starved": 0.92,
            "hog": 0.92 if index == 0 else 0.0,
        }[pattern]
        self._fn = {
            "training": self._training,
            "inference": self._inference,
            "batch": self._batch,
            "notebook": self._notebook,
            "parked": self._parked,
            "starved": self._starved,
            "hog": self._hog,
        }[pattern]

    # each returns (util %, procs, memory fraction, hash for noise)

    def _busy_slot(self, slot: int) -> bool:
        b = self._slots.get(slot)
        if b is None:
            if len(self._slots) > 4096:
                self._slots.clear()
            b = self._slots[slot] = _unit(self.key, 1, slot) < 0.82
        return b

    def _training(self, m: int) -> tuple[int, int, float, int]:
        return self._runs(m, 90)

    def _starved(self, m: int) -> tuple[int, int, float, int]:
        return self._runs(m, 26)  # training that waits on its data loader: 26–34 %

    def _runs(self, m: int, util: int) -> tuple[int, int, float, int]:
        key = self.key
        slot = m // 360  # 6-hour slots; a run lasts as long as consecutive busy slots
        h = _noise(key, m)
        if self._busy_slot(slot):
            if m % 360 < 8 and not self._busy_slot(slot - 1):
                return 3, 1, 0.55, h  # job start: loading data and weights
            if m % 120 >= 118:
                return 0, 1, self._mem_frac, h  # checkpoint stall every two hours
            return util + h % 9, 1, self._mem_frac, h
        if self._reserved(slot):
            return 0, 1, 0.35, h  # reserved between runs, nothing computing
        return 0, 0, 0.0, h

    def _reserved(self, slot: int) -> bool:
        return _unit(self.key, 3, slot) < 0.3

    def _hog(self, m: int) -> tuple[int, int, float, int]:
        # one job holds every GPU of the node and computes on GPU 0 only
        h = _noise(self.key, m)
        if self.index:
            return 0, 0, 0.0, h
        if m % 120 >= 118:
            return 0, 1, self._mem_frac, h  # checkpoint stall every two hours
        return 90 + h % 9, 1, self._mem_frac, h

    def _inference(self, m: int) -> tuple[int, int, float, int]:
        h = _noise(self.key, m)
        weekend = ((m // 1440) + 3) % 7 >= 5  # 1970-01-01 was a Thursday
        d = _DIURNAL[m % 1440] * (0.6 if weekend else 1.0)
        u = int(8 + 57 * d) + int(h % 11) - 5
        return max(0, min(100, u)), 1, self._mem_frac, h

    def _batch(self, m: int) -> tuple[int, int, float, int]:
        day, mod = divmod(m, 1440)
        h = _noise(self.key, m)
        if self._day != day:
            self._day = day
            self._begin = 60 + int(_unit(self.key, 4, day) * 60)  # 01:00–02:00 UTC
            self._length = 180 + int(_unit(self.key, 5, day) * 90)  # 3–4.5 h
        begin, length = self._begin, self._length
        if begin <= mod < begin + length:
            return 85 + h % 15, 1, self._mem_frac, h
        return 0, 0, 0.0, h

    def _notebook(self, m: int) -> tuple[int, int, float, int]:
        # A kernel left running holds memory all the time; a rare cell runs in office hours.
        h = _noise(self.key, m)
        mod = m % 1440
        weekday = ((m // 1440) + 3) % 7 < 5
        if weekday and 540 <= mod < 1080 and h % 1000 < 40:
            return 20 + (h >> 10) % 60, 1, self._mem_frac, h
        return 0, 1, self._mem_frac, h

    def _parked(self, m: int) -> tuple[int, int, float, int]:
        return 0, 0, 0.0, _noise(self.key, m)

    def minute(self, m: int) -> Minute:
        if m == self._m:
            return self._mv
        u, procs, mem_frac, h = self._fn(m)
        gm = self.model
        if procs:
            p = gm.held_w + (gm.load_w - gm.held_w) * u / 100.0
        else:
            p = gm.idle_w + (gm.load_w - gm.idle_w) * u / 100.0
        p *= 1.0 + 0.02 * (((h >> 8) % 1000) / 1000.0 - 0.5)  # ±1 % noise
        clock = gm.clock_max_mhz if u > 0 else gm.clock_idle_mhz
        k_pow = k_th = 0
        if self.power_throttle and p > self._cap_w:
            ratio = self._cap_w / p
            p = self._cap_w
            k_pow = 30 + (h >> 20) % 31  # 30–60 s of the minute at the cap
            clock = int(gm.clock_max_mhz * (0.7 + 0.3 * ratio))
        temp = int(self._ambient + 50 * p / gm.max_w) + (h >> 30) % 3
        if temp >= 87:
            k_th = min(60, (temp - 86) * 10)
        mem_used = int(self.memory_total * mem_frac) if mem_frac else 0
        mem_util = int(u * 0.45)
        v: Minute = (u, mem_util, mem_used, procs, int(p * 1000), temp, clock, k_pow, k_th, 0)
        self._m, self._mv = m, v
        return v

    def second(self, t: int) -> tuple[int, int, int, int, int, int, int, int]:
        u, mu, mem, procs, p, temp, clock, kp, kt, kh = self.minute(t // 60)
        s = t % 60
        sign = 1 if s % 2 == 0 else -1
        j = min(2, u, 100 - u)
        jp = 2000 if p >= 4000 else 0
        util = u + sign * j
        bits = 0
        if s < kp:
            bits |= _P_POWER
        if s < kt:
            bits |= _P_THERMAL
        if s < kh:
            bits |= _P_HW
        if util == 0:
            bits |= REASON_GPU_IDLE
        return util, mu, mem, procs, p + sign * jp, temp, clock, bits

    def prof(self, t: int) -> Prof:
        """Constant within the minute (no jitter), so the closed form adds them up exactly."""
        if not self.gpm:
            return _NO_PROF
        u, mu = self.minute(t // 60)[:2]
        per_util, tensor, occupancy = _PROF_SHAPE[self.pattern]
        sm = u * per_util // 100
        return sm, sm * occupancy // 100, sm * tensor // 100, mu

    # -- who holds it -----------------------------------------------------------------------

    def holders(self, t: int) -> tuple[tuple[Workload, ...], tuple[Workload, ...]] | None:
        """Constant within the minute; one workload with a process whenever the pattern has a
        process on the GPU (so ``procs`` and the process list agree)."""
        if not self.workloads:
            return None
        m = t // 60
        if m != self._hm:
            self._hm, self._hv = m, self._who(m, self.minute(m)[3])
        return self._hv

    def _who(self, m: int, procs: int) -> tuple[tuple[Workload, ...], tuple[Workload, ...]]:
        pattern = self.pattern
        if pattern == "hog":
            job = self._cached(_HOG, m // 2880)  # the node's job, resubmitted every two days
            return ((job,) if procs else ()), (job,)
        if not procs:
            return _NO_HOLDERS
        if pattern in ("training", "starved"):
            slot = m // 360
            return (self._cached(_RUN if self._busy_slot(slot) else _RESERVATION, slot),), ()
        if pattern == "batch":
            return (self._cached(_BATCH, m // 1440),), ()
        if pattern == "inference":
            return (self._cached(_POD, m // 10080),), ()  # a model server, redeployed weekly
        return (self._cached(_NOTEBOOK, 0),), ()  # a user's kernel, on no scheduler

    def _cached(self, kind: int, period: int) -> Workload:
        w = self._who_cache.get((kind, period))
        if w is None:
            if len(self._who_cache) >= 1024:
                self._who_cache.clear()
            w = self._who_cache[(kind, period)] = self._workload(kind, period)
        return w

    def _workload(self, kind: int, period: int) -> Workload:
        key, ordinal = self.key, self.ordinal
        if kind == _HOG:
            return _slurm_job(self.node_key, self.node_ordinal, _HOG, period, _HOG_NAMES)
        if kind == _RUN:
            names = _TRAIN_NAMES if self.pattern == "training" else _STARVED_NAMES
            return _slurm_job(key, ordinal, _RUN, self._run_start(period), names)
        if kind == _RESERVATION:
            return _slurm_job(key, ordinal, _RESERVATION, period, ("interactive",))
        if kind == _BATCH:
            return _slurm_job(key, ordinal, _BATCH, period, _BATCH_NAMES)
        if kind == _POD:
            namespace, deployment = _pick(_SERVICES, key, 7)
            replicaset = f"{_mix(key, 8, period) % 16**9:09x}"
            x = _mix(key, 9, period)
            suffix = "".join(_POD_CHARS[(x >> (6 * i)) % len(_POD_CHARS)] for i in range(5))
            return Workload(
                "k8s", f"{namespace}/{deployment}-{replicaset}-{suffix}", account=namespace
            )
        user = _pick(_USERS, key, 10)
        return Workload("user", user, user=user)

    def _run_start(self, slot: int) -> int:
        """The first slot of the run that ``slot`` is part of (consecutive busy slots)."""
        start = slot
        while self._busy_slot(start - 1) and slot - start < 400:
            start -= 1
        return start

    def _held(self, t: int) -> tuple[Workload, ...]:
        """Every workload holding the GPU in second ``t`` (processes and allocations)."""
        held = self.holders(t)
        if held is None:
            return ()
        procs, allocs = held
        return procs + tuple(w for w in allocs if w not in procs)

    def job(self, w0: int, w1: int) -> dict[str, Any] | None:
        """The job sums the agent would add to this GPU's sample for ``[w0, w1)`` where its
        run's training loop reports through gpufleet_hook (``jobs=1``; training and starved
        GPUs only): per minute of a run, the loop's wall time, of it the checkpoint every two
        hours (its stall minutes) and, in the other minutes, the data wait and compute that
        make the run's shares over a two-hour cycle those of :data:`JOB_PATTERNS`, and the
        flops of its MFU at the GPU's dense bf16 peak. ``None`` outside runs."""
        if not self.jobs:
            return None
        name, mfu, starved, tokens_s = JOB_PATTERNS[self.pattern]
        peak = JOB_PEAKS.get(self.model.key)
        # 118 of every 120 minutes compute or wait; 2 checkpoint: the cycle's shares
        scale = JOB_CKPT_EVERY_MIN / (JOB_CKPT_EVERY_MIN - JOB_CKPT_MIN)
        wall = ckpt = wait = flops = tokens = 0.0
        for m in range(w0 // 60, (w1 + 59) // 60):
            n = min(w1, m * 60 + 60) - max(w0, m * 60)
            if n <= 0 or not self._busy_slot(m // 360):
                continue
            wall += n
            if m % JOB_CKPT_EVERY_MIN >= JOB_CKPT_EVERY_MIN - JOB_CKPT_MIN:
                ckpt += n
                continue
            wait += min(n, starved * n * scale)
            tokens += tokens_s * n * scale
            if peak is not None:
                flops += mfu * peak * n * scale
        if not wall:
            return None
        out: dict[str, Any] = {
            "model": name,
            "wall_s": wall,
            "steps": round(tokens / JOB_TOKENS_PER_STEP, 3),
            "samples": round(tokens / JOB_TOKENS_PER_SAMPLE, 3),
            "tokens": round(tokens, 3),
            "data_wait_s": round(wait, 3),
            "compute_s": round(wall - ckpt - wait, 3),
            "ckpt_s": ckpt,
            "ckpt_bytes": JOB_CKPT_BYTES * ckpt / (60 * JOB_CKPT_MIN),
        }
        if peak is not None:
            out["flops"] = flops
        return out

    def window(self, w0: int, w1: int) -> dict[str, Any] | None:
        """The sample the agent would send for ``[w0, w1)``, in closed form."""
        if (
            w1 - w0 == 60
            and w0 % 60 == 0
            and not self.unsupported
            and not self.old_driver
            and not self.gpm
            and (self.lost_at is None or self.lost_at >= w1)
        ):
            # The common case, one whole minute, written out: what finalise() computes from
            # the sums below when every second of the minute is there (the jitter cancels).
            u, mu, mem, procs, p, temp, clock, kp, kt, kh = self.minute(w0 // 60)
            e: float = p * 60
            for r in self.resets:
                if w0 <= r - 1 < w1:
                    e = e / 60 * 60  # the counter went backwards: mean power × seconds
            s: dict[str, Any] = {
                "gpu": self.uuid,
                "start": iso(w0),
                "seconds": 60,
                "util_pct": float(u),
                "mem_util_pct": float(mu),
                "mem_used_bytes": mem,
                "procs": procs,
                "power_w": round(p / 1000.0, 2),
                "energy_j": round(e / 1000.0, 3),
                "temp_c": temp,
                "sm_clock_mhz": clock,
                "throttle_s": {
                    "power_cap": kp,
                    "thermal": kt,
                    "hw_slowdown": kh,
                    "other": 0,
                    "any": max(kp, kt, kh),
                },
            }
            if self.workloads:
                sums: dict[tuple[str, str], WorkloadSum] = {}
                held = self._held(w0)
                if held:
                    hold(sums, held, float(u * 60), 60)  # the jitter cancels over the minute
                s["workloads"] = workloads_wire(sums, 60, self.uuid)
            return s
        return self.window_generic(w0, w1)

    def window_generic(self, w0: int, w1: int) -> dict[str, Any] | None:
        """:meth:`window` for any span, through the same sums and rounding as the agent."""
        if self.lost_at is not None:
            w1 = min(w1, self.lost_at)
        if w1 <= w0:
            return None
        acc = Accumulator(w0)
        uns = self.unsupported
        old = self.old_driver
        # who holds it, where the process list can be read (else the agent cannot tell)
        who = self.workloads and "procs" not in uns
        util_n = thr_n = 0
        util_sum = mu_sum = power_sum = clock_sum = 0
        thr = [0, 0, 0, 0, 0]
        mem_max = procs_max = temp_max = -1
        m = w0 // 60
        t = w0
        while t < w1:
            base = m * 60
            a = t - base
            b = min(w1, base + 60) - base
            n = b - a
            alt = (b & 1) - (a & 1)  # Σ over s in [a, b) of (+1 for even s, −1 for odd)
            u, mu, mem, procs, p, temp, clock, kp, kt, kh = self.minute(m)
            j = min(2, u, 100 - u)
            jp = 2000 if p >= 4000 else 0
            util_sum += u * n + j * alt
            util_n += n
            if who:
                held = self._held(base)
                if held:
                    hold(acc.wl, held, float(u * n + j * alt), n)
            mu_sum += mu * n
            power_sum += p * n + jp * alt
            clock_sum += clock * n
            if mem > mem_max:
                mem_max = mem
            if procs > procs_max:
                procs_max = procs
            if temp > temp_max:
                temp_max = temp
            if kp > a:
                thr[0] += min(b, kp) - a
            if kt > a:
                thr[1] += min(b, kt) - a
            if kh > a:
                thr[2] += min(b, kh) - a
            k_any = max(kp, kt, kh)
            if k_any > a:
                thr[4] += min(b, k_any) - a
            thr_n += n
            if self.gpm:
                for i, v in enumerate(self.prof(base)):
                    if v is not None:
                        acc.prof_sum[i] += v * n
                        acc.prof_cnt[i] += n
            t = base + b
            m += 1
        n_all = w1 - w0
        acc.n = n_all
        acc.util_sum = float(util_sum)
        acc.util_n = util_n
        if "utilization" not in uns:
            acc.mem_util_sum = float(mu_sum)
            acc.mem_util_n = n_all
        if "memory" not in uns:
            v1 = "memory_v2" in uns or old
            acc.mem_used_max = mem_max + (self.reserved if v1 else 0)
        if "procs" not in uns:
            acc.procs_max = procs_max
        if "power" not in uns:
            acc.power_sum = power_sum
            acc.power_n = n_all
        if "energy" in uns:
            if "power" not in uns:
                acc.fallback_sum, acc.fallback_n = power_sum, n_all
        else:
            acc.energy_sum, acc.energy_n = power_sum, n_all
            for r in self.resets:
                if w0 <= r - 1 < w1:
                    acc.energy_reset = True
        if "temperature" not in uns:
            acc.temp_max = temp_max
        if "sm_clock" not in uns:
            acc.clock_sum, acc.clock_n = clock_sum, n_all
        if "throttle" not in uns:
            acc.thr, acc.thr_n = thr, thr_n
        if any(acc.prof_cnt):
            acc.prof_n = n_all  # every second has a GPM pair (gpm_fail is not modelled here)
        if who:
            acc.wl_n = n_all
        return finalise(self.uuid, acc)


# ---------------------------------------------------------------------------------------------
# The fake NVML backend (one per node)
# ---------------------------------------------------------------------------------------------


@dataclass
class FakeHandle:
    gpu: FakeGpu
    generation: int


@dataclass(frozen=True)
class MigProfile:
    """A MIG GPU instance profile as NVML describes it: ``id`` (nvidia-smi's profile ID,
    ``nvmlGpuInstanceProfileInfo_t.id``), ``enum`` (the ``NVML_GPU_INSTANCE_PROFILE_*``
    value it is asked by), slices and memory."""

    name: str
    id: int
    enum: int
    slices: int
    memory_mb: int


# H100 80GB (NVIDIA's MIG user guide; memory as ``nvidia-smi mig -lgip`` lists it:
# 9.75, 19.62, 19.62, 39.50, 39.50, 79.25 GiB).
MIG_PROFILES_H100 = {
    p.name: p
    for p in (
        MigProfile("1g.10gb", 19, int(pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE), 1, 9984),
        MigProfile("1g.20gb", 15, int(pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2), 1, 20096),
        MigProfile("2g.20gb", 14, int(pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE), 2, 20096),
        MigProfile("3g.40gb", 9, int(pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE), 3, 40448),
        MigProfile("4g.40gb", 5, int(pynvml.NVML_GPU_INSTANCE_PROFILE_4_SLICE), 4, 40448),
        MigProfile("7g.80gb", 0, int(pynvml.NVML_GPU_INSTANCE_PROFILE_7_SLICE), 7, 81152),
    )
}
MIG_SLICES_H100 = 7


@dataclass(frozen=True)
class FakeMigInstance:
    """One MIG instance of a layout (GPU instance ``gi``, compute instance 0)."""

    uuid: str
    gi: int
    ci: int
    profile: MigProfile


def _mig_instances(gpu_uuid: str, at: int, layout: tuple[str, ...]) -> tuple[FakeMigInstance, ...]:
    """The instances of ``layout`` created at second ``at``: a MIG UUID is new for every
    instance created (as NVIDIA's drivers make them), GPU instance ids count from 1 (the
    whole-GPU profile has 0)."""
    out = []
    used = 0
    for pos, name in enumerate(layout):
        profile = MIG_PROFILES_H100[name]
        used += profile.slices
        if used > MIG_SLICES_H100:
            raise ValueError(f"MIG layout {layout} needs more than {MIG_SLICES_H100} slices")
        h = _mix(hash_str(gpu_uuid), at, pos, profile.id)
        uuid = "MIG-" + "-".join(
            f"{h >> shift & mask:0{width}x}"
            for shift, mask, width in ((32, 0xFFFFFFFF, 8), (16, 0xFFFF, 4), (0, 0xFFFF, 4))
        )
        uuid += f"-{_mix(h, 1) & 0xFFFF:04x}-{_mix(h, 2) & 0xFFFFFFFFFFFF:012x}"
        gi = 0 if profile.slices == MIG_SLICES_H100 else pos + 1
        out.append(FakeMigInstance(uuid, gi, 0, profile))
    return tuple(out)


@dataclass
class FakeMigHandle(FakeHandle):
    """A MIG device handle: valid while its instance exists."""

    mig: FakeMigInstance | None = None


@dataclass
class FakeProcess:
    pid: int
    usedGpuMemory: int  # pynvml's field name


class FakeProcesses:
    """The fake node's process table: one pid for each workload that has a process on one of
    its GPUs, kept while the fake runs, and the resolver that maps it back (the part of
    ``/proc`` the agent reads, as ``workloads.ProcResolver`` does on a real node)."""

    def __init__(self) -> None:
        self.aliases: dict[str, str] = {}
        self.aliases_version = 0
        self._pids: dict[Workload, int] = {}
        self._workloads: dict[int, Workload] = {}

    def pid_of(self, w: Workload) -> int:
        pid = self._pids.get(w)
        if pid is None:
            pid = 100_000 + hash_str(f"{w.kind}/{w.id}") % 3_000_000
            while pid in self._workloads:
                pid += 1
            self._pids[w] = pid
            self._workloads[pid] = w
        return pid

    def resolve(self, pid: int) -> Workload | None:
        return self._workloads.get(pid)

    def tick(self) -> None:
        pass


class FakeAllocations:
    """The allocations of the fake node's GPUs in the second the fake NVML describes."""

    def __init__(self, gpus: Sequence[FakeGpu], clock: Callable[[], float]) -> None:
        self.gpus = gpus
        self.clock = clock
        self._t: int | None = None
        self._current: tuple[Allocation, ...] = ()

    def allocations(self, now: float, gpus: Mapping[str, int]) -> Sequence[Allocation]:
        t = int(math.floor(self.clock() + 1e-6)) - 1
        if t != self._t:
            self._t = t
            by: dict[Workload, list[str]] = {}
            for g in self.gpus:
                held = g.holders(t)
                for w in held[1] if held is not None else ():
                    by.setdefault(w, []).append(g.uuid)
            current = tuple(Allocation(w, tuple(u), origin="fake") for w, u in by.items())
            if current != self._current:
                self._current = current
        return self._current


@dataclass
class FakeGpmSample:
    """What the fake keeps behind one ``c_nvmlGpmSample_t``: the GPU and the second it was
    filled at (its counters cover every second before that)."""

    buffer: Any  # the ctypes buffer the pointer points to; kept alive here
    gpu: FakeGpu | None = None
    at: int = 0
    gi: int | None = None  # a MIG instance's sample (nvmlGpmMigSampleGet)


class FakeNvml:
    """pynvml's calls over a set of fake GPUs, read at ``clock()`` (Unix seconds).

    Readings at time ``t`` describe the second that just ended (``floor(t) - 1``), like
    NVML's own ``power now`` and ``samples since`` do; the energy counter is read at
    ``floor(t)``.
    """

    def __init__(
        self,
        gpus: Sequence[FakeGpu],
        clock: Callable[[], float] = time.time,
        *,
        gpm_library: bool = True,
    ) -> None:
        self.gpus = list(gpus)
        self.clock = clock
        self.gpm_library = gpm_library
        self.gpm_samples: dict[int, FakeGpmSample] = {}  # buffer address → sample
        self.initialised = False
        self.generation = 0
        self.outages: list[tuple[int, int]] = []
        self.calls = 0
        self.processes = FakeProcesses()

    def discovery(self) -> Discovery:
        """Who holds these GPUs, as the agent's workload discovery sees it on a real node."""
        return Discovery(self.processes, FakeAllocations(self.gpus, self.clock))

    def outage(self, start: float, end: float) -> None:
        """The driver is gone in ``[start, end)``: every call raises DriverNotLoaded, and
        handles from before it raise Uninitialized until ``nvmlInit`` succeeds again."""
        self.outages.append((int(start), int(end)))

    # -- internals --------------------------------------------------------------------------

    def _now(self) -> int:
        return int(math.floor(self.clock() + 1e-6))

    def _driver(self, now: int) -> None:
        for a, b in self.outages:
            if a <= now < b:
                self.initialised = False
                raise pynvml.NVMLError_DriverNotLoaded()

    def _check(self, h: Any, call: str = "") -> tuple[FakeGpu, int]:
        self.calls += 1
        now = self._now()
        self._driver(now)
        if not self.initialised or not isinstance(h, FakeHandle) or h.generation != self.generation:
            raise pynvml.NVMLError_Uninitialized()
        g = h.gpu
        if g.lost_at is not None and now > g.lost_at:
            raise pynvml.NVMLError_GpuIsLost()
        if call and call in g.unsupported:
            raise pynvml.NVMLError_NotSupported()
        if isinstance(h, FakeMigHandle):
            # a handle of an instance destroyed since (a reconfiguration) is no handle
            current = g.mig_at(now - 1) or ()
            if h.mig not in current:
                raise pynvml.NVMLError_InvalidArgument()
        return g, now

    # -- the pynvml surface -----------------------------------------------------------------

    def nvmlInit(self) -> None:
        self._driver(self._now())
        if not self.initialised:
            self.initialised = True
            self.generation += 1

    def nvmlShutdown(self) -> None:
        if not self.initialised:
            raise pynvml.NVMLError_Uninitialized()
        self.initialised = False

    def nvmlSystemGetDriverVersion(self) -> str:
        self._driver(self._now())
        if not self.initialised:
            raise pynvml.NVMLError_Uninitialized()
        return DRIVER_VERSION

    def nvmlDeviceGetCount(self) -> int:
        self._driver(self._now())
        if not self.initialised:
            raise pynvml.NVMLError_Uninitialized()
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        if not 0 <= index < len(self.gpus):
            raise pynvml.NVMLError_InvalidArgument()
        h = FakeHandle(self.gpus[index], self.generation)
        self._check(h)
        return h

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        g, _ = self._check(handle)
        if isinstance(handle, FakeMigHandle) and handle.mig is not None:
            return handle.mig.uuid
        return g.uuid

    def nvmlDeviceGetName(self, handle: Any) -> str:
        return self._check(handle)[0].model.name

    def nvmlDeviceGetMinorNumber(self, handle: Any) -> int:
        """The N of the GPU's /dev/nvidiaN: its index, unless the GPU was given a ``minor``
        (a node whose minor numbers do not follow NVML's order, as the driver may number them)."""
        g = self._check(handle)[0]
        minor = getattr(g, "minor", None)
        return g.index if minor is None else int(minor)

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: int | None = None) -> Any:
        g, now = self._check(handle, "memory")
        used = g.second(now - 1)[2]
        if isinstance(handle, FakeMigHandle) and handle.mig is not None:
            # an instance's memory: half of it used while it has a process
            m = handle.mig.profile.memory_mb << 20
            used = m // 2 if g.mig_activity(now - 1, handle.mig.gi)[1] else 0
            if version:
                return pynvml.c_nvmlMemory_v2_t(version, m, 0, m - used, used)
            return pynvml.c_nvmlMemory_t(m, m - used, used)
        if version:
            if g.old_driver:
                raise pynvml.NVMLError_FunctionNotFound()
            if "memory_v2" in g.unsupported:
                raise pynvml.NVMLError_NotSupported()
            free = g.memory_total - g.reserved - used
            return pynvml.c_nvmlMemory_v2_t(version, g.memory_total, g.reserved, free, used)
        used += g.reserved
        return pynvml.c_nvmlMemory_t(g.memory_total, g.memory_total - used, used)

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any) -> int:
        g, _ = self._check(handle, "power_limit")
        return int(g.model.max_w * 1000)

    def nvmlDeviceGetSamples(
        self, device: Any, sampling_type: int, timeStamp: int
    ) -> tuple[int, Sequence[Any]]:
        g, now = self._check(device, "util_samples")
        if g.mig_at(now - 1) is not None:
            raise pynvml.NVMLError_NotSupported()  # no utilisation in MIG mode
        if sampling_type != pynvml.NVML_GPU_UTILIZATION_SAMPLES:
            raise pynvml.NVMLError_NotSupported()
        out = []
        # The driver keeps a short buffer; one sample per second here, stamped at the end of
        # its second (µs). Seconds with no kernel produce no sample.
        first = max(now - 10, timeStamp // 1_000_000)
        for t in range(first, now):
            ts = (t + 1) * 1_000_000
            if ts <= timeStamp:
                continue
            u = g.second(t)[0]
            if u > 0:
                out.append(pynvml.c_nvmlSample_t(ts, pynvml.c_nvmlValue_t(uiVal=u)))
        if not out:
            raise pynvml.NVMLError_NotFound()
        return int(pynvml.NVML_VALUE_TYPE_UNSIGNED_INT), out

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        g, now = self._check(handle, "utilization")
        if g.mig_at(now - 1) is not None:
            # NVML: "not supported" on a GPU in MIG mode and on its MIG devices
            raise pynvml.NVMLError_NotSupported()
        s = g.second(now - 1)
        return pynvml.c_nvmlUtilization_t(s[0], s[1])

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> Sequence[Any]:
        g, now = self._check(handle, "procs")
        if g.old_driver:
            raise pynvml.NVMLLibraryMismatchError("nvmlDeviceGetComputeRunningProcesses_v3")
        return self._procs(g, now, handle)

    def nvmlDeviceGetComputeRunningProcesses_v2(self, handle: Any) -> Sequence[Any]:
        g, now = self._check(handle, "procs")
        return self._procs(g, now, handle)

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: Any) -> Sequence[Any]:
        g, now = self._check(handle, "graphics_procs")
        if g.old_driver:
            raise pynvml.NVMLLibraryMismatchError("nvmlDeviceGetGraphicsRunningProcesses_v3")
        return [FakeProcess(pid, 0) for pid in g.graphics_pids(now - 1)]

    def nvmlDeviceGetGraphicsRunningProcesses_v2(self, handle: Any) -> Sequence[Any]:
        g, now = self._check(handle, "graphics_procs")
        return [FakeProcess(pid, 0) for pid in g.graphics_pids(now - 1)]

    def _procs(self, g: FakeGpu, now: int, handle: Any = None) -> list[FakeProcess]:
        insts = g.mig_at(now - 1)
        if insts is not None:
            # a MIG device lists its instance's processes; the GPU's handle, all of them
            mine = [handle.mig] if isinstance(handle, FakeMigHandle) else insts
            return [
                FakeProcess(pid, (m.profile.memory_mb << 20) // 2)
                for m in mine
                if m is not None
                for pid in g.mig_activity(now - 1, m.gi)[1]
            ]
        s = g.second(now - 1)
        pids = g.compute_pids(now - 1)
        if pids is None:
            held = g.holders(now - 1)
            if held is None:
                return [FakeProcess(1000 + i, s[2] // max(s[3], 1)) for i in range(s[3])]
            pids = [self.processes.pid_of(w) for w in held[0]]
        return [FakeProcess(pid, s[2] // max(len(pids), 1)) for pid in pids]

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        g, now = self._check(handle, "power")
        return g.second(now - 1)[4]

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int:
        g, now = self._check(handle, "energy")
        return g.energy_mj(now)

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        g, now = self._check(handle, "temperature")
        return g.second(now - 1)[5]

    def nvmlDeviceGetClockInfo(self, handle: Any, type: int) -> int:
        g, now = self._check(handle, "sm_clock")
        return g.second(now - 1)[6]

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int:
        g, now = self._check(handle, "throttle")
        if g.old_driver:
            raise pynvml.NVMLError_FunctionNotFound()
        return g.second(now - 1)[7]

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: Any) -> int:
        g, now = self._check(handle, "throttle")
        return g.second(now - 1)[7]

    # -- MIG --------------------------------------------------------------------------------

    def nvmlDeviceGetMigMode(self, device: Any) -> list[int]:
        g, now = self._check(device, "mig")
        on = int(g.mig_at(now - 1) is not None)
        return [on, on]

    def nvmlDeviceGetMaxMigDeviceCount(self, device: Any) -> int:
        g, now = self._check(device, "mig")
        return MIG_SLICES_H100 if g.mig_at(now - 1) is not None else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: Any, index: int) -> Any:
        g, now = self._check(device, "mig")
        insts = g.mig_at(now - 1)
        if insts is None or not 0 <= index < MIG_SLICES_H100:
            raise pynvml.NVMLError_InvalidArgument()
        if index >= len(insts):
            raise pynvml.NVMLError_NotFound()  # no instance at this index
        return FakeMigHandle(g, self.generation, insts[index])

    def _mig(self, device: Any) -> FakeMigInstance:
        self._check(device)
        if not isinstance(device, FakeMigHandle) or device.mig is None:
            raise pynvml.NVMLError_InvalidArgument()  # not a MIG device handle
        return device.mig

    def nvmlDeviceGetGpuInstanceId(self, device: Any) -> int:
        return self._mig(device).gi

    def nvmlDeviceGetComputeInstanceId(self, device: Any) -> int:
        return self._mig(device).ci

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, migDevice: Any) -> Any:
        self._mig(migDevice)
        return FakeHandle(migDevice.gpu, migDevice.generation)

    def nvmlDeviceGetAttributes(self, device: Any) -> Any:
        p = self._mig(device).profile
        a = pynvml.c_nvmlDeviceAttributes()
        a.multiprocessorCount = 132 * p.slices // MIG_SLICES_H100
        a.gpuInstanceSliceCount = p.slices
        a.computeInstanceSliceCount = p.slices
        a.memorySizeMB = p.memory_mb
        return a

    def nvmlDeviceGetGpuInstanceProfileInfo(self, device: Any, profile: int) -> Any:
        g, _ = self._check(device, "mig")
        for p in MIG_PROFILES_H100.values():
            if p.enum == profile and g.mig:
                info = pynvml.c_nvmlGpuInstanceProfileInfo_v2_t()
                info.id, info.sliceCount, info.memorySizeMB = p.id, p.slices, p.memory_mb
                info.instanceCount = MIG_SLICES_H100 // p.slices
                info.name = f"MIG {p.name}".encode()
                return info
        raise pynvml.NVMLError_NotSupported()

    def nvmlGpmMigSampleGet(self, device: Any, gpuInstanceId: int, gpmSample: Any) -> Any:
        self._gpm()
        g, now = self._check(device, "gpm")
        if not g.gpm:
            raise pynvml.NVMLError_NotSupported()
        insts = g.mig_at(now - 1) or ()
        if all(m.gi != gpuInstanceId for m in insts):
            raise pynvml.NVMLError_InvalidArgument()
        sample = self._gpm_sample(gpmSample)
        sample.gpu, sample.at, sample.gi = g, now, gpuInstanceId
        return gpmSample

    # -- GPM: real pynvml structures; the samples are ctypes buffers the fake keeps ----------

    def _gpm(self) -> None:
        self.calls += 1
        if not self.gpm_library:
            raise pynvml.NVMLError_FunctionNotFound()

    def _gpm_sample(self, pointer: Any) -> FakeGpmSample:
        try:
            sample = self.gpm_samples.get(ctypes.addressof(pointer.contents))
        except (ValueError, TypeError, AttributeError):  # NULL, or not a sample pointer
            sample = None
        if sample is None:
            raise pynvml.NVMLError_InvalidArgument()
        return sample

    def nvmlGpmQueryDeviceSupport(self, device: Any) -> Any:
        self._gpm()
        g, _ = self._check(device, "gpm")
        support = pynvml.c_nvmlGpmSupport_t()
        support.version = pynvml.NVML_GPM_SUPPORT_VERSION
        support.isSupportedDevice = 1 if g.gpm else 0
        return support

    def nvmlGpmSampleAlloc(self) -> Any:
        self._gpm()
        if not self.initialised:
            raise pynvml.NVMLError_Uninitialized()
        buf = ctypes.create_string_buffer(16)
        self.gpm_samples[ctypes.addressof(buf)] = FakeGpmSample(buf)
        return ctypes.cast(buf, pynvml.c_nvmlGpmSample_t)

    def nvmlGpmSampleFree(self, gpmSample: Any) -> None:
        self._gpm()
        self._gpm_sample(gpmSample)
        del self.gpm_samples[ctypes.addressof(gpmSample.contents)]

    def nvmlGpmSampleGet(self, device: Any, gpmSample: Any) -> Any:
        self._gpm()
        g, now = self._check(device, "gpm")
        if not g.gpm:
            raise pynvml.NVMLError_NotSupported()
        if any(a <= now < b for a, b in g.gpm_fail):
            raise pynvml.NVMLError_Unknown()
        sample = self._gpm_sample(gpmSample)
        sample.gpu, sample.at, sample.gi = g, now, None
        return gpmSample

    def nvmlGpmMetricsGet(self, metricsGet: Any) -> Any:
        self._gpm()
        if not self.initialised:
            raise pynvml.NVMLError_Uninitialized()
        req = metricsGet
        if req.version != pynvml.NVML_GPM_METRICS_GET_VERSION:
            raise pynvml.NVMLError_ArgumentVersionMismatch()
        s1, s2 = self._gpm_sample(req.sample1), self._gpm_sample(req.sample2)
        if s1.gpu is None or s1.gpu is not s2.gpu or s2.at <= s1.at or s1.gi != s2.gi:
            raise pynvml.NVMLError_InvalidArgument()
        gpu, gi = s1.gpu, s1.gi
        if gi is None:
            seconds = [gpu.prof(t) for t in range(s1.at, s2.at)]
        else:
            seconds = [_mig_prof(gpu.mig_activity(t, gi)[0]) for t in range(s1.at, s2.at)]
        for i in range(req.numMetrics):
            m = req.metrics[i]
            k = _GPM_INDEX.get(int(m.metricId))
            values = [p[k] for p in seconds] if k is not None else [None]
            if any(v is None for v in values):
                m.nvmlReturn, m.value = pynvml.NVML_ERROR_NOT_SUPPORTED, 0.0
            else:
                m.nvmlReturn = pynvml.NVML_SUCCESS
                m.value = sum(v for v in values if v is not None) / len(values)
        return req


# ---------------------------------------------------------------------------------------------
# Fleet spec
# ---------------------------------------------------------------------------------------------

PRESETS = {
    # 8 nodes × 8 GPUs = 64 GPUs across two sites, every pattern and every fault.
    "demo": (
        "nodes=3,gpus=8,model=H100,pattern=training,site=fra1;"
        "nodes=1,gpus=8,model=H100,pattern=training,site=fra1,power_throttle=1;"
        "nodes=1,gpus=8,model=H200,pattern=inference,site=fra1,energy_reset=+3d;"
        "nodes=1,gpus=8,model=A100,pattern=batch,site=ams1;"
        "nodes=1,gpus=8,model=L40S,pattern=mixed,site=ams1,falls_off_bus=0.5@+10d;"
        "nodes=1,gpus=8,model=RTX4090,pattern=notebook,site=ams1"
    ),
    "small": "nodes=1,gpus=2,model=H100,pattern=training",
    # 6 nodes × 8 GPUs that say who holds them (docs/agent.md): Slurm jobs on the training nodes
    # (one GPU's job starves on its data loader at ~30 %), a Slurm job holding all 8 GPUs of a
    # node and computing on one, Kubernetes pods serving inference, notebook users who hold
    # their GPUs for days.
    "workloads": (
        "nodes=2,gpus=8,model=H100,pattern=training,site=fra1,workloads=1;"
        "nodes=1,gpus=8,model=H100,pattern=training|training|training|starved|training|training|"
        "training|training,site=fra1,workloads=1;"
        "nodes=1,gpus=8,model=H100,pattern=hog,site=fra1,workloads=1;"
        "nodes=1,gpus=8,model=H200,pattern=inference,site=fra1,workloads=1;"
        "nodes=1,gpus=8,model=RTX4090,pattern=notebook,site=ams1,workloads=1"
    ),
}

_REL = re.compile(r"^\+(\d+(?:\.\d+)?)([smhd])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_time(v: Any, epoch: int) -> int:
    """Unix seconds from an ISO 8601 string, ``+36h``-style offset from the epoch, or a number."""
    if isinstance(v, int | float):
        return int(v)
    s = str(v).strip()
    m = _REL.match(s)
    if m:
        return epoch + int(float(m.group(1)) * _UNIT_S[m.group(2)])
    d = datetime.fromisoformat(s.replace("Z", "+00:00"))
    if d.tzinfo is None:
        d = d.replace(tzinfo=UTC)
    return int(d.timestamp())


@dataclass
class GroupSpec:
    nodes: int = 1
    gpus: int = 8
    model: str = "H100"
    pattern: str = "mixed"  # or "training|inference|…": GPU i takes the i-th (cyclically)
    site: str = "fra1"
    power_throttle: list[int] = field(default_factory=list)  # node indices in the group
    falls_off_bus: list[tuple[int, int, Any]] = field(default_factory=list)  # node, gpu, at
    energy_reset: list[tuple[int, Any]] = field(default_factory=list)  # node, at
    unsupported: list[str] = field(default_factory=list)
    old_driver: bool = False
    gpm: bool = False  # the group's GPUs have GPM, where their model does (Hopper)
    workloads: bool = False  # the group's GPUs say who holds them (docs/agent.md)
    # The group's training jobs report through gpufleet_hook (job sums, DESIGN.md §9.4); in
    # simulate() only, which writes what the agent would add (a fake NVML has no hook).
    jobs: bool = False


def _bool_nodes(v: Any) -> list[int]:
    if isinstance(v, list):
        return [int(x) for x in v]
    if isinstance(v, bool):
        return [0] if v else []
    s = str(v).strip().lower()
    if s in ("", "0", "false", "no"):
        return []
    if s in ("1", "true", "yes"):
        return [0]
    return [int(x) for x in re.split(r"[|+ ]", s) if x]


def _faults_at(v: Any, with_gpu: bool) -> list[Any]:
    """``at`` / ``node.gpu@at`` strings, dicts ``{"node", "gpu", "at"}``, or lists of them."""
    items = v if isinstance(v, list) else [v]
    out: list[Any] = []
    for it in items:
        node, gpu, at = 0, 0, it
        if isinstance(it, dict):
            node, gpu, at = int(it.get("node", 0)), int(it.get("gpu", 0)), it["at"]
        elif isinstance(it, str) and "@" in it:
            where, at = it.split("@", 1)
            parts = where.split(".")
            node = int(parts[0]) if parts[0] else 0
            gpu = int(parts[1]) if len(parts) > 1 and parts[1] else 0
        out.append((node, gpu, at) if with_gpu else (node, at))
    return out


_FAULT_KEYS = ("power_throttle", "falls_off_bus", "energy_reset", "unsupported", "old_driver")


def _group(d: dict[str, Any]) -> GroupSpec:
    g = GroupSpec()
    faults = dict(d.get("faults") or {})
    for k, v in d.items():
        if k in ("nodes", "gpus"):
            setattr(g, k, int(v))
        elif k == "pattern" and isinstance(v, list):
            g.pattern = "|".join(str(x).strip() for x in v)
        elif k in ("model", "pattern", "site"):
            setattr(g, k, str(v).strip())
        elif k == "gpm":
            g.gpm = bool(_bool_nodes(v))
        elif k == "workloads":
            g.workloads = bool(_bool_nodes(v))
        elif k == "jobs":
            g.jobs = bool(_bool_nodes(v))
        elif k in _FAULT_KEYS:
            faults[k] = v  # fault flags may sit in the group itself or under "faults"
        elif k != "faults":
            raise ValueError(f"unknown fleet spec key {k!r}")
    if "power_throttle" in faults:
        g.power_throttle = _bool_nodes(faults["power_throttle"])
    if "falls_off_bus" in faults:
        g.falls_off_bus = _faults_at(faults["falls_off_bus"], True)
    if "energy_reset" in faults:
        g.energy_reset = _faults_at(faults["energy_reset"], False)
    if "unsupported" in faults:
        u = faults["unsupported"]
        g.unsupported = list(u) if isinstance(u, list) else [x for x in re.split(r"[|+ ]", u) if x]
    if "old_driver" in faults:
        g.old_driver = bool(_bool_nodes(faults["old_driver"]))
    model(g.model)  # validate early
    for p in g.pattern.split("|"):
        if p not in PATTERNS:
            raise ValueError(f"unknown pattern {p!r}; known: {', '.join(PATTERNS)}")
    if g.nodes < 1 or g.gpus < 1:
        raise ValueError("nodes and gpus must be at least 1")
    return g


def parse_spec(spec: str | dict[str, Any] | list[Any]) -> list[GroupSpec]:
    """Compact string (``nodes=4,gpus=8,model=H100,pattern=training;…``), a preset name,
    JSON text, or the dict/list form. See docs/agent.md."""
    if isinstance(spec, str):
        s = spec.strip()
        if s in PRESETS:
            s = PRESETS[s]
        if s.startswith(("{", "[")):
            return parse_spec(json.loads(s))
        groups = []
        for part in s.split(";"):
            part = part.strip()
            if not part:
                continue
            d: dict[str, Any] = {}
            for item in part.split(","):
                if not item.strip():
                    continue
                if "=" not in item:
                    raise ValueError(f"fleet spec item {item!r} is not key=value")
                k, v = item.split("=", 1)
                d[k.strip()] = v.strip()
            groups.append(_group(d))
        if not groups:
            raise ValueError("empty fleet spec")
        return groups
    if isinstance(spec, dict):
        if "groups" not in spec:
            return parse_spec([spec])
        raw = [dict(x) for x in spec["groups"]]
        if "workloads" in spec:  # a default for the groups that do not say
            for x in raw:
                x.setdefault("workloads", spec["workloads"])
        return parse_spec(raw)
    return [_group(dict(x)) for x in spec]


def make_uuid(seed: int, ordinal: int) -> str:
    a = _mix(seed, ordinal, 0x55)
    b = _mix(seed, ordinal, 0xAA)
    x = (a << 64) | b
    h = f"{x:032x}"
    return f"GPU-{h[0:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


@dataclass
class FakeNode:
    hostname: str
    gpus: list[FakeGpu]

    def inventory(self, at: int | None = None) -> list[dict[str, Any]]:
        out = []
        for g in self.gpus:
            d: dict[str, Any] = {
                "uuid": g.uuid,
                "index": g.index,
                "name": g.model.name,
                "memory_total_bytes": g.memory_total,
                "power_limit_w": float(g.model.max_w),
            }
            if at is not None and g.lost_at is not None and at > g.lost_at:
                d["status"] = "lost"
            out.append(d)
        return out


class FakeFleet:
    """A deterministic fleet: the same spec and seed give the same hostnames, UUIDs and data.

    ``epoch`` anchors relative fault times such as ``+36h`` (default: now, floored to the hour).
    """

    def __init__(
        self,
        spec: str | dict[str, Any] | list[Any],
        *,
        seed: int = 0,
        epoch: datetime | float | None = None,
    ) -> None:
        if epoch is None:
            e = int(time.time()) // 3600 * 3600
        elif isinstance(epoch, datetime):
            e = int(epoch.timestamp())
        else:
            e = int(epoch)
        self.epoch = e
        self.seed = seed
        self.groups = parse_spec(spec)
        self._nodes: dict[str, FakeNode] = {}
        per_site: dict[str, int] = {}
        ordinal = 0
        for grp in self.groups:
            gm = model(grp.model)
            for ni in range(grp.nodes):
                node_ordinal = ordinal
                per_site[grp.site] = per_site.get(grp.site, 0) + 1
                hostname = f"gpu-{grp.site}-{per_site[grp.site]:02d}"
                gpus: list[FakeGpu] = []
                resets = [parse_time(at, e) for n, at in grp.energy_reset if n == ni]
                patterns = grp.pattern.split("|")  # several: GPU i follows pattern i mod n
                for gi in range(grp.gpus):
                    lost = [
                        parse_time(at, e) for n, g, at in grp.falls_off_bus if (n, g) == (ni, gi)
                    ]
                    gpus.append(
                        PatternGpu(
                            make_uuid(seed, ordinal),
                            gi,
                            gm,
                            patterns[gi % len(patterns)],
                            _mix(seed, ordinal, 0x77),
                            power_throttle=ni in grp.power_throttle,
                            lost_at=min(lost) if lost else None,
                            resets=resets,
                            unsupported=grp.unsupported,
                            old_driver=grp.old_driver,
                            gpm=grp.gpm and gm.gpm,
                            workloads=grp.workloads,
                            jobs=grp.jobs,
                            ordinal=ordinal,
                            node_key=_mix(seed, node_ordinal, 0x99),
                            node_ordinal=node_ordinal,
                        )
                    )
                    ordinal += 1
                self._nodes[hostname] = FakeNode(hostname, gpus)

    @property
    def nodes(self) -> list[str]:
        return list(self._nodes)

    def node(self, hostname: str) -> FakeNode:
        return self._nodes[hostname]

    def backend(self, hostname: str, clock: Callable[[], float] = time.time) -> FakeNvml:
        return FakeNvml(self._nodes[hostname].gpus, clock)

    def has_workloads(self, hostname: str) -> bool:
        """Whether the node's GPUs say who holds them (``workloads=1`` in the spec)."""
        return any(isinstance(g, PatternGpu) and g.workloads for g in self.node(hostname).gpus)


def simulate(
    spec: str | dict[str, Any] | list[Any] | FakeFleet,
    *,
    start: datetime,
    end: datetime,
    interval_s: int = 60,
    seed: int = 0,
    batch_intervals: int = 1,
) -> Iterator[tuple[str, dict[str, Any]]]:
    """Yield ``(hostname, payload)`` in the docs/ingest.md wire format for every interval in
    ``[start, end)``, chronologically, one payload per node per ``batch_intervals`` intervals.

    Computed in closed form per interval, without sleeping. Intervals start on multiples of
    ``interval_s`` (``start`` is rounded up to one); only whole intervals before ``end`` are
    produced. A node whose GPUs have nothing to say in a batch yields nothing for it. The
    ``gpus`` list object is shared between payloads of a node until a GPU's status changes.
    """
    if interval_s < 1 or 3600 % interval_s:
        raise ValueError(f"interval_s must divide 3600, got {interval_s}")
    if batch_intervals < 1:
        raise ValueError("batch_intervals must be at least 1")
    fleet = spec if isinstance(spec, FakeFleet) else FakeFleet(spec, seed=seed, epoch=start)
    t0 = int(math.ceil(start.timestamp() / interval_s)) * interval_s
    t_end = int(end.timestamp())
    nodes = [fleet.node(h) for h in fleet.nodes]
    heads = {
        n.hostname: {
            "hostname": n.hostname,
            "agent_version": __version__,
            "driver_version": DRIVER_VERSION,
        }
        for n in nodes
    }
    inv_cache: dict[str, tuple[tuple[bool, ...], list[dict[str, Any]]]] = {}
    step = interval_s * batch_intervals
    for b0 in range(t0, t_end, step):
        b1 = min(b0 + step, t_end)
        for node in nodes:
            samples: list[dict[str, Any]] = []
            append = samples.append
            gpus = node.gpus
            w0 = b0
            while w0 + interval_s <= b1:
                w1 = w0 + interval_s
                for g in gpus:
                    s = g.window(w0, w1)
                    if s is not None:
                        if isinstance(g, PatternGpu) and g.jobs:
                            job = g.job(w0, w1)
                            if job is not None:
                                s["job"] = job
                        append(s)
                w0 = w1
            if not samples:
                continue
            state = tuple(g.lost_at is not None and b1 > g.lost_at for g in gpus)
            cached = inv_cache.get(node.hostname)
            if cached is None or cached[0] != state:
                cached = (state, node.inventory(at=b1))
                inv_cache[node.hostname] = cached
            yield (
                node.hostname,
                {"node": heads[node.hostname], "gpus": cached[1], "samples": samples},
            )
