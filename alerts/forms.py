"""The Alerts page's filter bar (GET, so a filtered list is a URL to share)."""

from __future__ import annotations

from typing import Any

from django import forms

from alerts.models import FIRING, RESOLVED, Rule
from alerts.rules import RULE_KINDS


class AlertFilterForm(forms.Form):
    state = forms.ChoiceField(
        required=False, choices=[("", "All"), (FIRING, "Firing"), (RESOLVED, "Resolved")]
    )
    rule = forms.ChoiceField(required=False)
    rule_kind = forms.ChoiceField(required=False, label="Kind")
    subject = forms.CharField(required=False, max_length=200, help_text="gpu:UUID, pool:NAME, …")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        rule_field: Any = self.fields["rule"]
        kind_field: Any = self.fields["rule_kind"]
        rule_field.choices = [("", "All")] + [
            (n, n) for n in Rule.objects.order_by("name").values_list("name", flat=True)
        ]
        kind_field.choices = [("", "All")] + [(k, k) for k in RULE_KINDS]
