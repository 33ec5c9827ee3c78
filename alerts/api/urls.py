"""Alert endpoints under /api/v1/."""

from django.urls import URLPattern, URLResolver, path

from alerts.api import views

urlpatterns: list[URLPattern | URLResolver] = [
    path("alerts", views.AlertListView.as_view(), name="api-alerts"),
]
