"""Top-level URLs: each app owns its own module; this file only mounts them."""

from django.contrib import admin
from django.http import HttpRequest, HttpResponseRedirect
from django.templatetags.static import static
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView

from config import health, oidc
from config.auth import LoginPageView, login_link
from fleet.permissions import CanViewDashboard


def favicon(request: HttpRequest) -> HttpResponseRedirect:
    """``/favicon.ico``, which a browser asks for on a page that names no icon (the weekly
    email's preview): the site's icon. A temporary redirect, since the static file's name
    changes with its content."""
    return HttpResponseRedirect(static("favicon.svg"))


urlpatterns = [
    path("favicon.ico", favicon, name="favicon"),
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    path("metrics", health.metrics, name="metrics"),
    path("accounts/login/", LoginPageView.as_view(), name="login"),
    path("accounts/logout/", oidc.LogoutView.as_view(), name="logout"),
    path("accounts/login-link/<str:token>/", login_link, name="login-link"),
    # Single sign-on (config/oidc.py): 404 while OIDC_ISSUER is unset.
    path("oidc/authenticate/", oidc.SsoLoginView.as_view(), name="oidc_authentication_init"),
    path("oidc/callback/", oidc.SsoCallbackView.as_view(), name="oidc_authentication_callback"),
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
