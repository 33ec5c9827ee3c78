"""The job hook's socket (docs/agent.md, "Job efficiency hook"; DESIGN.md §9.4): reports of
training loops, attributed by the sender's pid to its workload and that workload's GPUs.

A job's ``gpufleet_hook`` sends one JSON datagram of sums every 10 s to a Unix datagram
socket (``--hook-socket``, default ``/run/gpufleet/hook.sock``, mode 0666: any local user's
job may report). Jobs hold no token: the socket has ``SO_PASSCRED`` set, so the kernel attaches
the sender's credentials to each datagram, and the pid comes from those, never from the body.

A reader thread moves each datagram off the socket as it comes (Linux queues only
``net.unix.max_dgram_qlen`` datagrams, 10 by default, on a socket: at one read a second, jobs
beyond ten reports a second would be dropped); each tick takes what came
(:meth:`HookListener.drain`), resolves
each sender's pid to its workload with the workload resolver the GPU processes use
(``workloads.Discovery``: its process resolver, then its canonical form of the workload), and
adds the report to that workload's sums for the interval the report arrived in. When the
interval's samples close, :meth:`HookListener.attach` finds the workload's GPUs (the samples of
that interval whose ``workloads`` name it) and adds ``job`` to them:

- counts (``steps``, ``samples``, ``tokens``, ``flops``, ``ckpt_bytes``) are split evenly over
  the GPUs, so that their sum over the GPUs is what the job reported;
- times (``wall_s``, ``data_wait_s``, ``compute_s``, ``ckpt_s``) are the job's, on each GPU:
  every GPU of the job spent that wall time waiting for data, computing or checkpointing, and
  Σ ``wall_s`` over the GPUs is then the job's GPU seconds (what MFU divides by). A window that
  reached the agent late may make ``wall_s`` longer than the sample: the times are then scaled
  down to the sample's seconds together (their shares of the wall time stay as reported);
- one model per GPU per interval: where several (workload, model) pairs reported for one GPU
  (two jobs sharing it, or one job that renamed its model), the pair with the largest
  ``wall_s`` wins (ties: the first model name in order) and the others are not sent for that
  GPU, counted in ``hook_reports_unattributed``.

Memory is bounded: at most :data:`MAX_REPORTS_PER_S` × interval reports per interval, at most
:data:`MAX_KEYS` (workload, model) pairs, at most :data:`MAX_PENDING` reports waiting for their
pid's reads. A malformed or oversized datagram, a sender whose pid cannot be seen, and reports
beyond those bounds are dropped and counted (:attr:`HookListener.counts`, logged once a type).
"""

from __future__ import annotations

import json
import logging
import math
import os
import select
import socket
import stat
import struct
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .source import Workload
from .summarise import clean_text
from .workloads import SaidOnce

log = logging.getLogger("gpufleet.agent")

DEFAULT_HOOK_SOCKET = "/run/gpufleet/hook.sock"
# The hook sends at most 4 KB; one byte more is read to tell an oversized datagram.
MAX_DATAGRAM = 4096
# A tick takes at most this many datagrams; the rest wait in the socket's buffer (the kernel
# bounds it and makes the senders drop, never wait). Linux queues only
# net.unix.max_dgram_qlen datagrams on a socket (10 by default), so a reader thread moves them
# into the agent's own inbox as they come, which holds at most MAX_PER_TICK (4 MB).
MAX_PER_TICK = 1024
# 64 jobs reporting every 10 s send 6.4 reports a second; this leaves room for bursts.
MAX_REPORTS_PER_S = 100
MAX_KEYS = 1024
MAX_PENDING = 256
# Ticks a report waits for its sender's /proc reads before it is dropped.
PENDING_TICKS = 5
MODEL_DEFAULT = "unnamed"

# The report's numbers, in the order of :class:`JobSums`.
COUNT_FIELDS = ("steps", "samples", "tokens", "flops", "ckpt_bytes")
TIME_FIELDS = ("wall_s", "data_wait_s", "compute_s", "ckpt_s")
_CRED = struct.Struct("3i")  # struct ucred: pid, uid, gid
_CMSG_SPACE = socket.CMSG_SPACE(_CRED.size)


