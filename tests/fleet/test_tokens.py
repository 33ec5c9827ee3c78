"""Tokens: shown once, hashed at rest, found by prefix, revocable, last_used kept."""

from __future__ import annotations

import hashlib
import hmac

import pytest
from django.core.management import call_command
from django.test import override_settings
from rest_framework.test import APIRequestFactory

from fleet.authentication import ApiTokenAuthentication, NodePrincipal, NodeTokenAuthentication
from fleet.models import ApiToken, Node, NodeToken
from fleet.services import api_token_issue, node_token_issue, token_revoke

pytestmark = pytest.mark.django_db


def _request(token: str):
    return APIRequestFactory().get("/api/v1/costs", HTTP_AUTHORIZATION=f"Bearer {token}")


@pytest.mark.smoke
def test_node_token_is_stored_only_as_prefix_and_hash():
    node, token = node_token_issue(hostname="gpu-07")
    row = NodeToken.objects.get(node=node)
    # gfn_<8 hex>_<secret>: the prefix is the first two parts, the hash is of the whole token.
    assert token.startswith(row.prefix + "_")
    assert len(row.prefix) == len("gfn_") + 8
    expected = hmac.new(b"", token.encode(), hashlib.sha256).hexdigest()
    assert row.token_hash == expected
    secret = token.split("_", 2)[2]
    for field in (row.prefix, row.token_hash):
        assert secret not in field


@override_settings(TOKEN_PEPPER="pepper")
def test_pepper_changes_the_stored_hash():
    _, token = node_token_issue(hostname="gpu-08")
    row = NodeToken.objects.get()
    assert row.token_hash == hmac.new(b"pepper", token.encode(), hashlib.sha256).hexdigest()


def test_node_token_authenticates_its_node_and_records_last_used():
    node, token = node_token_issue(hostname="gpu-07")
    principal, auth = NodeTokenAuthentication().authenticate(_request(token))
    assert isinstance(principal, NodePrincipal)
    assert (principal.node_id, principal.hostname) == (node.pk, "gpu-07")
    assert NodeToken.objects.get().last_used_at is not None
    assert principal.has_perm("fleet.view_costs") is False


@pytest.mark.parametrize(
    "mangle",
    [
        lambda t: t[:-1] + ("A" if t[-1] != "A" else "B"),  # right prefix, wrong secret
        lambda t: "gfn_00000000_" + t.split("_", 2)[2],  # unknown prefix
        lambda t: "garbage",
    ],
)
def test_wrong_node_token_is_refused(mangle):
    from rest_framework.exceptions import AuthenticationFailed

    _, token = node_token_issue(hostname="gpu-07")
    with pytest.raises(AuthenticationFailed):
        NodeTokenAuthentication().authenticate(_request(mangle(token)))


def test_revoked_token_is_refused_and_revoke_is_by_prefix():
    from rest_framework.exceptions import AuthenticationFailed

    _, token = node_token_issue(hostname="gpu-07")
    prefix = NodeToken.objects.get().prefix
    assert token_revoke(prefix=prefix) == f"revoked NodeToken {prefix}"
    with pytest.raises(AuthenticationFailed):
        NodeTokenAuthentication().authenticate(_request(token))


def test_api_token_carries_its_users_role():
    user, token = api_token_issue(username="fin", role="finance")
    authed_user, _ = ApiTokenAuthentication().authenticate(_request(token))
    assert authed_user == user
    assert user.has_perm("fleet.view_costs") and not user.has_perm("fleet.manage_fleet")


def test_node_token_is_not_an_api_token():
    from rest_framework.exceptions import AuthenticationFailed

    _, token = node_token_issue(hostname="gpu-07")
    with pytest.raises(AuthenticationFailed):
        ApiTokenAuthentication().authenticate(_request(token))


def test_commands_print_the_token_last_and_revoke_it(capsys):
    call_command("issue_node_token", "gpu-09")
    node_token = capsys.readouterr().out.strip().splitlines()[-1]
    assert Node.objects.filter(hostname="gpu-09").exists()
    assert (
        NodeToken.objects.get().token_hash
        == hmac.new(b"", node_token.encode(), hashlib.sha256).hexdigest()
    )

    call_command("issue_api_token", "alice", "--role", "admin")
    api_token = capsys.readouterr().out.strip().splitlines()[-1]
    row = ApiToken.objects.get(user__username="alice")
    assert api_token.startswith(row.prefix)
    assert row.user.is_staff

    call_command("revoke_token", row.prefix)
    assert capsys.readouterr().out.strip().splitlines()[-1] == f"revoked ApiToken {row.prefix}"
    assert ApiToken.objects.get().revoked_at is not None


def test_role_change_replaces_the_old_role():
    user, _ = api_token_issue(username="bob", role="admin")
    user, _ = api_token_issue(username="bob", role="viewer")
    user.refresh_from_db()
    assert sorted(user.groups.values_list("name", flat=True)) == ["viewer"]
    assert not user.is_staff and not user.is_superuser
