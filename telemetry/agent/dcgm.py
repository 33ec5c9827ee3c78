"""An existing dcgm-exporter as the agent's source: ``gpufleet-agent --source dcgm``.

Once a second the source fetches the exporter's ``/metrics`` (Prometheus text), parses it with
``prometheus_client``'s text parser and turns each GPU's series into one
:class:`~.source.Reading`, with the field map of docs/agent.md. From there on it is the same
summariser as NVML's, so the same rules hold: a second without an answer is a missing second
(the node's GPUs are offline for it, never idle), a counter that went backwards falls back to
power × time, a GPU that leaves the output is reported lost.

``prometheus-client`` is imported when a source is made, not with this module: a node that
only reads NVML does not need it.
"""

from __future__ import annotations

import http.client
import logging
import math
import re
import time
import urllib.parse
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

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

log = logging.getLogger("gpufleet.agent")

DEFAULT_URL = "http://127.0.0.1:9400/metrics"

# The scrape is part of the one-second tick: a slow or hung exporter must leave the tick time
# to finish inside its second, and a late answer is worth less than the next second's.
SCRAPE_TIMEOUT_S = 0.7
# An 8-GPU node with every profiling field and pod labels answers ~100 KB; far more is not an
# exporter.
MAX_BODY_BYTES = 16 << 20

MIB = 1 << 20

# DCGM marks values it does not have with "blank" sentinels near the top of each type's range
# (DCGM_INT32_BLANK 0x7ffffff0, DCGM_INT64_BLANK 0x7ffffffffffffff0, DCGM_FP64_BLANK 2^47).
# Every field is read through a plausible range, which keeps all of them out.
_FIELDS: dict[str, tuple[float, float]] = {
    "DCGM_FI_DEV_GPU_UTIL": (0, 100),  # %
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": (0, 1.01),  # ratio
    "DCGM_FI_DEV_MEM_COPY_UTIL": (0, 100),  # %
    "DCGM_FI_DEV_FB_USED": (0, 1 << 24),  # MiB
    "DCGM_FI_DEV_FB_FREE": (0, 1 << 24),
    "DCGM_FI_DEV_FB_RESERVED": (0, 1 << 24),
    "DCGM_FI_DEV_POWER_USAGE": (0, 5000),  # W
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": (0, 1 << 62),  # mJ since the driver loaded
    "DCGM_FI_DEV_GPU_TEMP": (-50, 150),  # °C
    "DCGM_FI_DEV_SM_CLOCK": (0, 10_000),  # MHz
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": (0, (1 << 32) - 1),  # NVML's bitmask
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": (0, (1 << 32) - 1),  # its name before DCGM 3.3
    "DCGM_FI_PROF_SM_ACTIVE": (0, 1.01),  # ratios
    "DCGM_FI_PROF_SM_OCCUPANCY": (0, 1.01),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": (0, 1.01),
    "DCGM_FI_PROF_DRAM_ACTIVE": (0, 1.01),
}


def _parser() -> Callable[[str], Iterable[Any]]:
    try:
        from prometheus_client.parser import text_string_to_metric_families
    except ImportError as e:
        raise RuntimeError(
            "--source dcgm needs prometheus-client: pip install 'gpufleet[agent]' "
            "(or pip install prometheus-client)"
        ) from e
    return text_string_to_metric_families


@dataclass
class InstanceSeries:
    """One MIG instance's values in one answer: the exporter labels them with the GPU's UUID
    and the GPU instance's id and profile (``GPU_I_ID``, ``GPU_I_PROFILE``)."""

    gi: int
    profile: str
    values: dict[str, float] = field(default_factory=dict)
    pods: set[tuple[str, str]] = field(default_factory=set)  # (namespace, pod)


@dataclass
class Series:
    """One GPU's values in one answer: the first of each field (a GPU that several pods share
    repeats its series with each pod's labels, with the same value), and its MIG instances'."""

    index: int
    name: str
    values: dict[str, float] = field(default_factory=dict)
    pod_labels: bool = False  # the exporter maps GPUs to pods (its pod/namespace labels exist)
    pods: set[tuple[str, str]] = field(default_factory=set)  # (namespace, pod)
    instances: dict[int, InstanceSeries] = field(default_factory=dict)  # by GPU instance id


def _metric(line: str) -> str:
    """The metric a line of the exposition is about: a sample's name, or the name a ``# HELP``
    or ``# TYPE`` line describes ("" for other comments and blank lines)."""
    if line.startswith("#"):
        parts = line.split(None, 3)
        return parts[2] if len(parts) > 2 and parts[1] in ("HELP", "TYPE") else ""
    return line.split("{", 1)[0].split(None, 1)[0] if line.strip() else ""


