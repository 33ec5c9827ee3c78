from django.apps import AppConfig


class AlertsConfig(AppConfig):
    name = "alerts"
    verbose_name = "Alerts"

    def ready(self) -> None:
        # The fleet file's [[alerts]] table is applied by billing's fleet_document_apply
        # (fleet_apply, the demo) through its section hook: billing never imports alerts.
        from alerts.fleetfile import alerts_section_apply
        from alerts.people import owner_targets, people_section_apply
        from alerts.targets import SYMBOLS
        from billing.services import fleet_section_register

        SYMBOLS["owner"] = owner_targets

        # People first: an alert rule naming "owner" is resolved against them.
        fleet_section_register(key="people", apply=people_section_apply)
        fleet_section_register(key="alerts", apply=alerts_section_apply)
