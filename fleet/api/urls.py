"""Inventory endpoints under /api/v1/ (no trailing slash, like /api/v1/costs)."""

from django.urls import URLPattern, URLResolver
from rest_framework.routers import SimpleRouter

# schema: importing it registers the token schemes with drf-spectacular.
from fleet.api import schema, views  # noqa: F401

router = SimpleRouter(trailing_slash=False)
router.register("sites", views.SiteViewSet, basename="site")
router.register("teams", views.TeamViewSet, basename="team")
router.register("pools", views.PoolViewSet, basename="pool")
router.register("nodes", views.NodeViewSet, basename="node")
router.register("gpus", views.GpuViewSet, basename="gpu")

urlpatterns: list[URLPattern | URLResolver] = [*router.urls]
