"""Telemetry endpoints, mounted under ``api/v1/`` by ``config.urls``."""

from django.urls import URLPattern, URLResolver, path

from telemetry.api.views import IngestView

# POST /api/v1/queue (telemetry.api.views.QueuePushView) shares its URL with the GET of the
# queue figures, which carry money: both are billing.api.queue.QueueView (billing/api/urls.py).
urlpatterns: list[URLPattern | URLResolver] = [
    path("ingest", IngestView.as_view(), name="ingest"),
]
