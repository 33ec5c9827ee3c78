from django.apps import AppConfig
from django.db.models.signals import post_migrate


class FleetConfig(AppConfig):
    name = "fleet"
    verbose_name = "Fleet inventory"

    def ready(self) -> None:
        from fleet.roles import roles_sync

        post_migrate.connect(roles_sync, sender=self, dispatch_uid="fleet_roles_sync")
        post_migrate.connect(_catalogue_seed, sender=self, dispatch_uid="fleet_catalogue_seed")


def _catalogue_seed(**_: object) -> None:
    from fleet.services import gpu_models_seed

    gpu_models_seed()