@dataclass(slots=True)
class JobSums:
    """The sums of one (workload, model) over one interval."""

    workload: Workload
    model: str
    counts: list[float] = field(default_factory=lambda: [0.0] * len(COUNT_FIELDS))
    times: list[float] = field(default_factory=lambda: [0.0] * len(TIME_FIELDS))
    has_flops: bool = False

    def add(self, r: Report) -> None:
        for i, v in enumerate(r.counts):
            self.counts[i] += v
        for i, v in enumerate(r.times):
            self.times[i] += v
        self.has_flops = self.has_flops or r.has_flops


@dataclass(slots=True)
class Report:
    """One datagram, checked: its model and numbers."""

    model: str
    counts: tuple[float, ...]
    times: tuple[float, ...]
    has_flops: bool


def report_parse(data: bytes) -> Report | str:
    """A datagram → its :class:`Report`, or why it is refused."""
    if len(data) > MAX_DATAGRAM:
        return "oversized"
    try:
        d = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return "malformed"
    if not isinstance(d, dict) or d.get("v") != 1:
        return "malformed"
    model = d.get("model", "")
    if not isinstance(model, str):
        return "malformed"
    model = clean_text(model) or MODEL_DEFAULT
    values: list[float] = []
    for name in (*COUNT_FIELDS, *TIME_FIELDS):
        v = d.get(name, 0)
        if name == "flops" and v is None:
            v = 0
        # bool is an int to Python, never a number to the wire
        if isinstance(v, bool) or not isinstance(v, int | float):
            return "malformed"
        f = float(v)
        if not math.isfinite(f) or f < 0:
            return "malformed"
        values.append(f)
    counts = tuple(values[: len(COUNT_FIELDS)])
    times = tuple(values[len(COUNT_FIELDS) :])
    wall = times[0]
    # The loop's parts happen within its wall time (1 % for rounding and clock reads).
    if times[1] + times[2] + times[3] > wall * 1.01 + 1e-6:
        return "malformed"
    return Report(model, counts, times, d.get("flops") is not None)


Resolve = Callable[[int], Workload | None]


