"""Explicit permissions for every endpoint; the API default (DenyAll) refuses everyone."""

from __future__ import annotations

from typing import Any

from rest_framework.permissions import BasePermission
from rest_framework.request import Request


class DenyAll(BasePermission):
    """The default: an endpoint that forgot to state its permission serves nobody."""

    def has_permission(self, request: Request, view: Any) -> bool:
        return False


class _HasPerm(BasePermission):
    perm = ""

    def has_permission(self, request: Request, view: Any) -> bool:
        user = request.user
        return bool(
            user
            and user.is_authenticated
            and getattr(user, "has_perm", None)
            and user.has_perm(self.perm)
        )


class CanViewDashboard(_HasPerm):
    """Any role: viewer, finance or admin."""

    perm = "fleet.view_dashboard"


class CanViewCosts(_HasPerm):
    """Finance or admin: money, break-even, exports."""

    perm = "fleet.view_costs"


class CanManageFleet(_HasPerm):
    """Admin only."""

    perm = "fleet.manage_fleet"


class CanViewCostsOrManageWrites(BasePermission):
    """Reads for finance and admin; writes for admin only."""

    def has_permission(self, request: Request, view: Any) -> bool:
        if request.method in ("GET", "HEAD", "OPTIONS"):
            return CanViewCosts().has_permission(request, view)
        return CanManageFleet().has_permission(request, view)


class IsNode(BasePermission):
    """A node agent authenticated by its node token."""

    def has_permission(self, request: Request, view: Any) -> bool:
        from fleet.authentication import NodePrincipal

        return isinstance(request.user, NodePrincipal)