def only_fields_read(text: str) -> str:
    """The lines about the fields the agent reads. An exporter with the default and profiling
    counters answers ~30 fields per GPU, half of which the agent never looks at; the parser is
    most of a scrape's cost, so it is handed only the others. A sample line never spans two
    lines (newlines in label values and help text are escaped), so this cuts no sample."""
    keep = []
    for line in text.splitlines():
        if _metric(line) in _FIELDS:
            keep.append(line)
    return "\n".join(keep) + "\n"


def parse(
    text: str, families: Callable[[str], Iterable[Any]]
) -> tuple[dict[str, Series], str | None]:
    """The GPUs of one exposition, by UUID, and the driver version its labels name."""
    gpus: dict[str, Series] = {}
    driver: str | None = None
    for family in families(only_fields_read(text)):
        wanted = family.name in _FIELDS
        # the parser names a counter's samples <name>_total
        names = (family.name, family.name + "_total")
        for sample in family.samples:
            labels = sample.labels
            uuid = labels.get("UUID")
            if not uuid:
                continue
            s = gpus.get(uuid)
            if s is None:
                try:
                    index = int(labels.get("gpu", ""))
                except ValueError:
                    index = len(gpus)
                s = gpus[uuid] = Series(index=index, name=labels.get("modelName", ""))
                driver = driver or labels.get("DCGM_FI_DRIVER_VERSION") or None
            # A MIG instance repeats its GPU's UUID with its GPU instance's id: its values
            # and pods are the instance's, not the GPU's.
            target: Series | InstanceSeries = s
            gi_label = labels.get("GPU_I_ID", "")
            if gi_label:
                try:
                    gi = int(gi_label)
                except ValueError:
                    continue
                inst = s.instances.get(gi)
                if inst is None:
                    inst = s.instances[gi] = InstanceSeries(gi, labels.get("GPU_I_PROFILE", ""))
                target = inst
            if "pod" in labels:
                s.pod_labels = True
                pod, namespace = labels["pod"], labels.get("namespace", "")
                if pod and namespace:
                    target.pods.add((namespace, pod))
            if not wanted or sample.name not in names:
                continue
            lo, hi = _FIELDS[family.name]
            v = float(sample.value)
            if family.name not in target.values and math.isfinite(v) and lo <= v <= hi:
                target.values[family.name] = v
    return gpus, driver


def _pct_of_ratio(v: float | None) -> float | None:
    return None if v is None else min(v, 1.0) * 100.0


def _int(v: float | None) -> int | None:
    return None if v is None else int(round(v))


_SLICES = re.compile(r"(\d+)g\.")
# The wire's limits for an instance's UUID and profile (telemetry.wire: UUID_MAX, MIG_PROFILE_MAX)
MIG_UUID_MAX, MIG_PROFILE_MAX = 100, 50


def mig_instance(gpu_uuid: str, inst: InstanceSeries) -> MigInstance:
    """The instance as the ``mig`` list names it. The exporter gives no MIG UUID: the
    instance is named by its GPU, GPU instance id and profile (``MIG-<GPU>-<gi>-<profile>``,
    stable while the GPU keeps that layout); its slices from the profile (``3g.40gb``: 3), its
    memory from its framebuffer fields, else from the profile; one compute instance (id 0)."""
    found = _SLICES.search(inst.profile)
    slices = int(found.group(1)) if found else 1
    v = inst.values
    if "DCGM_FI_DEV_FB_USED" in v and "DCGM_FI_DEV_FB_FREE" in v:
        used, free = v["DCGM_FI_DEV_FB_USED"], v["DCGM_FI_DEV_FB_FREE"]
        memory_mb = int(used + free + v.get("DCGM_FI_DEV_FB_RESERVED", 0))
    else:
        gb = re.search(r"(\d+)gb", inst.profile)
        memory_mb = int(gb.group(1)) * 1024 if gb else 0
    short = gpu_uuid.removeprefix("GPU-")
    return MigInstance(
        uuid=f"MIG-{short}-{inst.gi}-{inst.profile or 'unknown'}"[:MIG_UUID_MAX],
        gi=inst.gi,
        ci=0,
        profile=(inst.profile or "unknown")[:MIG_PROFILE_MAX],
        slices=slices,
        memory_mb=memory_mb,
    )


