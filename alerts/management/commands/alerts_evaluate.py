"""``alerts_evaluate``: evaluate every alert rule now (what the 5-minute beat task does)."""

from typing import Any

from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Evaluate the fleet file's alert rules now and send the notices that are due."

    def handle(self, *args: Any, **options: Any) -> None:
        from alerts.services import alerts_evaluate

        self.stdout.write(alerts_evaluate().summary())
