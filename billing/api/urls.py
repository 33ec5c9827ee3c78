"""Finance endpoints under /api/v1/."""

from django.urls import URLPattern, URLResolver, path
from rest_framework.routers import SimpleRouter

from billing.api import views
from billing.api.efficiency import EfficiencyView
from billing.api.queue import QueueView
from billing.api.workloads import WorkloadsView

router = SimpleRouter(trailing_slash=False)
router.register("cost-profiles", views.CostProfileViewSet, basename="cost-profile")

urlpatterns: list[URLPattern | URLResolver] = [
    path("costs", views.CostsView.as_view(), name="api-costs"),
    path("focus", views.FocusView.as_view(), name="api-focus"),
    path("breakeven", views.BreakevenView.as_view(), name="api-breakeven"),
    path("workloads", WorkloadsView.as_view(), name="api-workloads"),
    # GET the queue figures (any role), POST a node's snapshot (node token).
    path("queue", QueueView.as_view(), name="queue"),
    path("efficiency", EfficiencyView.as_view(), name="api-efficiency"),
    *router.urls,
]
