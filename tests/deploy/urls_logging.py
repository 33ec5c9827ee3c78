"""A URLconf for tests/deploy/test_security.py: a view that acts like ingest for logging."""

from __future__ import annotations

import logging

from django.http import HttpRequest, HttpResponse
from django.urls import path

from config.logging import node_var


def node_view(request: HttpRequest) -> HttpResponse:
    node_var.set("gpu-07")  # what the ingest view does once the token names the node
    logging.getLogger("telemetry.ingest").warning("3 samples rejected")
    return HttpResponse("ok")


def plain_view(request: HttpRequest) -> HttpResponse:
    logging.getLogger("billing").info("page")
    return HttpResponse("ok")


def unavailable_view(request: HttpRequest) -> HttpResponse:
    node_var.set("gpu-08")
    return HttpResponse("database unavailable", status=503)


urlpatterns = [
    path("node", node_view),
    path("plain", plain_view),
    path("unavailable", unavailable_view),
]
