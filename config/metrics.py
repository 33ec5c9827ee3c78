"""The service's own Prometheus metrics (``GET /metrics``, text exposition format 0.0.4).

Counters live in the shared cache (Redis in production) so every web process adds to the same
numbers; a cache that is down loses increments, never a request (DESIGN.md §5: Redis down →
ingest still works). The other figures are read from the database at scrape time: they are
cheap (one aggregate each) and always right, even after a cache restart.

What an operator alerts on (docs/deploy.md):
- ``gpufleet_rollup_lag_seconds`` growing: no worker or no beat is running;
- ``rate(gpufleet_ingest_samples_rejected_total[5m])`` > 0: an agent sends bad data;
- ``time() - gpufleet_node_last_seen_timestamp_seconds`` > a few intervals: an agent is away;
- ``increase(gpufleet_agent_spool_dropped_samples_total[1h])`` > 0: data was lost on a node.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from django.core.cache import cache, caches
from django.core.cache.backends.redis import RedisCache
from django.db.models import Min, Sum
from django.utils import timezone

logger = logging.getLogger(__name__)

COUNTER_PREFIX = "metrics:"


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


def _label(value: str) -> str:
    """A label value escaped as the exposition format asks (backslash, quote, newline)."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class _Exposition:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def family(self, metric: str, kind: str, help_text: str) -> None:
        self.lines += [f"# HELP {metric} {help_text}", f"# TYPE {metric} {kind}"]

    def sample(self, metric: str, value: float, labels: dict[str, str] | None = None) -> None:
        text = repr(float(value)) if isinstance(value, float) else str(value)
        if labels:
            inner = ",".join(f'{k}="{_label(v)}"' for k, v in labels.items())
            self.lines.append(f"{metric}{{{inner}}} {text}")
        else:
            self.lines.append(f"{metric} {text}")

    def one(self, metric: str, kind: str, help_text: str, value: float) -> None:
        self.family(metric, kind, help_text)
        self.sample(metric, value)

    def render(self) -> str:
        return "\n".join(self.lines) + "\n"


def metrics_render() -> str:
    """The exposition text: ingest counters, rollup lag, agents' spool drops, nodes last seen."""
    from fleet.models import Gpu, Node
    from telemetry.models import RollupPending

    out = _Exposition()
    counters = _counters_read()
    out.one(
        "gpufleet_metrics_counters_up",
        "gauge",
        "1 when the shared cache holding the ingest counters could be read.",
        0 if counters is None else 1,
    )
    if counters is not None:
        for counter in COUNTERS:
            out.one(counter.metric, "counter", counter.help, counters[counter.name])

    # Rollup lag: how long the oldest hour marked out of date has waited. It grows without
    # bound when no worker (or no beat) runs, which is the failure this metric exists for.
    now = timezone.now()
    pending = RollupPending.objects.aggregate(oldest=Min("marked_at"))
    oldest = pending["oldest"]
    lag_s = max(0.0, (now - oldest).total_seconds()) if oldest else 0.0
    out.one(
        "gpufleet_rollup_lag_seconds",
        "gauge",
        "Age of the oldest hour waiting for its rollup (0 when every rollup is current).",
        round(lag_s, 3),
    )
    out.one(
        "gpufleet_rollup_pending_hours",
        "gauge",
        "Hours marked out of date and waiting for a rollup.",
        RollupPending.objects.count(),
    )

    out.one("gpufleet_nodes", "gauge", "Nodes known to the fleet.", Node.objects.count())
    out.one("gpufleet_gpus", "gauge", "GPUs known to the fleet.", Gpu.objects.count())

    nodes = list(
        Node.objects.order_by("hostname").values_list(
            "hostname", "last_seen_at", "spool_dropped_total"
        )
    )
    total_dropped = Node.objects.aggregate(total=Sum("spool_dropped_total"))["total"] or 0
    out.one(
        "gpufleet_agent_spool_dropped_samples_total",
        "counter",
        "Samples agents dropped because their disk spool was full, as the agents reported.",
        int(total_dropped),
    )
    out.family(
        "gpufleet_node_spool_dropped_samples_total",
        "counter",
        "Samples one node's agent dropped because its disk spool was full.",
    )
    for hostname, _, dropped in nodes:
        out.sample("gpufleet_node_spool_dropped_samples_total", int(dropped), {"node": hostname})
    out.family(
        "gpufleet_node_last_seen_timestamp_seconds",
        "gauge",
        "When the node's agent last delivered data (Unix time); nodes never seen are absent.",
    )
    for hostname, last_seen_at, _ in nodes:
        if last_seen_at is not None:
            out.sample(
                "gpufleet_node_last_seen_timestamp_seconds",
                round(last_seen_at.timestamp(), 3),
                {"node": hostname},
            )
    return out.render()
