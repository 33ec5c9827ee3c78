"""The six classes of input that broke the product under attack (issue 13), each closed where
it can occur: identifiers that reach URLs, unbounded lists, decoder edge cases, ownership (in
tests/telemetry/test_ingest_ownership.py), dates at the calendar's ends, and parameters that
were silently ignored. Every case goes through the real endpoint, page or command."""

from __future__ import annotations

import datetime as dt
import json
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client, override_settings

from fleet.models import Gpu, Node, Site
from fleet.services import FleetFileError, api_token_issue, node_token_issue
from telemetry.models import Sample
from tests.reliability.conftest import INGEST, good_sample, gpu_block, push_body, recent_minute

PAGES = ("/", "/fleet/", "/fleet/heatmap/", "/chargeback/", "/breakeven/")
BAD_IDENTIFIERS = {
    "slash": "GPU-a/b",
    "backslash": "GPU-a\\b",
    "control": "GPU-\x07",
    "newline": "GPU-a\nb",
    "surrounding space": " GPU-a",
    "dot-dot": "..",
    "line separator": "GPU-\u2028",
    "too long": "G" * 101,
}


@pytest.fixture
def node(db: Any) -> tuple[Node, str]:
    return node_token_issue(hostname="hard-node")


def _post(body: Any, token: str) -> Any:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return Client().generic(
        "POST",
        INGEST,
        data=data,
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {token}",
    )


@pytest.fixture
def finance(db: Any) -> Client:
    from django.contrib.auth import get_user_model

    from fleet.roles import role_assign

    user = get_user_model().objects.create_user(username="hard-finance")
    role_assign(user=user, role="finance")
    client = Client()
    client.force_login(user)
    return client


# --- 1. identifiers -----------------------------------------------------------------------------
@pytest.mark.parametrize("uuid", BAD_IDENTIFIERS.values(), ids=BAD_IDENTIFIERS.keys())
def test_gpu_block_with_a_bad_uuid_is_400_naming_it(node: Any, uuid: str) -> None:
    _, token = node
    r = _post(push_body([good_sample(uuid, recent_minute())], [gpu_block(uuid)]), token)
    assert r.status_code == 400, r.content
    assert r.json()["field"] == "gpus[0].uuid"
    assert not Gpu.objects.exists() and not Sample.objects.exists()


@pytest.mark.parametrize("uuid", ["GPU-a/b", "GPU-\ud800", "GPU-\x00x"])
def test_sample_naming_a_bad_uuid_is_rejected_naming_gpu(node: Any, uuid: str) -> None:
    """A sample's ``gpu`` is checked before it reaches the database (a lone surrogate made the
    driver raise while encoding it); the rest of the push is stored."""
    _, token = node
    good = good_sample("GPU-ok", recent_minute())
    body = json.dumps(push_body([good, good_sample("X", recent_minute())], [gpu_block("GPU-ok")]))
    # json.dumps escapes the placeholder; put the raw (possibly invalid) string in its place.
    body = body.replace('"X"', json.dumps(uuid))
    r = _post(body.encode(), token)
    if "\x00" in uuid:
        assert r.status_code == 400 and r.json()["field"] == "body"  # NUL: refused whole
        return
    assert r.status_code == 200, r.content
    assert r.json()["rejected"][0]["index"] == 1
    assert r.json()["rejected"][0]["field"] == "gpu"
    assert list(Gpu.objects.values_list("uuid", flat=True)) == ["GPU-ok"]


@pytest.mark.parametrize(
    ("block", "field"),
    [
        ({"hostname": "gpu-07/../x"}, "node.hostname"),
        ({"hostname": "gpu-\ud83d"}, "node.hostname"),
        ({"agent_version": "1.0\x1b[31m"}, "node.agent_version"),
        ({"driver_version": "550\udfff"}, "node.driver_version"),
    ],
)
def test_node_block_with_bad_strings_is_400_naming_the_field(
    node: Any, block: dict[str, str], field: str
) -> None:
    _, token = node
    body = push_body([good_sample("GPU-n", recent_minute())], [gpu_block("GPU-n")])
    body["node"].update(block)
    r = _post(body, token)
    assert r.status_code == 400, r.content
    assert r.json()["field"] == field
    assert not Sample.objects.exists()
    assert Node.objects.get(hostname="hard-node").reported_hostname == ""


def test_gpu_name_with_a_surrogate_is_400(node: Any) -> None:
    _, token = node
    block = {**gpu_block("GPU-s"), "name": "NVIDIA \udc80"}
    r = _post(push_body([good_sample("GPU-s", recent_minute())], [block]), token)
    assert r.status_code == 400 and r.json()["field"] == "gpus[0].name"


