"""One-second readings → one summary per GPU per interval (docs/metrics.md, docs/ingest.md).

Timing convention: the agent ticks on whole seconds. The tick at time ``T`` reads what happened
in the second ``[T-1, T)`` (the utilisation samples buffered since the last tick, the energy
counter's growth since ``T-1``, the power and clocks right now), so it is attributed to
second ``T-1``. An interval ``[S, S+n)`` is therefore complete after the tick at ``S+n`` and
is sent without waiting for the next one. ``n`` divides 3600 and ``S`` is a multiple of ``n``
counted from the Unix epoch, so no interval crosses an hour boundary.

Every summary field is computed by :func:`finalise` from integer sums, so the tick path (the
real agent) and the analytic path (the fleet simulator) round identically.

Workloads (docs/agent.md): each second, every workload holding the GPU gets ``1/n`` of it in
``share_s`` and ``(that second's utilisation / 100) / n`` in ``air_s``, ``n`` being the number
of workloads holding it in that second. The sums are kept per ``n`` (seconds and Σ
utilisation), so the tick path and the simulator's closed form add up the same numbers, and
divided once, when the interval closes.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import pynvml

from .source import Reading, Workload

log = logging.getLogger("gpufleet.agent")

THROTTLE_KEYS = ("power_cap", "thermal", "hw_slowdown", "other", "any")

# The profiling fields of docs/agent.md, in the order of Accumulator.prof_sum.
PROF_KEYS = ("sm_active", "sm_occupancy", "tensor_active", "dram_active")

# A stuck energy counter (docs/metrics.md): over the seconds that have both a counter delta and a
# power reading, the counter grew by less than STUCK_RATIO of what the power readings add up
# to, while the mean power was at least STUCK_FLOOR_MW. The counter updates every 20–100 ms
# and the power reading is a sample of the same sensor, so over an interval the two agree to
# a few per cent; half is far outside that, yet a counter that stopped for most of an
# interval is caught. Below the floor the GPU draws too little for the comparison to mean
# anything (and the energy at stake is small). Sums are compared over the same seconds, so a
# late tick (one delta short, the next one long) cannot trip it.
STUCK_RATIO = 0.5
STUCK_FLOOR_MW = 10_000


def _bit(name: str) -> int:
    # nvidia-ml-py renamed nvmlClocksThrottleReason* to nvmlClocksEventReason*; older releases
    # only have the first spelling. The bit values are the same.
    value: Any = getattr(pynvml, "nvmlClocksEventReason" + name, None)
    if value is None:
        value = getattr(pynvml, "nvmlClocksThrottleReason" + name, 0)
    return int(value)


REASON_GPU_IDLE = _bit("GpuIdle")
REASON_POWER_CAP = _bit("SwPowerCap")
REASON_THERMAL = _bit("SwThermalSlowdown") | _bit("HwThermalSlowdown")
REASON_HW_SLOWDOWN = _bit("HwSlowdown") | _bit("HwPowerBrakeSlowdown")
# Everything else that limits clocks (application clocks, sync boost, display clock, board
# limit, reliability, and any bit NVIDIA adds later). The GPU-idle bit is not a throttle: the
# clocks drop because nothing runs.
REASON_OTHER = ~(REASON_GPU_IDLE | REASON_POWER_CAP | REASON_THERMAL | REASON_HW_SLOWDOWN)


# docs/agent.md and the server (telemetry/wire.py): at most 32 workloads per sample, strings of
# at most 200 printable characters, an id without surrounding whitespace.
WORKLOADS_MAX = 32
WORKLOAD_TEXT_MAX = 200
WORKLOAD_KINDS = frozenset({"slurm", "k8s", "container", "user"})

_ISO_CACHE: dict[int, str] = {}


def iso(ts: int) -> str:
    """Unix seconds → ``2026-11-30T09:00:00Z``."""
    s = _ISO_CACHE.get(ts)
    if s is None:
        if len(_ISO_CACHE) > 4096:
            _ISO_CACHE.clear()
        s = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))
        _ISO_CACHE[ts] = s
    return s


class Accumulator:
    """Sums over the ticks of one GPU in one interval (all integers, so nothing drifts)."""

    __slots__ = (
        "start",
        "n",
        "util_sum",
        "util_n",
        "mem_util_sum",
        "mem_util_n",
        "mem_used_max",
        "procs_max",
        "power_sum",
        "power_n",
        "energy_sum",
        "energy_n",
        "fallback_sum",
        "fallback_n",
        "energy_reset",
        "pair_energy",
        "pair_power",
        "pair_n",
        "temp_max",
        "clock_sum",
        "clock_n",
        "thr",
        "thr_n",
        "prof_sum",
        "prof_cnt",
        "prof_n",
        "wl_n",
        "wl",
    )

    def __init__(self, start: int) -> None:
        self.start = start
        self.n = 0
        self.util_sum = 0.0
        self.util_n = 0
        self.mem_util_sum = 0.0
        self.mem_util_n = 0
        self.mem_used_max: int | None = None
        self.procs_max: int | None = None
        self.power_sum = 0  # mW summed over ticks
        self.power_n = 0
        self.energy_sum = 0  # mJ: valid one-second counter deltas
        self.energy_n = 0
        self.fallback_sum = 0  # mJ: power × 1 s for ticks without a valid delta
        self.fallback_n = 0
        self.energy_reset = False
        # the seconds with both a counter delta and a power reading: delta mJ, power mW × 1 s
        self.pair_energy = 0
        self.pair_power = 0
        self.pair_n = 0
        self.temp_max: int | None = None
        self.clock_sum = 0
        self.clock_n = 0
        self.thr = [0, 0, 0, 0, 0]  # seconds: power_cap, thermal, hw_slowdown, other, any
        self.thr_n = 0
        # profiling (PROF_KEYS): Σ % and the seconds that carried each; seconds with any
        self.prof_sum = [0.0, 0.0, 0.0, 0.0]
        self.prof_cnt = [0, 0, 0, 0]
        self.prof_n = 0
        # workloads: the seconds whose source could tell who held the GPU, and per workload
        # (kind, id) its seconds and Σ utilisation by the number holding the GPU with it
        self.wl_n = 0
        self.wl: dict[tuple[str, str], WorkloadSum] = {}

    def add(self, r: Reading, energy_delta_mj: int | None) -> None:
        """Add one tick. ``energy_delta_mj`` is the counter's growth over exactly this second
        (``None`` when there is no previous reading one second ago, or no counter)."""
        self.n += 1
        if r.util is not None:
            self.util_sum += r.util
            self.util_n += 1
        if r.mem_util is not None:
            self.mem_util_sum += r.mem_util
            self.mem_util_n += 1
        if r.mem_used is not None and (self.mem_used_max is None or r.mem_used > self.mem_used_max):
            self.mem_used_max = r.mem_used
        if r.procs is not None and (self.procs_max is None or r.procs > self.procs_max):
            self.procs_max = r.procs
        if r.power_mw is not None:
            self.power_sum += r.power_mw
            self.power_n += 1
        if energy_delta_mj is not None and energy_delta_mj < 0:
            # The counter went backwards: the driver was reloaded. The whole interval falls
            # back to power × time (docs/metrics.md), since
            # part of it was counted from a new origin.
            self.energy_reset = True
        elif energy_delta_mj is not None:
            self.energy_sum += energy_delta_mj
            self.energy_n += 1
            if r.power_mw is not None:
                self.pair_energy += energy_delta_mj
                self.pair_power += r.power_mw
                self.pair_n += 1
        elif r.power_mw is not None:
            self.fallback_sum += r.power_mw  # mW × 1 s = mJ
            self.fallback_n += 1
        if r.temp_c is not None and (self.temp_max is None or r.temp_c > self.temp_max):
            self.temp_max = r.temp_c
        if r.sm_clock_mhz is not None:
            self.clock_sum += r.sm_clock_mhz
            self.clock_n += 1
        if r.reasons is not None:
            bits = r.reasons
            thr = self.thr
            self.thr_n += 1
            if bits & REASON_POWER_CAP:
                thr[0] += 1
            if bits & REASON_THERMAL:
                thr[1] += 1
            if bits & REASON_HW_SLOWDOWN:
                thr[2] += 1
            if bits & REASON_OTHER:
                thr[3] += 1
            if bits & ~REASON_GPU_IDLE:
                thr[4] += 1
        carried = False
        for i, v in enumerate(
            (r.sm_active_pct, r.sm_occupancy_pct, r.tensor_active_pct, r.dram_active_pct)
        ):
            if v is not None:
                self.prof_sum[i] += v
                self.prof_cnt[i] += 1
                carried = True
        if carried:
            self.prof_n += 1
        if r.workloads is not None:
            self.wl_n += 1
            if r.workloads:
                # the second's utilisation as the util_pct mean counts it; a second without
                # one adds no air time
                u = 0.0 if r.util is None else min(max(r.util, 0.0), 100.0)
                hold(self.wl, r.workloads, u, 1)
        elif r.instances is not None and all(i.reading.workloads is not None for i in r.instances):
            # A GPU in MIG mode (docs/agent.md, "MIG"): each instance's holders share its
            # slices of the GPU, so a workload on a 3-slice instance of a 7-slice GPU holds
            # 3/7 of the GPU in that second; slices in no instance, or in one nothing holds,
            # are held by nobody (parked, or air where the GPU's utilisation says so).
            self.wl_n += 1
            for ir in r.instances:
                held = ir.reading.workloads
                if held:
                    u = 0.0 if ir.reading.util is None else min(max(ir.reading.util, 0.0), 100.0)
                    hold(self.wl, held, u, 1, (ir.instance.slices, r.slices_total))


class WorkloadSum:
    """One workload's seconds in an interval: ``by_n[n] = [seconds, Σ util %]`` over the
    seconds in which ``n`` workloads held the GPU; ``meta`` its latest user, account, name.
    On a GPU in MIG mode ``n`` is n workloads × the GPU's slices / their instance's slices."""

    __slots__ = ("meta", "by_n")

    def __init__(self, meta: Workload) -> None:
        self.meta = meta
        self.by_n: dict[float, list[float]] = {}


def hold(
    sums: dict[tuple[str, str], WorkloadSum],
    workloads: tuple[Workload, ...],
    util_sum: float,
    seconds: int,
    part: tuple[int, int] | None = None,
) -> None:
    """Add ``seconds`` seconds in which ``workloads`` (and nothing else) held the GPU, their
    utilisation adding up to ``util_sum`` (%). ``part`` = (slices, the GPU's slices): they
    held only a MIG instance of that many slices, which they share; its utilisation is
    ``util_sum``."""
    held: dict[tuple[str, str], Workload] = {}
    for w in workloads:
        c = clean_workload(w)
        if c is not None:
            held.setdefault((c.kind, c.id), c)
    n: float = len(held)
    if part is not None and part[0] < part[1]:
        n = n * part[1] / part[0]  # the divisor of a second: n workloads on slices/total of it
    for key, w in held.items():
        s = sums.get(key)
        if s is None:
            s = sums[key] = WorkloadSum(w)
        elif s.meta is not w and s.meta != w:
            m = s.meta
            s.meta = Workload(
                w.kind, w.id, w.user or m.user, w.account or m.account, w.name or m.name
            )
        e = s.by_n.get(n)
        if e is None:
            s.by_n[n] = [float(seconds), util_sum]
        else:
            e[0] += seconds
            e[1] += util_sum


def clean_text(v: str | None) -> str | None:
    """What the server takes as workload text: printable characters only (no control
    characters, no lone surrogates), at most 200, no surrounding whitespace; ``None`` if empty."""
    if v is None:
        return None
    if not v.isprintable():
        v = "".join(ch for ch in v if ch.isprintable())
    v = v.strip()[:WORKLOAD_TEXT_MAX].rstrip()
    return v or None


_CLEAN: dict[Workload, Workload | None] = {}


def clean_workload(w: Workload) -> Workload | None:
    """``w`` as the wire can carry it, or ``None`` when it cannot (an unknown kind, no id)."""
    if w in _CLEAN:
        return _CLEAN[w]
    c: Workload | None
    ident = clean_text(w.id) if w.kind in WORKLOAD_KINDS else None
    if ident is None:
        c = None
    else:
        c = Workload(w.kind, ident, clean_text(w.user), clean_text(w.account), clean_text(w.name))
        if c == w:
            c = w
    if len(_CLEAN) >= 4096:
        _CLEAN.clear()
    _CLEAN[w] = c
    return c


_TRUNCATED: set[str] = set()


def workloads_wire(
    sums: dict[tuple[str, str], WorkloadSum], seconds: int, uuid: str = ""
) -> list[dict[str, Any]]:
    """The ``workloads`` of a sample of ``seconds`` seconds, largest share first, within the
    server's rules: 0 < share_s ≤ seconds, 0 ≤ air_s ≤ share_s, Σ share_s ≤ seconds (each is
    rounded to the millisecond, which could push the sum a few ms over: the largest share gives
    them back), at most 32 (the largest shares; the rest is logged once per GPU)."""
    rows: list[dict[str, Any]] = []
    for s in sums.values():
        share = air = 0.0
        for n in sorted(s.by_n):
            secs, util = s.by_n[n]
            share += secs / n
            air += util / 100.0 / n
        share_s = round(min(share, float(seconds)), 3)
        if share_s <= 0:
            continue
        w = s.meta
        row: dict[str, Any] = {"kind": w.kind, "id": w.id}
        if w.user:
            row["user"] = w.user
        if w.account:
            row["account"] = w.account
        if w.name:
            row["name"] = w.name
        row["share_s"] = share_s
        row["air_s"] = min(round(max(air, 0.0), 3), share_s)
        rows.append(row)
    rows.sort(key=lambda r: (-r["share_s"], r["kind"], r["id"]))
    if len(rows) > WORKLOADS_MAX:
        if uuid not in _TRUNCATED:
            _TRUNCATED.add(uuid)
            log.warning(
                "GPU %s: %d workloads held it in one interval; sending the %d with the largest "
                "shares, the most a sample carries (said once per GPU)",
                uuid,
                len(rows),
                WORKLOADS_MAX,
            )
        del rows[WORKLOADS_MAX:]
    excess = round(sum(r["share_s"] for r in rows) - seconds, 3)
    if excess > 0:
        top = rows[0]
        top["share_s"] = round(top["share_s"] - excess, 3)
        top["air_s"] = min(top["air_s"], top["share_s"])
    return rows


def energy_stuck(acc: Accumulator) -> bool:
    """Whether the counter is implausibly low against the power readings (see STUCK_RATIO)."""
    return (
        acc.pair_n > 0
        and acc.pair_power >= STUCK_FLOOR_MW * acc.pair_n
        and acc.pair_energy < STUCK_RATIO * acc.pair_power
    )


def energy_j(acc: Accumulator) -> float | None:
    """The interval's energy in joules by docs/metrics.md, or ``None`` when nothing measures it:
    the counter's deltas, unless the counter is missing for some second, went backwards or
    is stuck, in which case mean power × seconds."""
    n = acc.n
    if (
        not acc.energy_reset
        and acc.energy_n > 0
        and acc.energy_n + acc.fallback_n == n
        and not energy_stuck(acc)
    ):
        return round((acc.energy_sum + acc.fallback_sum) / 1000.0, 3)
    if acc.power_n > 0:
        # mean power (mW) × seconds → mJ → J
        return round(acc.power_sum / acc.power_n * n / 1000.0, 3)
    return None


def finalise(uuid: str, acc: Accumulator) -> dict[str, Any] | None:
    """The wire-format sample (docs/ingest.md) for one closed interval; unknown fields are omitted.

    Returns ``None`` when utilisation was never read: ``util_pct`` is required on the wire.
    """
    if acc.util_n == 0 or acc.n == 0:
        return None
    s: dict[str, Any] = {
        "gpu": uuid,
        "start": iso(acc.start),
        "seconds": acc.n,
        "util_pct": round(acc.util_sum / acc.util_n, 2),
    }
    if acc.mem_util_n:
        s["mem_util_pct"] = round(acc.mem_util_sum / acc.mem_util_n, 2)
    if acc.mem_used_max is not None:
        s["mem_used_bytes"] = acc.mem_used_max
    if acc.procs_max is not None:
        s["procs"] = acc.procs_max
    if acc.power_n:
        s["power_w"] = round(acc.power_sum / acc.power_n / 1000.0, 2)
    e = energy_j(acc)
    if e is not None:
        s["energy_j"] = e
    if acc.temp_max is not None:
        s["temp_c"] = acc.temp_max
    if acc.clock_n:
        s["sm_clock_mhz"] = round(acc.clock_sum / acc.clock_n)
    if acc.thr_n:
        t = acc.thr
        s["throttle_s"] = {
            "power_cap": t[0],
            "thermal": t[1],
            "hw_slowdown": t[2],
            "other": t[3],
            "any": t[4],
        }
    if acc.prof_n:
        # docs/agent.md: each an interval mean in 0–1 over the seconds that carried it, and
        # prof_s the seconds those means cover; absent (never 0) when no second carried any.
        # The four come from one GPM call or one scrape, so they cover the same seconds
        # unless the source failed for one field only.
        for key, total, count in zip(PROF_KEYS, acc.prof_sum, acc.prof_cnt, strict=True):
            if count:
                s[key] = round(total / count / 100.0, 4)
        s["prof_s"] = acc.prof_n
    if acc.wl_n:
        # the source could tell who held the GPU: the key goes, an empty list when nothing did
        # (then the server counts the interval's non-air time as parked)
        s["workloads"] = workloads_wire(acc.wl, acc.n, uuid)
    return s


class Summariser:
    """Per-GPU accumulators keyed by UUID; emits each interval once it is complete."""

    def __init__(self, interval_s: int) -> None:
        if interval_s < 1 or 3600 % interval_s:
            raise ValueError(f"interval must divide 3600 seconds, got {interval_s}")
        self.interval_s = interval_s
        self._acc: dict[str, Accumulator] = {}
        # uuid → (second, counter mJ) of the last energy reading, to take one-second deltas
        self._last_energy: dict[str, tuple[int, int]] = {}
        # uuid → [intervals, seconds] sent as power × time because the counter was stuck,
        # while the episode lasts: logged once when it starts and once when it ends
        self._stuck: dict[str, list[int]] = {}
        # MIG instance UUID → its GPU's UUID: their samples name both (docs/ingest.md)
        self._parent: dict[str, str] = {}

    def align(self, second: int) -> int:
        return second - second % self.interval_s

    def add(self, uuid: str, second: int, r: Reading) -> list[dict[str, Any]]:
        """Add the reading for ``second``; returns samples of intervals this one closed."""
        out: list[dict[str, Any]] = []
        start = second - second % self.interval_s
        acc = self._acc.get(uuid)
        if acc is not None and acc.start != start:
            out.extend(self._close(uuid))
            acc = None
        if acc is None:
            acc = self._acc[uuid] = Accumulator(start)
        delta: int | None = None
        if r.energy_mj is not None:
            prev = self._last_energy.get(uuid)
            if prev is not None and prev[0] == second - 1:
                delta = r.energy_mj - prev[1]
            self._last_energy[uuid] = (second, r.energy_mj)
        acc.add(r, delta)
        if second == start + self.interval_s - 1:
            out.extend(self._close(uuid))
        if r.instances is not None:
            # each instance its own sample (``instance``), over the seconds it existed
            for ir in r.instances:
                self._parent[ir.instance.uuid] = uuid
                out.extend(self.add(ir.instance.uuid, second, ir.reading))
        return out

    def close_due(self, now_second: int) -> list[dict[str, Any]]:
        """Close intervals that ended at or before ``now_second`` (a GPU that stopped
        answering, or NVML that went away, must not hold its last interval forever)."""
        out: list[dict[str, Any]] = []
        for uuid in [u for u, a in self._acc.items() if a.start + self.interval_s <= now_second]:
            out.extend(self._close(uuid))
        return out

    def flush(self, uuid: str | None = None) -> list[dict[str, Any]]:
        """Close the open (partial) interval of one GPU, or of all (on shutdown, which also
        logs the count of a stuck-counter episode still going on)."""
        out: list[dict[str, Any]] = []
        if uuid is not None:
            # a lost GPU's instances close with it
            wanted = [uuid, *(m for m, p in self._parent.items() if p == uuid and m in self._acc)]
        else:
            wanted = list(self._acc)
        for u in wanted:
            out.extend(self._close(u))
        if uuid is None:
            for u in list(self._stuck):
                self._stuck_end(u, "still stuck at shutdown")
        return out

    def forget_energy(self) -> None:
        """After NVML is re-initialised the counter may restart: never diff across that."""
        self._last_energy.clear()

    def _close(self, uuid: str) -> list[dict[str, Any]]:
        acc = self._acc.pop(uuid, None)
        if acc is None:
            return []
        if energy_stuck(acc):
            self._stuck_note(uuid, acc)
        elif acc.pair_n and uuid in self._stuck:
            self._stuck_end(uuid, "moves again")
        s = finalise(uuid, acc)
        if s is None:
            return []
        parent = self._parent.get(uuid)
        if parent is not None:
            s = {"gpu": parent, "instance": uuid, **{k: v for k, v in s.items() if k != "gpu"}}
        return [s]

    def _stuck_note(self, uuid: str, acc: Accumulator) -> None:
        episode = self._stuck.get(uuid)
        if episode is None:
            episode = self._stuck[uuid] = [0, 0]
            log.warning(
                "GPU %s: energy counter grew %.0f J in %d s while the power readings add up to "
                "%.0f J; sending mean power × seconds until it moves again",
                uuid,
                acc.pair_energy / 1000.0,
                acc.pair_n,
                acc.pair_power / 1000.0,
            )
        episode[0] += 1
        episode[1] += acc.n

    def _stuck_end(self, uuid: str, how: str) -> None:
        intervals, seconds = self._stuck.pop(uuid)
        log.warning(
            "GPU %s: energy counter %s; %d intervals (%d s) were sent as mean power × seconds",
            uuid,
            how,
            intervals,
            seconds,
        )
