"""The three roles and what each may do; groups are kept in step on every migrate."""

from __future__ import annotations

from typing import Any

ROLE_PERMISSIONS: dict[str, tuple[str, ...]] = {
    "viewer": ("view_dashboard",),
    "finance": ("view_dashboard", "view_costs"),
    "admin": ("view_dashboard", "view_costs", "manage_fleet"),
}
ROLES = tuple(ROLE_PERMISSIONS)


def roles_sync(**_: Any) -> None:
    """Create the role groups and give them exactly their permissions (idempotent)."""
    from django.contrib.auth.models import Group, Permission

    for role, codenames in ROLE_PERMISSIONS.items():
        group, _created = Group.objects.get_or_create(name=role)
        perms = Permission.objects.filter(content_type__app_label="fleet", codename__in=codenames)
        group.permissions.set(perms)


def role_assign(*, user: Any, role: str) -> None:
    """Put a user in exactly one role group; admins also get the Django admin site."""
    if role not in ROLE_PERMISSIONS:
        raise ValueError(f"unknown role {role!r}; choose one of {', '.join(ROLES)}")
    roles_sync()
    _role_set(user=user, role=role)


def role_clear(*, user: Any) -> None:
    """Take a user out of every role group (no page, no API): single sign-on does this when
    the identity provider's groups no longer give the user a role (config/oidc.py)."""
    _role_set(user=user, role=None)


def _role_set(*, user: Any, role: str | None) -> None:
    from django.contrib.auth.models import Group

    user.groups.remove(*Group.objects.filter(name__in=ROLES))
    if role is not None:
        user.groups.add(Group.objects.get(name=role))
    user.is_staff = role == "admin"
    user.is_superuser = role == "admin"
    user.save(update_fields=["is_staff", "is_superuser"])
