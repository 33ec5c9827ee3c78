"""The service's own Prometheus metrics (``GET /metrics``, text exposition format 0.0.4).

Counters live in the shared cache (Redis in production) so every web process adds to the same
numbers; a cache that is down loses increments, never a request (docs/reliability.md: Redis down →
ingest still works). The other figures are read from the database at scrape time: they are
cheap (one aggregate each) and always right, even after a cache restart.

``prometheus_client`` renders the text: :class:`FleetCollector` reads the counters and the
database figures on each scrape and yields them as metric families, so names, escaping and
number formatting are the library's. Names follow Prometheus's conventions (base units,
``_total`` counters, ``_info`` for versions) and pass ``promtool check metrics``; the names
this replaced are in ``RENAMED`` and in docs/deploy.md. Every web process serves the same
fleet-wide figures, so dashboards aggregate several targets with ``max``, never ``sum``.

What an operator alerts on (docs/deploy.md):
- ``gpufleet_rollup_lag_seconds`` growing: no worker or no beat is running;
- ``gpufleet_rollups_set_aside`` > 0: an hour's rollup failed ``ROLLUP_MAX_FAILURES`` times
  and waits for an operator (the log has the error; the admin puts it back in the queue);
- ``rate(gpufleet_ingest_samples_rejected_total[5m])`` > 0: an agent sends bad data;
- ``time() - gpufleet_node_last_seen_timestamp_seconds`` > a few intervals: an agent is away;
- ``increase(gpufleet_agent_spool_dropped_samples_total[1h])`` > 0: data was lost on a node;
- ``gpufleet_node_allocation_problem`` == 1: a node's Slurm allocations are hidden from its
  agent (its GPUs' idle hours go unattributed);
- ``gpufleet_replica_reads`` == 0 for minutes: the read replica is down or behind, and the
  primary carries every read again.
"""

from __future__ import annotations

import logging
import platform
import weakref
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from importlib import metadata
from typing import Any

import django
from django.core.cache import cache, caches
from django.core.cache.backends.redis import RedisCache
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import CollectorRegistry

logger = logging.getLogger(__name__)

COUNTER_PREFIX = "metrics:"
# Text format 0.0.4: what every Prometheus and promtool reads (the library's newest default,
# 1.0.0, is for Prometheus 3's UTF-8 names, which these names do not need).
CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4

# Names that /metrics exposed before it followed Prometheus's conventions → their names now
# (docs/deploy.md lists them for dashboards and alerts built on the old ones).
RENAMED = {
    # A count of hourly rollups, not a duration: promtool wants durations in seconds.
    "gpufleet_rollup_pending_hours": "gpufleet_rollups_pending",
}


@dataclass(frozen=True)
class Counter:
    """A counter kept in the cache by ``counter_incr`` and exposed under ``metric``."""

    name: str
    metric: str
    help: str


# The counter names the ingest path increments (telemetry), and what /metrics calls them.
COUNTERS = (
    Counter("ingest_requests", "gpufleet_ingest_requests_total", "Ingest requests received."),
    Counter(
        "ingest_samples_accepted",
        "gpufleet_ingest_samples_accepted_total",
        "Samples stored by ingest.",
    ),
    Counter(
        "ingest_samples_duplicate",
        "gpufleet_ingest_samples_duplicate_total",
        "Samples ingest received again for a (gpu, start) already stored; nothing changed.",
    ),
    Counter(
        "ingest_samples_rejected",
        "gpufleet_ingest_samples_rejected_total",
        "Samples ingest rejected as invalid (the reply names index and field).",
    ),
)


# One redis.Redis object per cache backend: Django builds a new one per cache call (~0.1 ms of
# Python); the object only wraps the backend's thread-safe connection pool. Keyed weakly by the
# backend, so ``override_settings(CACHES=…)`` (a new backend object) gets its own.
_redis_clients: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def redis_client(backend: Any) -> Any | None:
    """The cached raw client of a Django ``RedisCache`` backend (writes), or None for others."""
    if not isinstance(backend, RedisCache):
        return None
    client = _redis_clients.get(backend)
    if client is None:
        client = _redis_clients[backend] = backend._cache.get_client(None, write=True)
    return client