@pytest.mark.parametrize("name", ["rack/1", "\tteam", "a\x00b", ".."])
def test_fleet_file_names_must_be_identifiers(db: Any, name: str) -> None:
    from billing.services import fleet_document_apply

    for table, key in (("sites", "name"), ("teams", "name"), ("pools", "name")):
        with pytest.raises(FleetFileError, match=rf"^{table}\[0\]\.{key}: "):
            fleet_document_apply(document={"currency": "USD", table: [{key: name}]})
    with pytest.raises(FleetFileError, match=r"^nodes\[0\]\.hostname: "):
        fleet_document_apply(document={"currency": "USD", "nodes": [{"hostname": name}]})
    with pytest.raises(FleetFileError, match=r"^gpus\[0\]\.uuid: "):
        fleet_document_apply(document={"currency": "USD", "gpus": [{"uuid": name}]})
    assert not Site.objects.exists() and not Node.objects.exists()


def test_issue_node_token_refuses_a_bad_hostname(db: Any) -> None:
    with pytest.raises(CommandError, match="hostname: must not contain"):
        call_command("issue_node_token", "gpu/07", stdout=StringIO(), stderr=StringIO())
    assert not Node.objects.exists()


def test_inventory_api_refuses_a_bad_name_naming_the_field(db: Any) -> None:
    _, token = api_token_issue(username="hard-admin", role="admin")
    r = Client().post(
        "/api/v1/sites",
        data=json.dumps({"name": "fra/1"}),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {token}",
    )
    assert r.status_code == 400 and "name" in r.json(), r.content
    assert not Site.objects.exists()


def test_pages_survive_a_stored_gpu_that_cannot_be_linked(
    finance: Client, node: Any, django_assert_max_num_queries: Any
) -> None:
    """Rows stored before the rule (here: written past it with the ORM) are shown without a
    link on the fleet board, never a 500; every other page and the inventory API answer."""
    from django.utils import timezone

    gpu_node, _ = node
    since = timezone.now() - dt.timedelta(days=2)  # in service: on the board
    Gpu.objects.create(uuid="GPU-legacy/1", node=gpu_node, index=0, in_service_at=since)
    Gpu.objects.create(uuid="GPU-fine", node=gpu_node, index=1, in_service_at=since)
    for page in PAGES:
        r = finance.get(page)
        assert r.status_code == 200, (page, r.status_code)
    board = finance.get("/fleet/?sort=name&dir=asc").content.decode()
    assert 'href="/gpus/GPU-fine/' in board
    assert "GPU-legacy/1" in board and "/gpus/GPU-legacy/1/" not in board
    _, token = api_token_issue(username="hard-fin", role="finance")
    r = Client().get("/api/v1/gpus", HTTP_AUTHORIZATION=f"Bearer {token}")
    assert r.status_code == 200 and r.json()["count"] == 2


# --- 2. lists without a bound -------------------------------------------------------------------
def test_gpus_block_over_the_limit_is_413_naming_it(node: Any) -> None:
    _, token = node
    gpus = [gpu_block(f"GPU-many-{i}", i) for i in range(65)]
    r = _post(push_body([], gpus), token)
    assert r.status_code == 413 and r.json()["field"] == "gpus"
    assert not Gpu.objects.exists()
    with override_settings(INGEST_MAX_GPUS=100):
        assert _post(push_body([], gpus), token).status_code == 200
    assert Gpu.objects.count() == 64  # NODE_MAX_GPUS: the 65th is not registered


@override_settings(NODE_MAX_GPUS=2)
def test_a_node_owns_at_most_node_max_gpus(node: Any) -> None:
    """The cap counts the node's GPUs that are not retired; past it new GPUs are not
    registered and their samples are rejected saying why, while the others are stored."""
    from django.utils import timezone

    _, token = node
    start = recent_minute()
    uuids = ["GPU-c0", "GPU-c1", "GPU-c2"]
    r = _post(
        push_body([good_sample(u, start) for u in uuids], [gpu_block(u) for u in uuids]), token
    )
    assert r.status_code == 200, r.content
    assert r.json()["accepted"] == 2
    (reject,) = r.json()["rejected"]
    assert (reject["index"], reject["field"]) == (2, "gpu")
    assert "NODE_MAX_GPUS" in reject["error"]
    assert sorted(Gpu.objects.values_list("uuid", flat=True)) == ["GPU-c0", "GPU-c1"]
    only_new = _post(push_body([good_sample("GPU-c2", start)], [gpu_block("GPU-c2")]), token)
    assert (
        only_new.status_code == 400 and "NODE_MAX_GPUS" in only_new.json()["rejected"][0]["error"]
    )
    Gpu.objects.filter(uuid="GPU-c0").update(retired_at=timezone.now())  # frees a place
    again = _post(push_body([good_sample("GPU-c2", start)], [gpu_block("GPU-c2")]), token)
    assert again.json() == {"accepted": 1, "duplicates": 0, "rejected": []}


# --- 3. decoder edge cases ----------------------------------------------------------------------
@pytest.mark.parametrize(
    "body",
    [
        b'{"samples": [' + b"[" * 100_000 + b"]" * 100_000 + b"]}",
        b'{"samples": [], "node": ' + b'{"a":' * 50_000 + b"1" + b"}" * 50_000 + b"}",
        b'{"samples": [' + b"[" * 100_000 + b"NaN" + b"]" * 100_000 + b"]}",
    ],
    ids=["nested arrays", "nested objects", "nested with a NaN literal"],
)
def test_deeply_nested_json_is_400_naming_the_body(node: Any, body: bytes) -> None:
    _, token = node
    r = _post(body, token)
    assert r.status_code == 400, r.content[:200]
    assert r["Content-Type"] == "application/json"
    assert r.json()["field"] in ("body", "samples[0]", "node")


