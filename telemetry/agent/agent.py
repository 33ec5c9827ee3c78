"""The agent: tick every second, summarise per interval, spool, deliver.

Each tick asks the source (source.py: NVML with GPM, or a dcgm-exporter) for one reading per
GPU and hands them to the one summariser; the source is the only part that differs.

The sampling loop runs in the calling thread; delivery runs in a second thread on its own
spool connection, so a slow or absent server never delays a tick. Tests drive
:meth:`Agent.tick` and :meth:`Delivery.step` directly on a simulated clock.
"""

from __future__ import annotations

import logging
import math
import os
import random
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from . import __version__
from .client import Delivery, Response, deliver_until, ingest_url, post_json
from .clock import Clock, RealClock
from .hook_socket import HookListener, discovery_resolve
from .nvml import Collector, NvmlApi
from .source import Source
from .spool import Spool
from .summarise import Summariser
from .workloads import Discovery, ProcResolver

log = logging.getLogger("gpufleet.agent")

SPOOL_FILE = "spool.sqlite3"

# A stop (SIGTERM) ends the agent within 10 s (docs/agent.md; the systemd unit kills at 45 s).
# The loop notices the signal within a second (its sleep to the next tick); the last push gets
# this much real time after that, and a second is left to exit.
STOP_BUDGET_S = 8.0

# A full spool drops its oldest samples at every interval while the server stays away: say so
# at once, then at most once per this many seconds (each line counts the drops since the last).
SPOOL_FULL_LOG_EVERY_S = 600.0


