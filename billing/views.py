"""Dashboard views: thin, every figure from billing.selectors."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required, permission_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render


@login_required
@permission_required("fleet.view_dashboard", raise_exception=True)
def overview(request: HttpRequest) -> HttpResponse:
    """Permission: any role (viewer, finance, admin)."""
    return render(request, "billing/overview.html", {})
