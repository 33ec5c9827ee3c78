"""The login lockout (config/auth.py, kept by django-axes) and how an operator lifts it.

The policy: ``LOGIN_FAILURE_LIMIT`` failures for one client address and username, or
``IP_LIMIT_FACTOR`` times that for one address across usernames, lock that key for
``LOGIN_FAILURE_WINDOW_S`` after its last counted failure, even for the right password; the
address is the one the ``NUM_PROXIES``-th proxy saw; a success clears its pair's count; the
counts live in the database, so the brake holds (and logins work) with the cache down.
docs/deploy.md §7 tells operators how to unlock; the tests below take those paths.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
import time_machine
from django.core.management import call_command
from django.test import Client, override_settings

from config.auth import IP_LIMIT_FACTOR
from tests.deploy.test_health_metrics import dead_caches

PASSWORD = "right-Pass-123"
IP = "203.0.113.7"
OTHER_IP = "192.0.2.7"
T0 = dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.UTC)

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def fast_password_hashing(settings: Any) -> None:
    # The real hasher takes ~0.3 s per login by design; these tests log in dozens of times.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def login(client: Any, username: str, password: str, ip: str, url: str = "/accounts/login/") -> Any:
    return client.post(url, {"username": username, "password": password}, REMOTE_ADDR=ip)


def fail(
    client: Any, username: str, ip: str, times: int, url: str = "/accounts/login/"
) -> list[int]:
    return [login(client, username, "wrong", ip, url).status_code for _ in range(times)]


@override_settings(LOGIN_FAILURE_LIMIT=3, LOGIN_FAILURE_WINDOW_S=60)
def test_login_is_locked_at_the_limit_even_for_the_right_password(
    client: Any, make_user: Any
) -> None:
    user = make_user("viewer", username="alice", password=PASSWORD)
    # The third failure reaches the limit: that answer already says so.
    assert fail(client, "alice", IP, 3) == [200, 200, 429]
    blocked = login(client, user.username, PASSWORD, IP)
    assert blocked.status_code == 429
    assert blocked["Retry-After"] == "60"
    assert "Too many failed logins" in str(blocked.context["form"].non_field_errors())
    assert "_auth_user_id" not in client.session
    # Another address is not affected, nor another username from this address.
    assert login(client, "alice", PASSWORD, OTHER_IP).status_code == 302
    client.logout()
    make_user("viewer", username="bob", password=PASSWORD)
    assert login(client, "bob", PASSWORD, IP).status_code == 302


@override_settings(LOGIN_FAILURE_LIMIT=3, LOGIN_FAILURE_WINDOW_S=60)
def test_lock_ends_a_window_after_the_last_counted_failure(client: Any, make_user: Any) -> None:
    make_user("viewer", username="carol", password=PASSWORD)
    with time_machine.travel(T0, tick=False) as clock:
        assert fail(client, "carol", IP, 3) == [200, 200, 429]
        clock.shift(30)
        # Refused tries are not counted: they do not push the end of the lock back.
        assert login(client, "carol", PASSWORD, IP).status_code == 429
        clock.shift(29)  # 59 s after the last counted failure
        assert login(client, "carol", PASSWORD, IP).status_code == 429
        clock.shift(2)
        assert login(client, "carol", PASSWORD, IP).status_code == 302


@override_settings(LOGIN_FAILURE_LIMIT=3, LOGIN_FAILURE_WINDOW_S=60)
def test_success_clears_the_count(client: Any, make_user: Any) -> None:
    make_user("viewer", username="dave", password=PASSWORD)
    assert fail(client, "dave", IP, 2) == [200, 200]
    assert login(client, "dave", PASSWORD, IP).status_code == 302
    client.logout()
    assert fail(client, "dave", IP, 2) == [200, 200]  # counted from zero again
    assert login(client, "dave", PASSWORD, IP).status_code == 302


@override_settings(LOGIN_FAILURE_LIMIT=2, LOGIN_FAILURE_WINDOW_S=60)
def test_one_address_across_usernames_is_locked_at_its_higher_limit(
    client: Any, make_user: Any
) -> None:
    limit = 2 * IP_LIMIT_FACTOR
    make_user("viewer", username="erin", password=PASSWORD)
    # One failure each for many usernames: no pair reaches its limit, the address nearly does.
    statuses = [login(client, f"guess{i}", "wrong", IP).status_code for i in range(limit - 1)]
    assert statuses == [200] * (limit - 1)
    # A success from that address clears its own pair only, not what it did to the others.
    assert login(client, "erin", PASSWORD, IP).status_code == 302
    client.logout()
    assert login(client, "guess-last", "wrong", IP).status_code == 429
    assert login(client, "erin", PASSWORD, IP).status_code == 429
    assert login(client, "erin", PASSWORD, OTHER_IP).status_code == 302


@override_settings(LOGIN_FAILURE_LIMIT=2, LOGIN_FAILURE_WINDOW_S=60)
def test_admin_login_is_locked_too(client: Any, make_user: Any) -> None:
    user = make_user("admin", username="frank", password=PASSWORD)
    user.is_staff = True
    user.save()
    assert fail(client, "frank", IP, 2, url="/admin/login/") == [200, 429]
    blocked = login(client, "frank", PASSWORD, IP, url="/admin/login/")
    assert blocked.status_code == 429
    assert "Too many failed logins" in blocked.content.decode()
    assert "_auth_user_id" not in client.session


@override_settings(LOGIN_FAILURE_LIMIT=2, NUM_PROXIES=1)
def test_lock_keys_on_the_address_the_proxy_saw(client: Any, make_user: Any) -> None:
    make_user("viewer", username="grace", password=PASSWORD)

    def attempt(password: str, spoofed: str, seen_by_proxy: str) -> int:
        # The client may write anything on the left; the proxy appends what it saw.
        return int(
            client.post(
                "/accounts/login/",
                {"username": "grace", "password": password},
                REMOTE_ADDR="172.18.0.5",
                HTTP_X_FORWARDED_FOR=f"{spoofed}, {seen_by_proxy}",
            ).status_code
        )

    assert attempt("wrong", "1.1.1.1", "198.51.100.9") == 200
    assert attempt("wrong", "2.2.2.2", "198.51.100.9") == 429
    assert attempt(PASSWORD, "3.3.3.3", "198.51.100.9") == 429  # spoofing the left: no help
    # Behind the same proxy (same REMOTE_ADDR), another client is not locked.
    assert attempt(PASSWORD, "3.3.3.3", "198.51.100.10") == 302
    # Garbage where the proxy's entry should be is not an address: REMOTE_ADDR counts.
    client.logout()
    assert attempt("wrong", "x", "not-an-address") == 200


@override_settings(LOGIN_FAILURE_LIMIT=2, LOGIN_FAILURE_WINDOW_S=60)
def test_logins_work_and_are_counted_with_the_cache_down(client: Any, make_user: Any) -> None:
    make_user("viewer", username="heidi", password=PASSWORD)
    with override_settings(CACHES=dead_caches()):
        assert fail(client, "heidi", IP, 1) == [200]
        assert login(client, "heidi", PASSWORD, IP).status_code == 302
        client.logout()
        assert fail(client, "heidi", IP, 2) == [200, 429]
        assert login(client, "heidi", PASSWORD, IP).status_code == 429


@override_settings(LOGIN_FAILURE_LIMIT=2, LOGIN_FAILURE_WINDOW_S=900)
def test_failed_logins_store_no_password(client: Any, make_user: Any) -> None:
    from axes.models import AccessAttempt

    make_user("viewer", username="ivan", password=PASSWORD)
    login(client, "ivan", "Guess-Number-One-8841", IP)
    login(client, "ivan", "Guess-Number-Two-8842", IP)
    [attempt] = AccessAttempt.objects.all()
    assert (attempt.username, attempt.ip_address, attempt.failures_since_start) == ("ivan", IP, 2)
    stored = " ".join(str(v) for v in AccessAttempt.objects.values_list().get())
    assert "Guess-Number" not in stored


# --- How an operator unlocks (docs/deploy.md §7) ----------------------------------------------
@override_settings(LOGIN_FAILURE_LIMIT=2, LOGIN_FAILURE_WINDOW_S=900)
def test_operator_unlocks_a_user_with_axes_reset_username(client: Any, make_user: Any) -> None:
    make_user("viewer", username="judy", password=PASSWORD)
    for ip in (IP, OTHER_IP):  # locked out from two addresses
        assert fail(client, "judy", ip, 2) == [200, 429]
        assert login(client, "judy", PASSWORD, ip).status_code == 429
    make_user("viewer", username="mallory", password=PASSWORD)
    assert fail(client, "mallory", IP, 2) == [200, 429]

    call_command("axes_reset_username", "judy")

    for ip in (IP, OTHER_IP):
        assert login(client, "judy", PASSWORD, ip).status_code == 302
        client.logout()
    assert login(client, "mallory", PASSWORD, IP).status_code == 429  # only judy was unlocked


@override_settings(LOGIN_FAILURE_LIMIT=1, LOGIN_FAILURE_WINDOW_S=900)
def test_operator_unlocks_an_address_with_axes_reset_ip(client: Any, make_user: Any) -> None:
    make_user("viewer", username="ken", password=PASSWORD)
    statuses = [login(client, f"guess{i}", "wrong", IP).status_code for i in range(5)]
    assert statuses[-1] == 429
    assert login(client, "ken", PASSWORD, IP).status_code == 429

    call_command("axes_reset_ip", IP)

    assert login(client, "ken", PASSWORD, IP).status_code == 302


@override_settings(LOGIN_FAILURE_LIMIT=2, LOGIN_FAILURE_WINDOW_S=900)
def test_operator_sees_and_deletes_a_lockout_in_the_admin(client: Any, make_user: Any) -> None:
    from axes.models import AccessAttempt

    make_user("viewer", username="liam", password=PASSWORD)
    assert fail(client, "liam", IP, 2) == [200, 429]

    operator = Client()
    operator.force_login(make_user("admin", username="operator", password=PASSWORD))
    listing = operator.get("/admin/axes/accessattempt/")
    assert listing.status_code == 200
    assert "liam" in listing.content.decode() and IP in listing.content.decode()
    attempt = AccessAttempt.objects.get(username="liam")
    confirm = operator.post(
        "/admin/axes/accessattempt/",
        {"action": "delete_selected", "_selected_action": [attempt.pk], "post": "yes"},
    )
    assert confirm.status_code == 302
    assert not AccessAttempt.objects.exists()
    assert login(client, "liam", PASSWORD, IP).status_code == 302
