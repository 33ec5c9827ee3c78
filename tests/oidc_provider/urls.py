"""The provider's pages: its login form, django-oauth-toolkit under /o/, and /testing/ hooks
the tests use to change the provider while it runs (a person's groups, the client's redirect
URIs, and ID tokens spoiled on purpose to prove the product refuses them)."""

import json
import time
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from django.conf import settings
from django.contrib.auth import views as auth_views
from django.contrib.auth.models import Group, User
from django.http import HttpRequest, HttpResponse
from django.urls import include, path
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST
from oauth2_provider.models import Application
from oauth2_provider.views import TokenView

from tests.oidc_provider.people import CLIENT_ID

# How the next ID tokens are spoiled ("" for not at all); set through /testing/tamper.
TAMPER = {"mode": ""}
TAMPER_MODES = ("audience", "expired", "issuer", "signature")


def spoil(id_token: str, mode: str) -> str:
    """The token re-signed with one thing wrong: another audience, expired an hour ago,
    another issuer, or signed with a key the provider never published (same key id)."""
    header = jwt.get_unverified_header(id_token)
    claims = jwt.decode(id_token, options={"verify_signature": False})
    key: Any = settings.OAUTH2_PROVIDER["OIDC_RSA_PRIVATE_KEY"]
    now = int(time.time())
    if mode == "audience":
        claims["aud"] = "another-client"
    elif mode == "expired":
        claims["iat"], claims["exp"] = now - 7200, now - 3600
    elif mode == "issuer":
        claims["iss"] = "http://127.0.0.1:9/o"
    elif mode == "signature":
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048).private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    return jwt.encode(claims, key, algorithm="RS256", headers={"kid": header["kid"]})


class SpoilingTokenView(TokenView):
    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        response = super().post(request, *args, **kwargs)
        mode = TAMPER["mode"]
        if mode and response.status_code == 200:
            body = json.loads(response.content)
            body["id_token"] = spoil(body["id_token"], mode)
            response.content = json.dumps(body).encode()
        return response


@csrf_exempt
@require_POST
def testing_tamper(request: HttpRequest) -> HttpResponse:
    mode = request.POST.get("mode", "")
    if mode and mode not in TAMPER_MODES:
        return HttpResponse(f"mode: one of {TAMPER_MODES}", status=400)
    TAMPER["mode"] = mode
    return HttpResponse("ok")


@csrf_exempt
@require_POST
def testing_groups(request: HttpRequest, username: str) -> HttpResponse:
    names = [n for n in request.POST.get("groups", "").split(",") if n]
    user = User.objects.get(username=username)
    user.groups.set([Group.objects.get_or_create(name=name)[0] for name in names])
    return HttpResponse("ok")


@csrf_exempt
@require_POST
def testing_client(request: HttpRequest) -> HttpResponse:
    app = Application.objects.get(client_id=CLIENT_ID)
    app.redirect_uris = request.POST["redirect_uris"]
    app.post_logout_redirect_uris = request.POST["post_logout_redirect_uris"]
    app.save(update_fields=["redirect_uris", "post_logout_redirect_uris"])
    return HttpResponse("ok")


urlpatterns = [
    path("accounts/login/", auth_views.LoginView.as_view(), name="login"),
    path("o/token/", SpoilingTokenView.as_view()),
    path("o/", include("oauth2_provider.urls", namespace="oauth2_provider")),
    path("testing/tamper", testing_tamper),
    path("testing/groups/<str:username>", testing_groups),
    path("testing/client", testing_client),
]