def test_unknown_keys_holding_surrogates_are_ignored(node: Any) -> None:
    """Unknown keys are ignored (docs/ingest.md), whatever they hold: nothing of them is
    stored, so a lone surrogate there harms nothing."""
    _, token = node
    sample = good_sample("GPU-u", recent_minute())
    body = json.dumps(push_body([{**sample, "note": "X"}], [{**gpu_block("GPU-u"), "x": "X"}]))
    r = _post(body.replace('"X"', '"\\ud800"').encode(), token)
    assert r.json() == {"accepted": 1, "duplicates": 0, "rejected": []}


# --- 5. dates at the calendar's ends ------------------------------------------------------------
@pytest.mark.parametrize(
    "query", ["from=0001-01-01", "to=9999-12-31", "from=0001-01-01&to=9999-12-31"]
)
def test_every_page_bounds_its_dates_with_a_form_error(finance: Client, query: str) -> None:
    for page in (*PAGES, "/gpus/GPU-none/"):
        r = finance.get(f"{page}?{query}")
        assert r.status_code in (200, 404), (page, r.status_code)
        if r.status_code == 200:
            assert "must be a date from 2000-01-01 to 2100-12-31" in r.content.decode(), page


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("start=0001-01-01&end=0001-01-02", "start"),
        ("start=9999-12-30&end=9999-12-31", "start"),
        ("end=9999-12-31", "end"),
    ],
)
def test_api_dates_outside_the_bounds_are_400_naming_them(
    finance: Client, query: str, field: str
) -> None:
    breakeven = "/api/v1/breakeven?pool=p&tokens_per_s=1&api_price_per_mtok=1"
    for url in (f"/api/v1/costs?{query}", f"{breakeven}&{query}"):
        r = finance.get(url)
        assert r.status_code == 400, (url, r.status_code)
        assert field in r.json(), r.json()


@pytest.mark.parametrize("week", ["0001-W01", "9999-W52", "1999-W52"])
def test_report_week_outside_the_bounds_is_refused(db: Any, week: str) -> None:
    with pytest.raises(CommandError, match="outside the report dates"):
        call_command("send_weekly_report", "--week", week, stdout=StringIO())


def test_fleet_file_service_dates_are_bounded(db: Any) -> None:
    from billing.services import fleet_document_apply

    node_token_issue(hostname="dated")
    for value in ("0001-01-01", "9999-12-31T23:59:59Z"):
        gpu = {"uuid": "GPU-dated", "node": "dated", "in_service": value}
        with pytest.raises(FleetFileError, match=r"gpus\[0\]\.in_service: must be a date from"):
            fleet_document_apply(document={"currency": "USD", "gpus": [gpu]})


# --- 6. parameters silently ignored -------------------------------------------------------------
@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("limit=abc", "limit"),
        ("limit=0", "limit"),
        ("limit=10001", "limit"),
        ("offset=abc", "offset"),
        ("offset=-1", "offset"),
        ("format=xml", "format"),
        ("group_by=planet", "group_by"),
        ("period=fortnight", "period"),
    ],
)
def test_costs_parameters_are_validated(finance: Client, query: str, field: str) -> None:
    r = finance.get(f"/api/v1/costs?{query}")
    assert r.status_code == 400, (query, r.status_code)
    assert field in r.json(), r.json()


@pytest.mark.parametrize(
    ("url", "field"),
    [
        ("/api/v1/gpus?retired=garbage", "retired"),
        ("/api/v1/gpus?limit=abc", "limit"),
        ("/api/v1/sites?offset=x", "offset"),
        ("/api/v1/gpus?format=xml", "format"),
        ("/api/v1/cost-profiles?kind=bought", "kind"),
        ("/api/v1/cost-profiles?scope_kind=rack", "scope_kind"),
    ],
)
def test_inventory_parameters_are_validated(db: Any, url: str, field: str) -> None:
    _, token = api_token_issue(username="hard-inv", role="finance")
    r = Client().get(url, HTTP_AUTHORIZATION=f"Bearer {token}")
    assert r.status_code == 400, (url, r.status_code)
    assert field in r.json(), r.json()


def test_retired_filter_filters(db: Any) -> None:
    from django.utils import timezone

    gpu_node, _ = node_token_issue(hostname="ret")
    Gpu.objects.create(uuid="GPU-live", node=gpu_node)
    Gpu.objects.create(uuid="GPU-gone", node=gpu_node, retired_at=timezone.now())
    _, token = api_token_issue(username="hard-ret", role="finance")
    auth = {"HTTP_AUTHORIZATION": f"Bearer {token}"}
    for value, want in (("true", ["GPU-gone"]), ("false", ["GPU-live"])):
        r = Client().get(f"/api/v1/gpus?retired={value}", **auth)
        assert [g["uuid"] for g in r.json()["results"]] == want