class Agent:
    def __init__(
        self,
        source: Source | NvmlApi,
        *,
        spool_dir: str | None,
        server: str | None = None,
        token: str | None = None,
        interval_s: int = 60,
        hostname: str | None = None,
        clock: Clock | None = None,
        post: Callable[[str, str, bytes, float], Response] = post_json,
        rng: random.Random | None = None,
        max_batch: int = 1000,
        spool_max_samples: int = 200_000,
        max_backoff_s: float = 300.0,
        workloads: Discovery | None = None,
        hook_socket: str | None = None,
    ) -> None:
        """``workloads``: who holds each GPU (docs/agent.md), for an NVML backend; a source of
        its own (dcgm) says it on its readings or not at all. ``hook_socket``: where jobs'
        gpufleet_hook reports arrive (hook_socket.py; None: not listened for)."""
        self.clock: Clock = clock or RealClock()
        self.workloads = workloads
        # an NVML backend (pynvml, or fake.FakeNvml) is read through the NVML collector
        self.source: Source = (
            source
            if isinstance(source, Source)
            else Collector(source, clock=self.clock.time, workloads=workloads)
        )
        self.summariser = Summariser(interval_s)
        self.interval_s = interval_s
        self.hostname = hostname or socket.gethostname()
        self.spool: Spool | None = None
        self.delivery: Delivery | None = None
        if spool_dir is not None:
            path = os.path.join(spool_dir, SPOOL_FILE)
            self.spool = Spool(path, max_samples=spool_max_samples)
            if server:
                self.delivery = Delivery(
                    Spool(path, max_samples=spool_max_samples),
                    url=ingest_url(server),
                    token=token or "",
                    node=self.node_info,
                    gpus=self._inventory,
                    post=post,
                    rng=rng,
                    max_batch=max_batch,
                    max_backoff_s=max_backoff_s,
                )
        self._wake = threading.Event()
        self._sender: threading.Thread | None = None
        self._stop_until = 0.0  # time.monotonic() by which the sender must be done
        self.ticks = 0
        self._saved_inventory: list[dict[str, Any]] = []
        # full-spool drops: counted so far (from the spool file, across restarts), not logged yet
        self._dropped_seen = self.spool.counter("dropped_total") if self.spool else 0
        self._dropped_unlogged = 0
        self._dropped_log_next = -math.inf
        # Job efficiency reports (hook_socket.py): senders resolved as GPU processes are, by the
        # same discovery where the agent has one (its cache already knows the job's process).
        self.hook: HookListener | None = None
        if hook_socket:
            own = workloads is None  # no discovery (dcgm, a fake fleet): one of its own
            discovery = Discovery(ProcResolver()) if workloads is None else workloads
            self.hook = HookListener(
                hook_socket,
                resolve=discovery_resolve(discovery),
                interval_s=interval_s,
                tick=discovery.resolver.tick if own else None,
            )
            if not self.hook.open():
                self.hook = None

    @property
    def collector(self) -> Source:
        """The source, by the name it had while NVML was the only one."""
        return self.source

    def _inventory(self) -> list[dict[str, Any]] | None:
        """The GPU block for a push; ``None`` until the source has listed the GPUs (Delivery
        waits)."""
        return self.source.inventory() if self.source.discovered else None

    def node_info(self) -> dict[str, Any]:
        d: dict[str, Any] = {"hostname": self.hostname, "agent_version": __version__}
        if self.source.driver_version:
            d["driver_version"] = self.source.driver_version
        if self.workloads is not None:
            d.update(self.workloads.health())
        return d

    # -- sampling ---------------------------------------------------------------------------

    def tick(self, t: int) -> list[dict[str, Any]]:
        """The tick at whole second ``t``: read every GPU (the second ``[t-1, t)``), and return
        the samples of intervals that closed, after storing them in the spool."""
        self.ticks += 1
        res = self.source.read(float(t))
        if self.hook is not None:
            # after the read: the discovery has begun this tick (its pid cache is fresh)
            self.hook.drain(t - 1)
        if self.spool is not None:
            # Before any sample of a GPU is spooled, so that a push after a restart can still
            # describe a GPU that is gone by then (Delivery.block).
            inventory = self.source.inventory()
            if inventory != self._saved_inventory:
                self.spool.gpus_save(inventory)
                self._saved_inventory = inventory
        s = self.summariser
        closed: list[dict[str, Any]] = []
        for uuid in res.lost:
            closed.extend(s.flush(uuid))
        for uuid, r in res.readings.items():
            closed.extend(s.add(uuid, t - 1, r))
        closed.extend(s.close_due(t))
        if self.hook is not None:
            self.hook.attach(closed, now=t)
        if closed and self.spool is not None:
            self._store(closed)
            self._wake.set()
        return closed

    def flush(self) -> list[dict[str, Any]]:
        """Close every open interval now (on shutdown), storing the partial samples."""
        closed = self.summariser.flush()
        if self.hook is not None:
            self.hook.attach(closed)
        if self.spool is not None:
            self._store(closed, last=True)
        return closed

    def _store(self, closed: list[dict[str, Any]], *, last: bool = False) -> None:
        """Spool ``closed``; when the full spool dropped samples for it, log that (rate-limited;
        ``last``: the stop, which logs what is left to count)."""
        assert self.spool is not None
        self.spool.add(closed)
        total = self.spool.counter("dropped_total")
        self._dropped_unlogged += total - self._dropped_seen
        self._dropped_seen = total
        now = self.clock.time()
        if self._dropped_unlogged and (last or now >= self._dropped_log_next):
            log.warning(
                "spool full (%d samples, --spool-max-samples): dropped the %d oldest since the "
                "last such line, %d in all; the server is told (spool_dropped_samples)",
                self.spool.max_samples,
                self._dropped_unlogged,
                total,
            )
            self._dropped_unlogged = 0
            self._dropped_log_next = now + SPOOL_FULL_LOG_EVERY_S

    def run(self, stop: threading.Event, *, max_ticks: int | None = None) -> None:
        """Tick on every whole second of ``self.clock`` until ``stop`` is set."""
        clock = self.clock
        sender = None
        if self.delivery is not None:
            # daemon: a POST still in flight when the stop budget runs out must not hold the
            # process (its samples are in the spool and go again after the restart)
            sender = self._sender = threading.Thread(
                target=self._send_loop, args=(stop,), daemon=True
            )
            sender.start()
        t = math.floor(clock.time()) + 1
        n = 0
        try:
            while not stop.is_set():
                now = clock.time()
                if now < t:
                    clock.sleep(t - now)
                    continue
                if now - t > 5:
                    # suspended or starved: those seconds were not observed; do not invent them
                    log.warning("skipped %d seconds of sampling (agent was not running)", now - t)
                    t = math.floor(now)
                self.tick(t)
                t += 1
                n += 1
                if max_ticks is not None and n >= max_ticks:
                    break
        finally:
            self._stop_until = time.monotonic() + STOP_BUDGET_S
            self.flush()
            self.source.shutdown()
            stop.set()
            self._wake.set()
            if sender is not None:
                sender.join(timeout=max(0.0, self._stop_until - time.monotonic()))
                if sender.is_alive():
                    pending = self.spool.pending() if self.spool is not None else 0
                    log.warning(
                        "stopping with a push in flight; its samples stay in the spool "
                        "(%d samples wait there for the next start)",
                        pending,
                    )

    def _send_loop(self, stop: threading.Event) -> None:
        assert self.delivery is not None
        deliver_until(
            self.delivery,
            self.clock,
            stop=stop,
            wake=self._wake,
            again=("sent", "split", "quarantined"),
            stop_until=lambda: self._stop_until,
            what="delivery",
        )

    def close(self) -> None:
        if self.hook is not None:
            self.hook.close()
        if self.spool is not None:
            self.spool.close()
        # a sender abandoned mid-POST may still touch its connection: leave that to the exit
        if self.delivery is not None and not (self._sender and self._sender.is_alive()):
            self.delivery.spool.close()
