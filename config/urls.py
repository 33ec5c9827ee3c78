"""Top-level URLs: each app owns its own module; this file only mounts them."""

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView

from config import health
from config.auth import LockoutAuthenticationForm
from fleet.permissions import CanViewDashboard

urlpatterns = [
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    path("metrics", health.metrics, name="metrics"),
    path(
        "accounts/login/",
        auth_views.LoginView.as_view(authentication_form=LockoutAuthenticationForm),
        name="login",
    ),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    path(
        "api/v1/schema",
        SpectacularAPIView.as_view(permission_classes=[CanViewDashboard]),
        name="schema",
    ),
    path(
        "api/v1/docs",
        SpectacularSwaggerSplitView.as_view(
            url_name="schema", permission_classes=[CanViewDashboard]
        ),
        name="api-docs",
    ),
    path("api/v1/", include("telemetry.api.urls")),
    path("api/v1/", include("fleet.api.urls")),
    path("api/v1/", include("billing.api.urls")),
    path("api/v1/", include("alerts.api.urls")),
    path("reports/", include("billing.report_urls")),
    path("alerts/", include("alerts.urls")),
    path("", include("billing.urls")),
]

# JSON 404s under /api/ (the schema promises JSON bodies for every error); templates/404.html
# elsewhere.
handler404 = "config.api.not_found"
# The dashboard's 403: in the site's frame, saying why, logged without a traceback.
handler403 = "billing.views.permission_denied"
