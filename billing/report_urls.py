"""Weekly report pages, mounted at ``reports/`` by config/urls.py."""

from django.urls import path

from billing import report_views

urlpatterns = [
    path("weekly/preview/", report_views.weekly_preview, name="weekly-report-preview"),
    path(
        "weekly/subscription/",
        report_views.weekly_subscription,
        name="weekly-report-subscription",
    ),
]