def _instance_reading(inst: InstanceSeries, pod_labels: bool) -> Reading:
    """One instance's second: its graphics engine's activity as utilisation (0 where the
    exporter has none: held or parked, DESIGN §9.5), its memory and profiling fields, its
    pods where the exporter maps pods."""
    v = inst.values.get
    used = v("DCGM_FI_DEV_FB_USED")
    util = _pct_of_ratio(v("DCGM_FI_PROF_GR_ENGINE_ACTIVE"))
    return Reading(
        util=0.0 if util is None else util,
        mem_used=None if used is None else int(used) * MIB,
        sm_active_pct=_pct_of_ratio(v("DCGM_FI_PROF_SM_ACTIVE")),
        sm_occupancy_pct=_pct_of_ratio(v("DCGM_FI_PROF_SM_OCCUPANCY")),
        tensor_active_pct=_pct_of_ratio(v("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE")),
        dram_active_pct=_pct_of_ratio(v("DCGM_FI_PROF_DRAM_ACTIVE")),
        workloads=(
            tuple(
                Workload("k8s", f"{namespace}/{pod}", account=namespace)
                for namespace, pod in sorted(inst.pods)
            )
            if pod_labels
            else None
        ),
    )


def mig_slices(name: str) -> int:
    """A MIG-capable GPU's slices: 4 on an A30, 7 on the others (A100, H100, H200, B200)."""
    return 4 if "A30" in name else 7


def reading(s: Series, uuid: str = "") -> Reading:
    """docs/agent.md's map from one GPU's DCGM fields to a reading; in MIG mode (instance
    series under the GPU's ``uuid``) one reading per instance, the GPU's filled from them."""
    v = s.values.get
    util = v("DCGM_FI_DEV_GPU_UTIL")
    if util is None:
        # setups with profiling often export the graphics engine's activity and not GPU_UTIL
        util = _pct_of_ratio(v("DCGM_FI_PROF_GR_ENGINE_ACTIVE"))
    used = v("DCGM_FI_DEV_FB_USED")
    reasons = v("DCGM_FI_DEV_CLOCKS_EVENT_REASONS")
    if reasons is None:
        reasons = v("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS")
    workloads: tuple[Workload, ...] | None = None
    if s.pod_labels:
        workloads = tuple(
            Workload("k8s", f"{namespace}/{pod}", account=namespace)
            for namespace, pod in sorted(s.pods)
        )
    power = v("DCGM_FI_DEV_POWER_USAGE")
    r = Reading(
        util=util,
        mem_util=v("DCGM_FI_DEV_MEM_COPY_UTIL"),
        mem_used=None if used is None else int(used) * MIB,
        power_mw=None if power is None else int(round(power * 1000.0)),  # W → mW
        energy_mj=_int(v("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION")),
        temp_c=_int(v("DCGM_FI_DEV_GPU_TEMP")),
        sm_clock_mhz=_int(v("DCGM_FI_DEV_SM_CLOCK")),
        reasons=_int(reasons),
        sm_active_pct=_pct_of_ratio(v("DCGM_FI_PROF_SM_ACTIVE")),
        sm_occupancy_pct=_pct_of_ratio(v("DCGM_FI_PROF_SM_OCCUPANCY")),
        tensor_active_pct=_pct_of_ratio(v("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE")),
        dram_active_pct=_pct_of_ratio(v("DCGM_FI_PROF_DRAM_ACTIVE")),
        workloads=workloads,
    )
    if s.instances:
        r.workloads = None  # the instances say who held their slices
        mig_combine(
            r,
            [
                InstanceReading(mig_instance(uuid, inst), _instance_reading(inst, s.pod_labels))
                for _, inst in sorted(s.instances.items())
            ],
            mig_slices(s.name),
        )
    return r


def memory_total_bytes(s: Series) -> int | None:
    """Used + free (+ reserved, where the exporter has it: newer DCGM counts it apart)."""
    v = s.values
    if "DCGM_FI_DEV_FB_USED" not in v or "DCGM_FI_DEV_FB_FREE" not in v:
        return None
    mib = v["DCGM_FI_DEV_FB_USED"] + v["DCGM_FI_DEV_FB_FREE"]
    return int(mib + v.get("DCGM_FI_DEV_FB_RESERVED", 0)) * MIB


