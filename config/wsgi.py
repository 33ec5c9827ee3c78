"""WSGI entry point (gunicorn config.wsgi)."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
application = get_wsgi_application()

# On the embedded default (no broker) the process that serves also runs Celery beat's schedule
# (config/scheduler.py); runserver's autoreloader parent never gets here.
from config import scheduler  # noqa: E402

scheduler.start()