def counters_incr(values: Mapping[str, int]) -> None:
    """Add to several counters at once (one pipelined round trip on Redis); never raises.

    Zero values are skipped. Redis INCRBY creates a missing key, and Django's Redis cache keeps
    integers unpickled, so ``counter_get`` reads the same number.
    """
    todo = {name: value for name, value in values.items() if value}
    if not todo:
        return
    try:
        backend = caches["default"]
        client = redis_client(backend)
        if client is None:
            for name, value in todo.items():
                _counter_incr_generic(name, value)
            return
        pipe = client.pipeline(transaction=False)
        for name, value in todo.items():
            pipe.incrby(backend.make_and_validate_key(COUNTER_PREFIX + name), value)
        pipe.execute()
    except Exception:  # noqa: BLE001 - metrics must never break the request
        logger.debug("metrics counters %s not counted: cache unavailable", list(todo))


def _counter_incr_generic(name: str, value: int) -> None:
    key = COUNTER_PREFIX + name
    try:
        cache.incr(key, value)
    except ValueError:  # not there yet
        # add() is atomic: of two processes racing to create the key, one adds and the
        # other increments what the first added, so no increment is lost.
        if not cache.add(key, value, timeout=None):
            cache.incr(key, value)


def counter_incr(name: str, value: int = 1) -> None:
    """Add ``value`` to counter ``name`` (e.g. ``ingest_samples_accepted``); never raises."""
    counters_incr({name: value})


def counter_get(name: str) -> int:
    """The counter's value; 0 when it was never incremented or the cache is down."""
    try:
        return int(cache.get(COUNTER_PREFIX + name) or 0)
    except Exception:  # noqa: BLE001
        return 0


def _counters_read() -> dict[str, int] | None:
    """Every counter in one round trip, or None when the cache cannot be read.

    None is not the same as zeros: exposing 0 for an unreadable cache would look like a
    counter reset to Prometheus and fake a burst of increments when the cache is back.
    """
    try:
        values = cache.get_many([COUNTER_PREFIX + c.name for c in COUNTERS])
    except Exception:  # noqa: BLE001
        logger.warning("metrics counters unavailable: cache unreachable")
        return None
    return {c.name: int(values.get(COUNTER_PREFIX + c.name) or 0) for c in COUNTERS}


def _build_version() -> str:
    try:
        return metadata.version("gpufleet")
    except metadata.PackageNotFoundError:  # running from a checkout that was never installed
        return "unknown"