class HookListener:
    """The agent's end of the hook socket. ``path``: where to bind it; ``resolve``: pid → the
    workload it belongs to (``None``: not known yet, or not visible); ``interval_s``: the
    agent's interval; ``tick``: called before each drain, for a resolver that no GPU sampling
    ticks. Bind failures are logged and leave the listener off (the agent runs on:
    no job efficiency, everything else as before)."""

    def __init__(
        self,
        path: str,
        *,
        resolve: Resolve,
        interval_s: int,
        tick: Callable[[], None] | None = None,
    ) -> None:
        self.path = path
        self.resolve = resolve
        self.tick = tick  # a resolver's tick of its own, called at each drain
        self.interval_s = interval_s
        self.sock: socket.socket | None = None
        # (interval start, kind, id, model) → sums
        self.sums: dict[tuple[int, str, str, str], JobSums] = {}
        # datagrams read off the socket, not taken yet (the reader thread's and the ticks')
        self._inbox: deque[tuple[bytes, list[tuple[int, int, bytes]], int]] = deque()
        self._lock = threading.Lock()
        self._reader: threading.Thread | None = None
        self.reports: dict[int, int] = {}  # interval start → reports taken
        self.pending: list[tuple[int, int, Report, int]] = []  # pid, start, report, tries
        self.counts: dict[str, int] = {
            "received": 0,
            "attributed": 0,
            "malformed": 0,
            "oversized": 0,
            "no_credentials": 0,
            "unknown_pid": 0,
            "over_cap": 0,
            "unattributed": 0,
        }
        self._say = SaidOnce()

    # -- the socket ---------------------------------------------------------------------------
    def open(self) -> bool:
        """Bind the socket (a stale one at the path is replaced); ``False`` when it cannot."""
        path = self.path
        try:
            parent = os.path.dirname(path)
            if parent:
                os.makedirs(parent, mode=0o755, exist_ok=True)
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                pass
            else:
                if not stat.S_ISSOCK(st.st_mode):
                    raise OSError(f"{path} exists and is not a socket")
                os.unlink(path)  # left by an agent that did not stop cleanly
            s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            try:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
                s.setblocking(False)
                s.bind(path)
                # any local user's job may report: the pid, not the permission, says whose
                os.chmod(path, 0o666)
            except OSError:
                s.close()
                raise
        except OSError as e:
            log.warning("job hook socket %s: %s; job efficiency reports are off", path, e)
            return False
        self.sock = s
        self._reader = threading.Thread(
            target=self._read_loop, args=(s,), name="hook-socket", daemon=True
        )
        self._reader.start()
        log.info("job hook socket %s: listening", path)
        return True

    def close(self) -> None:
        if self.sock is None:
            return
        sock, self.sock = self.sock, None
        with self._lock:
            sock.close()
        if self._reader is not None:
            self._reader.join(timeout=2.0)
            self._reader = None
        try:
            if stat.S_ISSOCK(os.lstat(self.path).st_mode):
                os.unlink(self.path)
        except OSError:
            pass

    def _count(self, what: str, n: int = 1) -> None:
        self.counts[what] += n
        if what not in ("received", "attributed"):
            self._say(
                what,
                "job hook: a report dropped (%s); counted in hook_reports_%s (said once)",
                what,
                what,
            )

    def _read(self, s: socket.socket) -> None:
        """Move the datagrams waiting on ``s`` into the inbox, while it has room (the caller
        holds the lock)."""
        while len(self._inbox) < MAX_PER_TICK and s.fileno() >= 0:
            try:
                data, anc, flags, _addr = s.recvmsg(MAX_DATAGRAM + 1, _CMSG_SPACE)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                self._say("recv", "job hook socket: %s (said once)", e)
                return
            self._inbox.append((data, anc, flags))

    def _read_loop(self, s: socket.socket) -> None:
        """The reader thread: reads as datagrams come, so that the kernel's short queue
        (net.unix.max_dgram_qlen) never fills between two ticks; ends with the socket."""
        while self.sock is s:
            try:
                ready, _, _ = select.select([s], [], [], 0.5)
            except (OSError, ValueError):  # closed under it
                return
            if ready:
                with self._lock:
                    if self.sock is not s:
                        return
                    self._read(s)

    def drain(self, second: int) -> None:
        """Take the datagrams that came until now (at most :data:`MAX_PER_TICK`) as reports
        of the second ``second``, and retry those whose sender was not resolved yet."""
        start = second - second % self.interval_s
        if self.tick is not None:
            self.tick()
        retry, self.pending = self.pending, []
        for pid, at, r, tries in retry:
            self._take(pid, at, r, tries + 1)
        s = self.sock
        if s is None:
            return
        with self._lock:
            self._read(s)
            taken = list(self._inbox)
            self._inbox.clear()
        for data, anc, flags in taken:
            self._count("received")
            if flags & socket.MSG_TRUNC or len(data) > MAX_DATAGRAM:
                self._count("oversized")
                continue
            sender = _sender_pid(anc)
            if sender is None:
                self._count("no_credentials")
                continue
            parsed = report_parse(data)
            if isinstance(parsed, str):
                self._count(parsed)
                continue
            self._take(sender, start, parsed, 0)

    def _take(self, pid: int, start: int, r: Report, tries: int) -> None:
        try:
            w = self.resolve(pid)
        except Exception:  # a defect in resolving must cost the report, not the tick
            log.exception("job hook: resolving pid %d failed", pid)
            w = None
        if w is None:
            if tries < PENDING_TICKS and len(self.pending) < MAX_PENDING:
                self.pending.append((pid, start, r, tries))
            else:
                self._count("unknown_pid")
            return
        taken = self.reports.get(start, 0)
        key = (start, w.kind, w.id, r.model)
        sums = self.sums.get(key)
        if taken >= MAX_REPORTS_PER_S * self.interval_s or (
            sums is None and len(self.sums) >= MAX_KEYS
        ):
            self._count("over_cap")
            return
        self.reports[start] = taken + 1
        if sums is None:
            sums = self.sums[key] = JobSums(w, r.model)
        sums.add(r)

    # -- the samples --------------------------------------------------------------------------
    def attach(self, closed: list[dict[str, Any]], *, now: int | None = None) -> None:
        """Add ``job`` to the samples in ``closed`` (wire samples that closed at the tick of
        second ``now``) whose GPUs the reporting workloads held, then forget the sums of the
        intervals over by ``now`` (``None``: the agent stops, all of them). Sums that found no
        GPU are counted unattributed."""
        if not self.sums and not self.pending:
            return
        by_start: dict[int, list[dict[str, Any]]] = {}
        for s in closed:
            by_start.setdefault(_epoch(s["start"]), []).append(s)
        n = self.interval_s
        done = [k for k in self.sums if now is None or k[0] + n <= now]
        # per GPU sample (by identity): the sums of each (workload, model) that held it, with
        # the number of GPUs that workload held in the interval
        cands: dict[int, list[tuple[JobSums, int]]] = {}
        for key in sorted(done):
            sums = self.sums.pop(key)
            samples = [
                s
                for s in by_start.get(key[0], ())
                if any(w["kind"] == key[1] and w["id"] == key[2] for w in s.get("workloads", ()))
            ]
            if not samples:
                self._count("unattributed")
            for s in samples:
                cands.setdefault(id(s), []).append((sums, len(samples)))
        for s in closed:
            got = cands.get(id(s))
            if not got:
                continue
            # one model per GPU per interval: the largest wall time, then the first name
            got.sort(
                key=lambda c: (-c[0].times[0], c[0].model, c[0].workload.kind, c[0].workload.id)
            )
            s["job"] = job_wire(got[0][0], got[0][1], s["seconds"])
            self.counts["attributed"] += 1
            if len(got) > 1:
                self._count("unattributed", len(got) - 1)
        for start in [t for t in self.reports if now is None or t + n <= now]:
            del self.reports[start]
        if now is None:
            self.counts["unknown_pid"] += len(self.pending)
            self.pending = []


