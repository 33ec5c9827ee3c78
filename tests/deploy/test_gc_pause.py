"""The cyclic garbage collector is paused while a request is served, and only then."""

from __future__ import annotations

import gc
import threading
from typing import Any

from django.http import HttpResponse
from django.test import Client, RequestFactory

from config.middleware import GcPauseMiddleware, gc_paused


def test_a_request_is_served_with_the_collector_paused_and_it_runs_again_after() -> None:
    seen: list[bool] = []

    def view(request: Any) -> HttpResponse:
        seen.append(gc.isenabled())
        return HttpResponse("ok")

    assert gc.isenabled()
    response = GcPauseMiddleware(view)(RequestFactory().get("/"))
    assert response.status_code == 200 and seen == [False]
    assert gc.isenabled()


def test_the_collector_stays_paused_until_the_last_of_overlapping_requests_ends() -> None:
    # Two threads: the first ends its block while the second is still inside its own.
    inside, first_done, states = threading.Event(), threading.Event(), []

    def second() -> None:
        with gc_paused():
            inside.set()
            first_done.wait(5)
            states.append(gc.isenabled())

    with gc_paused():
        thread = threading.Thread(target=second)
        thread.start()
        assert inside.wait(5)
    first_done.set()
    thread.join(5)
    assert states == [False] and gc.isenabled()


def test_a_collector_switched_off_before_stays_off() -> None:
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_the_middleware_is_the_first_of_the_stack(settings: Any, db: Any) -> None:
    assert settings.MIDDLEWARE[0] == "config.middleware.GcPauseMiddleware"
    assert Client().get("/healthz").status_code == 200 and gc.isenabled()
