"""Where one-second readings come from: the source protocol and the reading it yields.

A **source** reads every GPU of the node once a second and yields one :class:`Reading` per GPU
(``nvml.Collector``: NVML, with GPM where the GPU has it; ``dcgm.DcgmSource``: an existing
dcgm-exporter's ``/metrics``). Everything after that is one code path: ``summarise.Summariser``
turns a GPU's readings of an interval into the wire sample (docs/ingest.md), ``agent.Agent``
spools and delivers it. A source never summarises and the summariser never asks where a
reading came from.

Adding a per-GPU figure means a field here (``None``: this source could not say, for this
second), its sum in ``summarise.Accumulator`` and its wire field in ``summarise.finalise``;
sources that cannot measure it change nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True, slots=True)
class Workload:
    """What holds a GPU in one second (docs/agent.md): a Slurm job, a Kubernetes pod, a
    container or a Unix user, identified on its node's site by (``kind``, ``id``)."""

    kind: str  # "slurm" | "k8s" | "container" | "user"
    id: str  # job id, "namespace/pod", container id, user name
    user: str | None = None
    account: str | None = None  # k8s: the namespace
    name: str | None = None


@dataclass(slots=True)
class Reading:
    """What a source read from one GPU for one second; ``None`` where it could not say."""

    util: float | None = None  # % of the second with a kernel running (mean of NVML samples)
    mem_util: float | None = None  # % of the second with device memory being read or written
    mem_used: int | None = None  # bytes
    procs: int | None = None  # compute processes holding the GPU
    power_mw: int | None = None  # board power, milliwatts
    energy_mj: int | None = None  # total energy counter, mJ since the driver loaded
    temp_c: int | None = None
    sm_clock_mhz: int | None = None
    reasons: int | None = None  # clocks-event (throttle) reason bitmask, NVML's bit values
    # Profiling (NVML GPM or DCGM), each in % of the second (the wire sends fractions):
    sm_active_pct: float | None = None  # SMs with at least one warp resident, averaged over SMs
    sm_occupancy_pct: float | None = None  # resident warps / the SMs' maximum
    tensor_active_pct: float | None = None  # cycles any tensor pipe was busy
    dram_active_pct: float | None = None  # cycles the memory interface moved data
    # What held the GPU in this second, one per (kind, id): ``None`` when the source cannot
    # tell, ``()`` when it can and nothing did. The summariser turns them into the sample's
    # ``workloads`` (docs/agent.md).
    workloads: tuple[Workload, ...] | None = None
    # A GPU in MIG mode (docs/agent.md, "MIG"): one reading per instance, in which only
    # util, mem_used, procs, the profiling fields and workloads are set; ``None`` otherwise.
    # ``util`` of the GPU's own reading is then the slice-weighted mean of the instances'.
    instances: tuple[InstanceReading, ...] | None = None
    slices_total: int = 0  # the GPU's slices (7 on an H100) when ``instances`` is set


@dataclass(frozen=True, slots=True)
class MigInstance:
    """One MIG instance as the ``mig`` list of a GPU names it (docs/ingest.md)."""

    uuid: str  # "MIG-…": what its samples name in ``instance``
    gi: int  # GPU instance id
    ci: int  # compute instance id
    profile: str  # "3g.40gb"
    slices: int  # the GPU instance's slices
    memory_mb: int

    def wire(self) -> dict[str, Any]:
        return {
            "uuid": self.uuid,
            "gi": self.gi,
            "ci": self.ci,
            "profile": self.profile,
            "slices": self.slices,
            "memory_mb": self.memory_mb,
        }


@dataclass(slots=True)
class InstanceReading:
    """One MIG instance's second: which instance, and what was read of it."""

    instance: MigInstance
    reading: Reading


@dataclass
class GpuInfo:
    """What the ``gpus`` block of a push says about one GPU (docs/ingest.md), keyed by UUID."""

    uuid: str
    index: int
    name: str
    memory_total_bytes: int | None = None
    power_limit_w: float | None = None
    lost: bool = False
    # MIG mode: the instances now (``None``: not in MIG mode, no ``mig`` key sent)
    mig: tuple[MigInstance, ...] | None = None
    mig_slices: int = 7  # the GPU's slices in MIG mode (7 on A100/H100/H200, 4 on an A30)

    def inventory(self) -> dict[str, Any]:
        d: dict[str, Any] = {"uuid": self.uuid, "index": self.index, "name": self.name}
        if self.memory_total_bytes is not None:
            d["memory_total_bytes"] = self.memory_total_bytes
        if self.power_limit_w is not None:
            d["power_limit_w"] = self.power_limit_w
        if self.mig is not None:
            d["mig"] = [m.wire() for m in self.mig]
            d["mig_slices"] = self.mig_slices
        if self.lost:
            # the server sets the GPU's lost_at, and clears it when a push lists it present
            d["status"] = "lost"
        return d


def mig_combine(r: Reading, instances: Sequence[InstanceReading], slices_total: int) -> None:
    """Fill a GPU's reading in MIG mode from its instances' (docs/agent.md, "MIG"), whichever
    source read them: ``instances`` and ``slices_total`` set; utilisation and the profiling
    fields slice-weighted over the GPU's slices (a slice in no instance counts 0; a profiling
    field only where every instance has it); processes summed over the instances that said."""
    total = max(slices_total, 1)
    util = 0.0
    prof = [0.0, 0.0, 0.0, 0.0]
    prof_all = [True, True, True, True]
    procs: int | None = None
    for ir in instances:
        weight = ir.instance.slices / total
        util += (ir.reading.util or 0.0) * weight
        if ir.reading.procs is not None:
            procs = (procs or 0) + ir.reading.procs
        fields = (
            ir.reading.sm_active_pct,
            ir.reading.sm_occupancy_pct,
            ir.reading.tensor_active_pct,
            ir.reading.dram_active_pct,
        )
        for k, v in enumerate(fields):
            if v is None:
                prof_all[k] = False
            else:
                prof[k] += v * weight
    r.instances = tuple(instances)
    r.slices_total = total
    r.util = min(util, 100.0)
    r.procs = procs
    if instances:
        r.sm_active_pct, r.sm_occupancy_pct, r.tensor_active_pct, r.dram_active_pct = (
            prof[k] if prof_all[k] else None for k in range(4)
        )


def inventory(gpus: Iterable[GpuInfo]) -> list[dict[str, Any]]:
    """The ``gpus`` block, by index. Called from the sender thread too: a snapshot first."""
    return [g.inventory() for g in sorted(list(gpus), key=lambda g: g.index)]


@dataclass
class TickResult:
    readings: dict[str, Reading]  # uuid → this second's reading
    lost: list[str]  # GPUs lost during this tick (their open intervals close now)
    down: bool  # the source could not be read at all this tick: the second is missing


@runtime_checkable
class Source(Protocol):
    """One reading per GPU per second, and the GPU block of a push."""

    up: bool  # the last read worked
    discovered: bool  # the GPUs have been listed once since the start (delivery waits)
    driver_version: str | None

    def read(self, now: float) -> TickResult:
        """Read every GPU now (``now``: the agent's tick second)."""
        ...

    def inventory(self) -> list[dict[str, Any]]:
        """The ``gpus`` block (docs/ingest.md): every GPU seen since the start, lost ones marked
        ``"status": "lost"``. Called from the sender thread too."""
        ...

    def shutdown(self) -> None: ...
