"""Telemetry endpoints, mounted under ``api/v1/`` by ``config.urls``."""

from django.urls import URLPattern, URLResolver, path

from telemetry.api.views import IngestView, QueuePushView

urlpatterns: list[URLPattern | URLResolver] = [
    path("ingest", IngestView.as_view(), name="ingest"),
    path("queue", QueuePushView.as_view(), name="queue"),
]
