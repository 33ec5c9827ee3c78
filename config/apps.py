"""The project package as an app, for what must be in place when Django starts: the system
checks of the single sign-on settings (config/oidc.py), which name a wrong setting at every
start that checks (runserver, migrate, ``check --deploy``)."""

from django.apps import AppConfig


class ProjectConfig(AppConfig):
    name = "config"
    label = "gpufleet_config"
    verbose_name = "gpufleet project"

    def ready(self) -> None:
        # Registers the checks (importing it needs the auth models, so not before now).
        from config import oidc  # noqa: F401
