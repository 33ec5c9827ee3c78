"""Reads of the fleet inventory."""

from __future__ import annotations

from django.db.models import QuerySet

from fleet.models import Gpu, Site, Team


def gpus_with_attribution() -> QuerySet[Gpu]:
    """GPUs with everything needed to attribute them (node, pool, team, site, model)."""
    return Gpu.objects.select_related(
        "node", "node__pool", "node__pool__team", "node__pool__site", "node__site", "team", "model"
    )


def gpu_site(gpu: Gpu) -> Site | None:
    return gpu.node.effective_site


def team_cost_centers() -> dict[str, str]:
    """Team name → cost centre (empty where none is set), for chargeback tables and CSVs."""
    return dict(Team.objects.values_list("name", "cost_center"))
