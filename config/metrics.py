"""The service's own Prometheus metrics.

Counters live in the shared cache (Redis in production) so every web process adds to the same
numbers; a cache that is down loses increments, never a request (DESIGN.md §5: Redis down →
ingest still works).
"""

from __future__ import annotations

import logging

from django.core.cache import cache

logger = logging.getLogger(__name__)

COUNTER_PREFIX = "metrics:"


def counter_incr(name: str, value: int = 1) -> None:
    """Add ``value`` to counter ``name`` (e.g. ``ingest_samples_accepted``); never raises."""
    key = COUNTER_PREFIX + name
    try:
        try:
            cache.incr(key, value)
        except ValueError:  # not there yet
            if not cache.add(key, value, timeout=None):
                cache.incr(key, value)
    except Exception:  # noqa: BLE001 - metrics must never break the request
        logger.debug("metrics counter %s not counted: cache unavailable", name)


def counter_get(name: str) -> int:
    try:
        return int(cache.get(COUNTER_PREFIX + name) or 0)
    except Exception:  # noqa: BLE001
        return 0


def metrics_render() -> str:
    from fleet.models import Gpu, Node

    lines = [
        "# HELP gpufleet_nodes Nodes known to the fleet.",
        "# TYPE gpufleet_nodes gauge",
        f"gpufleet_nodes {Node.objects.count()}",
        "# HELP gpufleet_gpus GPUs known to the fleet.",
        "# TYPE gpufleet_gpus gauge",
        f"gpufleet_gpus {Gpu.objects.count()}",
    ]
    return "\n".join(lines) + "\n"
