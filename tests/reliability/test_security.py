"""Security properties that cut across apps: secrets never at rest or in logs in clear, one node
cannot write another's GPUs, finance data is out of reach of node tokens, and CSRF guards every
state-changing request that a browser session can make."""

from __future__ import annotations

import io
import json
import logging
import re
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings
from django.core.management import call_command
from django.db import connection
from django.test import Client

from fleet.models import Gpu
from fleet.services import api_token_issue, node_token_issue
from telemetry.models import Sample
from tests.reliability.conftest import (
    INGEST,
    MEMORY,
    good_sample,
    gpu_block,
    push_body,
    recent_minute,
)

PASSWORD = "Correct-Horse-Battery-9417"


def _secret(token: str) -> str:
    """The part of a token that is not its visible prefix (``gfn_1a2b3c4d_<secret>``)."""
    return token.split("_", 2)[2]


def _text_columns() -> list[tuple[str, str]]:
    """(table, column) of every column that can hold text, in every table of the database."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "SELECT table_name, column_name FROM information_schema.columns "
                "WHERE table_schema = current_schema() AND data_type IN "
                "('text', 'character varying', 'character', 'json', 'jsonb', 'bytea')"
            )
            return [(t, c) for t, c in cursor.fetchall()]
        out = []
        for table in connection.introspection.table_names(cursor):
            for col in connection.introspection.get_table_description(cursor, table):
                if col.type_code and any(
                    k in str(col.type_code).lower() for k in ("char", "text", "json")
                ):
                    out.append((table, col.name))
        return out


def _tables_holding(needle: str) -> list[str]:
    found = []
    qn = connection.ops.quote_name
    with connection.cursor() as cursor:
        for table, column in _text_columns():
            cast = "::text" if connection.vendor == "postgresql" else ""
            cursor.execute(
                f"SELECT count(*) FROM {qn(table)} WHERE {qn(column)}{cast} LIKE %s",  # noqa: S608
                [f"%{needle}%"],
            )
            if cursor.fetchone()[0]:
                found.append(f"{table}.{column}")
    return found


def test_tokens_and_passwords_never_stored_in_clear(db: Any) -> None:
    """Issue tokens every way there is, use them, log in; then read every text column."""
    from django.contrib.auth import get_user_model

    secrets: dict[str, str] = {}
    _, secrets["node (service)"] = node_token_issue(hostname="clear-node")
    _, secrets["api (service)"] = api_token_issue(username="clear-fin", role="finance")
    out = io.StringIO()
    call_command("issue_node_token", "clear-node-2", stdout=out)
    secrets["node (command)"] = out.getvalue().strip().splitlines()[-1].split()[-1]
    out = io.StringIO()
    call_command("issue_api_token", "clear-admin", "--role", "admin", stdout=out)
    secrets["api (command)"] = out.getvalue().strip().splitlines()[-1].split()[-1]
    for name, token in secrets.items():
        assert re.fullmatch(r"gf[na]_[0-9a-f]{8}_[A-Za-z0-9_-]{40,}", token), (name, token)

    # Use them: a push, a finance call, a login with a password.
    uuid = "GPU-clear"
    body = json.dumps(push_body([good_sample(uuid, recent_minute())], [gpu_block(uuid)]))
    client = Client()
    r = client.post(
        INGEST,
        body,
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {secrets['node (service)']}",
    )
    assert r.status_code == 200
    r = client.get("/api/v1/costs", HTTP_AUTHORIZATION=f"Bearer {secrets['api (service)']}")
    assert r.status_code == 200
    get_user_model().objects.create_user(username="clear-person", password=PASSWORD)
    r = client.post("/accounts/login/", {"username": "clear-person", "password": PASSWORD})
    assert r.status_code == 302

    columns = _text_columns()
    assert len(columns) > 20  # the scan really reads the schema
    for name, token in secrets.items():
        assert not _tables_holding(_secret(token)), f"{name} token stored in clear"
    assert not _tables_holding(PASSWORD), "password stored in clear"


def test_one_node_cannot_write_another_nodes_gpus(db: Any) -> None:
    owner, owner_token = node_token_issue(hostname="owner-node")
    _, intruder_token = node_token_issue(hostname="intruder-node")
    uuid = "GPU-owned"
    client = Client()
    first = push_body([good_sample(uuid, recent_minute(10))], [gpu_block(uuid, index=2)])
    r = client.post(
        INGEST,
        json.dumps(first),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {owner_token}",
    )
    assert r.json()["accepted"] == 1

    # The intruder claims the GPU in its inventory (other index, name, memory, lost) and
    # pushes samples for it: a new interval and the owner's own interval, changed.
    claim = gpu_block(uuid, index=5, memory=1)
    claim.update(name="NVIDIA A40", status="lost")
    attack = push_body(
        [
            good_sample(uuid, recent_minute(9), util_pct=1.0),
            good_sample(uuid, recent_minute(10), util_pct=2.0),
        ],
        [claim],
        hostname="owner-node",  # a hostname in the body is only recorded
    )
    r = client.post(
        INGEST,
        json.dumps(attack),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {intruder_token}",
    )
    assert r.status_code == 400
    assert [(x["index"], x["field"]) for x in r.json()["rejected"]] == [(0, "gpu"), (1, "gpu")]
    gpu = Gpu.objects.get(uuid=uuid)
    assert gpu.node_id == owner.pk
    assert (gpu.index, gpu.memory_total_bytes, gpu.lost_at) == (2, MEMORY, None)
    assert gpu.name == "NVIDIA H100 80GB HBM3"
    assert [s.util_pct for s in Sample.objects.all()] == [73.5]


FINANCE_URLS = [
    "/api/v1/costs",
    "/api/v1/costs?format=csv&group_by=team",
    "/api/v1/focus",
    "/api/v1/breakeven?pool=p&tokens_per_s=2000&api_price_per_mtok=0.6",
    "/api/v1/cost-profiles",
    "/api/v1/sites",
    "/api/v1/gpus",
    "/api/v1/schema",
    "/chargeback/",
    "/breakeven/",
]


def test_finance_data_out_of_reach_of_a_node_token(db: Any) -> None:
    _, token = node_token_issue(hostname="curious-node")
    for url in FINANCE_URLS:
        for header in (f"Bearer {token}", f"Token {token}", token):
            r = Client().get(url, HTTP_AUTHORIZATION=header)
            assert r.status_code in (401, 403, 302), (url, header, r.status_code)
            if r.status_code == 302:  # a page: sent to the login form
                assert r["Location"].startswith("/accounts/login/")
            content = b"".join(getattr(r, "streaming_content", [r.content]))
            assert b"total_cost" not in content and b"cost_per_air_hour" not in content


# --- CSRF -------------------------------------------------------------------------------------
def _csrf_client(user: Any | None = None) -> tuple[Client, str]:
    """A client that enforces CSRF like a browser; returns it with its CSRF token."""
    client = Client(enforce_csrf_checks=True)
    if user is not None:
        client.force_login(user)
    client.get("/accounts/login/")
    return client, client.cookies["csrftoken"].value


SESSION_WRITES = [
    ("post", "/api/v1/sites", {"name": "csrf-site", "pue": "1.2", "price_per_kwh": "0.1"}),
    ("post", "/api/v1/teams", {"name": "csrf-team"}),
    ("post", "/api/v1/nodes", {"hostname": "csrf-node"}),
    ("patch", "/api/v1/sites/{site}", {"pue": "1.6"}),
    ("put", "/api/v1/teams/{team}", {"name": "csrf-team-2"}),
    ("delete", "/api/v1/teams/{team}", None),
    (
        "post",
        "/api/v1/cost-profiles",
        {
            "scope_kind": "gpu",
            "scope_name": "GPU-x",
            "kind": "rented",
            "rental_rate_per_hour": "1.00",
        },
    ),
]


@pytest.fixture
def admin_user(make_user: Any) -> Any:
    return make_user("admin")


def test_csrf_enforced_on_session_api_writes(admin_user: Any) -> None:
    from fleet.models import Site, Team

    ids = {
        "site": Site.objects.create(name="csrf-s").pk,
        "team": Team.objects.create(name="csrf-t").pk,
    }
    for method, path, data in SESSION_WRITES:
        url = path.format(**ids)
        client, token = _csrf_client(admin_user)
        kwargs: dict[str, Any] = {"content_type": "application/json"}
        if data is not None:
            kwargs["data"] = json.dumps(data)
        refused = getattr(client, method)(url, **kwargs)
        assert refused.status_code == 403, (method, url, refused.status_code)
        assert "CSRF" in refused.json()["detail"], refused.json()
        allowed = getattr(client, method)(url, HTTP_X_CSRFTOKEN=token, **kwargs)
        assert allowed.status_code in (200, 201, 204), (method, url, allowed.content[:300])


def test_bearer_token_writes_need_no_csrf(db: Any) -> None:
    """An API token is not ambient authority (the browser does not add it), so no CSRF."""
    _, token = api_token_issue(username="bearer-admin", role="admin")
    client = Client(enforce_csrf_checks=True)
    r = client.post(
        "/api/v1/teams",
        json.dumps({"name": "by-token"}),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {token}",
    )
    assert r.status_code == 201


def test_csrf_enforced_on_forms(make_user: Any) -> None:
    from django.contrib.auth import get_user_model

    get_user_model().objects.create_user(username="form-user", password=PASSWORD)
    # Login form.
    client = Client(enforce_csrf_checks=True)
    creds = {"username": "form-user", "password": PASSWORD}
    assert client.post("/accounts/login/", creds).status_code == 403
    client.get("/accounts/login/")
    token = client.cookies["csrftoken"].value
    assert (
        client.post("/accounts/login/", {**creds, "csrfmiddlewaretoken": token}).status_code == 302
    )
    # Logout (POST only).
    token = client.cookies["csrftoken"].value
    assert client.post("/accounts/logout/").status_code == 403
    assert client.post("/accounts/logout/", {"csrfmiddlewaretoken": token}).status_code == 302
    # The admin site's forms.
    admin = make_user("admin")
    client, token = _csrf_client(admin)
    add = {"name": "admin-form-team", "cost_center": ""}
    assert client.post("/admin/fleet/team/add/", add).status_code == 403
    r = client.post("/admin/fleet/team/add/", {**add, "csrfmiddlewaretoken": token})
    assert r.status_code == 302, r.content[:500]
    # The weekly report subscription form (mounted by the report pages).
    from django.urls import NoReverseMatch, reverse

    try:
        url = reverse("weekly-report-subscription")
    except NoReverseMatch:
        return
    finance = make_user("finance")
    client, token = _csrf_client(finance)
    assert client.post(url, {"opted_in": "1"}).status_code == 403
    assert client.post(url, {"opted_in": "1", "csrfmiddlewaretoken": token}).status_code == 302


# --- secrets in logs --------------------------------------------------------------------------
class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if record.exc_info:
            text += logging.Formatter().formatException(record.exc_info)
        self.lines.append(f"{record.name} {text} {record.__dict__!r}")


@pytest.fixture
def captured_logs() -> Iterator[_Capture]:
    handler = _Capture()
    root = logging.getLogger()
    old = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    # Log every SQL statement with its parameters too (Django does only with DEBUG).
    sql = logging.getLogger("django.db.backends")
    old_sql = sql.level
    sql.setLevel(logging.DEBUG)
    connection.force_debug_cursor = True
    try:
        yield handler
    finally:
        connection.force_debug_cursor = False
        sql.setLevel(old_sql)
        root.removeHandler(handler)
        root.setLevel(old)


def test_no_secret_in_logs(db: Any, captured_logs: _Capture, tmp_path: Any) -> None:
    """A whole session, good and bad: tokens issued, pushes (good, bad, wrong and revoked
    token), the agent's own delivery, logins (right and wrong password), API calls."""
    from django.contrib.auth import get_user_model

    from fleet.services import token_revoke
    from telemetry.agent.client import Delivery, Response
    from telemetry.agent.spool import Spool

    node, node_token = node_token_issue(hostname="log-node")
    _, api_token = api_token_issue(username="log-fin", role="finance")
    get_user_model().objects.create_user(username="log-person", password=PASSWORD)
    client = Client()
    uuid = "GPU-log"
    good = json.dumps(push_body([good_sample(uuid, recent_minute())], [gpu_block(uuid)]))
    bad = json.dumps(push_body([good_sample(uuid, recent_minute(), util_pct=500)]))
    for body in (good, bad, "{not json"):
        client.post(
            INGEST, body, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {node_token}"
        )
    client.post(
        INGEST,
        good,
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {node_token[:-3]}xyz",
    )
    client.get("/api/v1/costs", HTTP_AUTHORIZATION=f"Bearer {api_token}")
    client.get("/api/v1/costs", HTTP_AUTHORIZATION=f"Bearer {api_token}x")
    client.post("/accounts/login/", {"username": "log-person", "password": PASSWORD + "-wrong"})
    client.post("/accounts/login/", {"username": "log-person", "password": PASSWORD})
    client.get("/")

    # The agent, delivering through the same stack: first with its token, then revoked.
    def via_client(url: str, token: str, body: bytes, timeout: float) -> Response:
        r = Client().post(
            INGEST, body, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token}"
        )
        return Response(r.status_code, r.content, None, None)

    spool = Spool(str(tmp_path / "spool.sqlite3"))
    spool.add([good_sample(uuid, recent_minute(4)), good_sample(uuid, recent_minute(3))])
    delivery = Delivery(
        spool,
        url="http://127.0.0.1/api/v1/ingest",
        token=node_token,
        node=lambda: {"hostname": "log-node"},
        gpus=lambda: [gpu_block(uuid)],
        post=via_client,
        max_batch=1,
    )
    assert delivery.step(0.0) == "sent"
    token_revoke(prefix="_".join(node_token.split("_")[:2]))
    assert delivery.step(1.0) == "retry"
    spool.close()

    text = "\n".join(captured_logs.lines)
    assert "log-node" in text or "ingest" in text  # the capture really saw the session
    assert "SELECT" in text  # and the SQL
    for name, secret in {
        "node token": _secret(node_token),
        "API token": _secret(api_token),
        "password": PASSWORD,
        "SECRET_KEY": settings.SECRET_KEY,
    }.items():
        assert secret not in text, f"{name} appears in the logs"
