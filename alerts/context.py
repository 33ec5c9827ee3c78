"""The navigation's badge (templates/nav/entries.html): how many alerts fire now.

A context processor, as docs/dashboard.md asks of a count every page shows. The count is a
callable the template calls only where it is shown (one COUNT on the open-alert index), and
only for users who may see alerts.
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest


def firing(request: HttpRequest) -> dict[str, Any]:
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated or not user.has_perm("fleet.view_dashboard"):
        return {}
    from alerts.selectors import firing_count

    return {"alerts_firing": firing_count}
