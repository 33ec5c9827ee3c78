"""Prometheus text exposition of the service's own figures (read from the database)."""

from __future__ import annotations


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