class Scraper:
    """GET one URL over one kept-alive connection, within a deadline."""

    def __init__(self, url: str, timeout_s: float) -> None:
        u = urllib.parse.urlsplit(url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"--dcgm-url must be an http(s) URL, got {url!r}")
        self.url = url
        self.timeout_s = timeout_s
        self._https = u.scheme == "https"
        self._host = u.hostname
        self._port = u.port
        self._path = (u.path or "/") + (f"?{u.query}" if u.query else "")
        self._conn: http.client.HTTPConnection | None = None

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def get(self) -> str:
        deadline = time.monotonic() + self.timeout_s
        for attempt in (1, 2):
            fresh = self._conn is None
            try:
                return self._get(deadline)
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                # the exporter closed the idle kept-alive connection: one new one, at once
                self.close()
                if fresh or attempt == 2:
                    raise
            except BaseException:
                self.close()
                raise
        raise AssertionError("unreachable")

    def _get(self, deadline: float) -> str:
        if self._conn is None:
            cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
            self._conn = cls(self._host, self._port, timeout=self.timeout_s)
        conn = self._conn
        conn.request("GET", self._path, headers={"Accept": "text/plain"})
        if conn.sock is not None:
            conn.sock.settimeout(max(0.001, deadline - time.monotonic()))
        resp = conn.getresponse()
        chunks: list[bytes] = []
        size = 0
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no whole answer within {self.timeout_s:g} s")
            if conn.sock is not None:
                conn.sock.settimeout(left)
            chunk = resp.read(65536)  # b"" at the end, which also frees the connection
            if not chunk:
                break
            size += len(chunk)
            if size > MAX_BODY_BYTES:
                raise ValueError(f"answer larger than {MAX_BODY_BYTES >> 20} MiB")
            chunks.append(chunk)
        if resp.will_close:
            self.close()
        if resp.status != 200:
            raise ValueError(f"HTTP {resp.status} {resp.reason}")
        return b"".join(chunks).decode("utf-8", "replace")


class DcgmSource:
    """The exporter at ``url`` as a source (source.py): one reading per GPU per scrape."""

    def __init__(self, url: str = DEFAULT_URL, *, timeout_s: float = SCRAPE_TIMEOUT_S) -> None:
        self._families = _parser()
        self.scraper = Scraper(url, timeout_s)
        self.url = url
        self.gpus: dict[str, GpuInfo] = {}
        self.up = False
        self.discovered = False
        self.driver_version: str | None = None
        self.missed = 0  # seconds without an answer in the current outage

    def read(self, now: float) -> TickResult:
        try:
            series, driver = parse(self.scraper.get(), self._families)
            if not series:
                # an exporter that has lost DCGM answers with no GPU: not an answer about them
                raise ValueError("an answer without any GPU series")
        except Exception as e:  # refused, timed out, an HTTP error, text that does not parse …
            self._miss(e)
            return TickResult({}, [], True)
        if self.missed:
            log.warning(
                "dcgm-exporter at %s answers again after %d missed seconds", self.url, self.missed
            )
            self.missed = 0
        self.up = self.discovered = True
        if driver:
            self.driver_version = driver
        readings: dict[str, Reading] = {}
        for uuid, s in series.items():
            g = self.gpus.get(uuid)
            if g is None:
                g = self.gpus[uuid] = GpuInfo(uuid=uuid, index=s.index, name=s.name)
                log.info("found GPU %d %s %s at dcgm-exporter %s", s.index, uuid, s.name, self.url)
            elif g.lost:
                g.lost = False
                log.warning("GPU %s is back in dcgm-exporter's answer", uuid)
            g.index, g.name = s.index, s.name or g.name
            total = memory_total_bytes(s)
            if total is not None:
                g.memory_total_bytes = total
            r = readings[uuid] = reading(s, uuid)
            if r.instances is None:
                g.mig = None
            else:
                g.mig = tuple(ir.instance for ir in r.instances)
                g.mig_slices = r.slices_total
        lost: list[str] = []
        for g in self.gpus.values():
            if not g.lost and g.uuid not in series:
                g.lost = True
                lost.append(g.uuid)
                log.error(
                    "GPU %d %s is gone from dcgm-exporter's answer: reported lost; "
                    "reporting the others",
                    g.index,
                    g.uuid,
                )
        return TickResult(readings, lost, False)

    def _miss(self, err: BaseException) -> None:
        self.up = False
        self.missed += 1
        if self.missed == 1:
            log.warning(
                "dcgm-exporter at %s did not answer (%s): its GPUs are offline until it does",
                self.url,
                str(err) or type(err).__name__,
            )

    def inventory(self) -> list[dict[str, Any]]:
        return inventory(self.gpus.values())

    def shutdown(self) -> None:
        self.scraper.close()