def job_wire(sums: JobSums, gpus: int, seconds: int) -> dict[str, Any]:
    """The ``job`` of one of ``gpus`` samples of ``seconds`` seconds (docs/ingest.md)."""
    d: dict[str, Any] = {
        "kind": sums.workload.kind,
        "id": sums.workload.id,
        "model": sums.model,
    }
    for name, v in zip(COUNT_FIELDS, sums.counts, strict=True):
        if name == "flops" and not sums.has_flops:
            continue
        d[name] = round(v / gpus, 6)
    times = list(sums.times)
    if times[0] > seconds:
        scale = seconds / times[0]
        times = [t * scale for t in times]
    wall = round(min(times[0], float(seconds)), 6)
    d["wall_s"] = wall
    rest = [round(t, 6) for t in times[1:]]
    total = sum(rest)
    if total > wall * 1.01:
        # rounding must not push the parts past the wall time the server checks them against
        rest = [math.floor(t * wall / total * 1e6) / 1e6 for t in rest]
    for name, v in zip(TIME_FIELDS[1:], rest, strict=True):
        d[name] = v
    return d


def _sender_pid(anc: list[tuple[int, int, bytes]]) -> int | None:
    for level, kind, data in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS and len(data) >= 12:
            pid = _CRED.unpack_from(data)[0]
            return pid if pid > 0 else None
    return None


_EPOCH_CACHE: dict[str, int] = {}


def _epoch(iso: str) -> int:
    """``2026-11-30T09:00:00Z`` → Unix seconds (the summariser's own format)."""
    t = _EPOCH_CACHE.get(iso)
    if t is None:
        import calendar
        import time

        t = calendar.timegm(time.strptime(iso, "%Y-%m-%dT%H:%M:%SZ"))
        if len(_EPOCH_CACHE) > 4096:
            _EPOCH_CACHE.clear()
        _EPOCH_CACHE[iso] = t
    return t


def discovery_resolve(discovery: Any) -> Resolve:
    """pid → workload as ``discovery`` (``workloads.Discovery``) tells a GPU process's: its
    resolver's answer in its canonical form (array ids, the allocation's names), and a process
    of a job whose allocation names another user counted as its user's, as
    ``Discovery.holders`` does."""

    def resolve(pid: int) -> Workload | None:
        w: Workload | None = discovery.resolver.resolve(pid)
        if w is None:
            return None
        c: Workload = discovery.canonical(w)
        if c.kind == "slurm" and w.user and c.user != w.user:
            return Workload("user", w.user, user=w.user)
        return c

    return resolve
