"""The shape of ``GET /api/v1/alerts`` rows, for the OpenAPI schema. The rows themselves
leave through ``alerts.selectors.alert_data`` (the page's function too); a test keeps the two
in step."""

from __future__ import annotations

from rest_framework import serializers

from alerts.models import EVENTS, FIRING, RESOLVED
from alerts.rules import RULE_KINDS

_VALUE_HELP = (
    "A decimal string in the rule's unit (h, min, share 0–1, or money with two decimals); "
    "null for money rules when the caller may not see money (viewers)"
)


class NoticeSerializer(serializers.Serializer):  # type: ignore[type-arg]
    event = serializers.ChoiceField(choices=EVENTS)
    channel = serializers.ChoiceField(choices=["email", "webhook"])
    target = serializers.CharField(help_text="An address, or a webhook's scheme and host only")
    status = serializers.ChoiceField(choices=["pending", "sent", "failed"])
    attempts = serializers.IntegerField()
    sent_at = serializers.DateTimeField(allow_null=True)
    error = serializers.CharField(help_text="The last attempt's error, if any")


class AlertSerializer(serializers.Serializer):  # type: ignore[type-arg]
    id = serializers.IntegerField()
    rule = serializers.CharField(help_text="The rule's name in the fleet file")
    rule_kind = serializers.ChoiceField(choices=list(RULE_KINDS))
    subject = serializers.CharField(help_text="gpu:UUID, site:NAME, pool:NAME, team:NAME or fleet")
    subject_label = serializers.CharField(help_text="What people read: a GPU's host#index")
    state = serializers.ChoiceField(choices=[FIRING, RESOLVED])
    value = serializers.CharField(allow_null=True, help_text=f"The last value. {_VALUE_HELP}")
    peak_value = serializers.CharField(
        allow_null=True, help_text=f"The worst value while firing. {_VALUE_HELP}"
    )
    threshold = serializers.CharField(allow_null=True, help_text=_VALUE_HELP)
    unit = serializers.CharField(help_text="h, min, share, or the currency code for money")
    values_hidden = serializers.BooleanField(help_text="Money values left out for this caller")
    since = serializers.DateTimeField(help_text="When it started firing")
    last_notified_at = serializers.DateTimeField()
    notices = serializers.IntegerField(help_text="Notices decided: start, repeats, resolution")
    resolved_at = serializers.DateTimeField(allow_null=True)
    note = serializers.CharField(help_text="Why it closed without an evaluation, if so")
    window_start = serializers.DateTimeField(allow_null=True)
    window_end = serializers.DateTimeField(allow_null=True)
    url = serializers.URLField(help_text="The page that explains it, over its window")
    notified = NoticeSerializer(many=True, help_text="Who was told what")