class FleetCollector:
    """The metric families of one scrape: the shared-cache counters and the database figures.

    Read at scrape time, never cached: a scrape is one small aggregate per figure.
    """

    def describe(self) -> list[Metric]:
        # Nothing to describe up front: the registry must not run collect() (the database)
        # when the collector is registered at import.
        return []

    def collect(self) -> Iterator[Metric]:
        yield from self._build()
        yield from self._counters()
        yield from self._rollups()
        yield from self._nodes()
        yield from self._replica()

    def _build(self) -> Iterator[Metric]:
        yield InfoMetricFamily(
            "gpufleet_build",
            "The running server's version and platform.",
            value={
                "version": _build_version(),
                "django_version": django.get_version(),
                "python_version": platform.python_version(),
            },
        )

    def _counters(self) -> Iterator[Metric]:
        counters = _counters_read()
        yield GaugeMetricFamily(
            "gpufleet_metrics_counters_up",
            "1 when the shared cache holding the ingest counters could be read.",
            value=0 if counters is None else 1,
        )
        if counters is None:
            return  # absent, not 0 (see _counters_read)
        for counter in COUNTERS:
            yield CounterMetricFamily(counter.metric, counter.help, value=counters[counter.name])

    def _rollups(self) -> Iterator[Metric]:
        from telemetry.selectors import (
            rollup_lag_seconds,
            rollup_marks_queued,
            rollup_marks_set_aside,
        )

        # Rollup lag: how long the oldest hour marked out of date has waited. It grows without
        # bound when no worker (or no beat) runs, which is the failure this metric exists for.
        # Hours set aside are not waiting for a worker: they have a figure of their own.
        yield GaugeMetricFamily(
            "gpufleet_rollup_lag_seconds",
            "Age of the oldest hour waiting for its rollup (0 when every rollup is current).",
            value=round(rollup_lag_seconds(), 3),
        )
        yield GaugeMetricFamily(
            "gpufleet_rollups_pending",
            "Hourly rollups marked out of date and waiting to be recomputed.",
            value=rollup_marks_queued().count(),
        )
        yield GaugeMetricFamily(
            "gpufleet_rollups_set_aside",
            "Hourly rollups set aside after ROLLUP_MAX_FAILURES failed recomputes: the rollup "
            "passes them by until an operator puts them back in the queue (admin).",
            value=rollup_marks_set_aside().count(),
        )

    def _nodes(self) -> Iterator[Metric]:
        from fleet.models import Gpu, Node

        yield GaugeMetricFamily("gpufleet_nodes", "Nodes known to the fleet.", Node.objects.count())
        yield GaugeMetricFamily("gpufleet_gpus", "GPUs known to the fleet.", Gpu.objects.count())
        nodes = list(
            Node.objects.order_by("hostname").values_list(
                "hostname",
                "last_seen_at",
                "spool_dropped_total",
                "agent_version",
                "driver_version",
                "alloc_problem",
                "alloc_skipped_files",
            )
        )
        yield CounterMetricFamily(
            "gpufleet_agent_spool_dropped_samples_total",
            "Samples agents dropped because their disk spool was full, as the agents reported.",
            value=sum(int(node[2]) for node in nodes),
        )
        dropped_family = CounterMetricFamily(
            "gpufleet_node_spool_dropped_samples_total",
            "Samples one node's agent dropped because its disk spool was full.",
            labels=["node"],
        )
        last_seen_family = GaugeMetricFamily(
            "gpufleet_node_last_seen_timestamp_seconds",
            "When the node's agent last delivered data (Unix time); nodes never seen are absent.",
            labels=["node"],
        )
        info_family = InfoMetricFamily(
            "gpufleet_node",
            "The agent and driver versions a node last reported (empty until it reports them).",
            labels=["node"],
        )
        problem_family = GaugeMetricFamily(
            "gpufleet_node_allocation_problem",
            "1 while the node's agent says its allocation directory hides the scheduler's "
            "allocations (idle GPUs of jobs go unattributed; the text is on the node's admin "
            "page), else 0.",
            labels=["node"],
        )
        skipped_family = GaugeMetricFamily(
            "gpufleet_node_allocation_files_skipped",
            "Allocation files the node's agent skipped at its last look (not trusted or not "
            "an allocation; its log says why).",
            labels=["node"],
        )
        for node in nodes:
            hostname, last_seen_at, dropped, agent_version, driver_version, problem, skipped = node
            dropped_family.add_metric([hostname], int(dropped))
            problem_family.add_metric([hostname], 1 if problem else 0)
            skipped_family.add_metric([hostname], int(skipped))
            if last_seen_at is not None:
                last_seen_family.add_metric([hostname], round(last_seen_at.timestamp(), 3))
            info_family.add_metric(
                [hostname], {"agent_version": agent_version, "driver_version": driver_version}
            )
        yield dropped_family
        yield last_seen_family
        yield info_family
        yield problem_family
        yield skipped_family

    def _replica(self) -> Iterator[Metric]:
        from config.replica import replica_check, replica_configured

        if not replica_configured():
            return
        state = replica_check()
        yield GaugeMetricFamily(
            "gpufleet_replica_reads",
            "1 while reads go to the read replica, 0 while they fall back to the primary "
            "(the replica is down, lagging or not a standby).",
            value=1 if state.usable else 0,
        )
        if state.lag_s is not None:
            yield GaugeMetricFamily(
                "gpufleet_replica_lag_seconds",
                "How far the read replica is behind the primary (absent while unknown).",
                value=round(state.lag_s, 3),
            )


# Only this collector: the library's default process and platform collectors describe one
# web process, and a scrape reaches whichever process the load balancer picks.
REGISTRY = CollectorRegistry(auto_describe=False)
REGISTRY.register(FleetCollector())


def metrics_render() -> str:
    """The exposition text (``CONTENT_TYPE``): counters, rollups, nodes, versions."""
    return generate_latest(REGISTRY).decode()
