"""gunicorn settings for the web service (docker/compose.yml and the systemd unit).

Every value can be changed without a rebuild: gunicorn reads ``WEB_CONCURRENCY`` itself, and
``GUNICORN_CMD_ARGS`` adds or overrides options (``--timeout 60``).
"""

import os

bind = os.environ.get("GUNICORN_BIND", "0.0.0.0:8000")
# Sync workers: requests are short (ingest validates and COPYs in milliseconds), and a worker
# per core plus one keeps a core busy while another waits on PostgreSQL.
workers = int(os.environ.get("WEB_CONCURRENCY", str((os.cpu_count() or 1) + 1)))
timeout = 30
graceful_timeout = 30
keepalive = 5
# Recycle workers now and then so a slow leak never becomes an outage; the jitter keeps them
# from restarting all at once.
max_requests = 2000
max_requests_jitter = 200
# The heartbeat file lives in memory: on a container's overlay filesystem it can stall workers.
worker_tmp_dir = "/dev/shm" if os.path.isdir("/dev/shm") else None
# The application writes one access line per request itself, with the request id
# (config.middleware.RequestIdMiddleware), so gunicorn's own access log stays off.
accesslog = None
errorlog = "-"
loglevel = os.environ.get("LOG_LEVEL", "info").lower()

if os.environ.get("LOG_JSON", "true").strip().lower() in {"1", "true", "yes", "on"}:
    # gunicorn's own lines (start, worker timeouts) in the same JSON shape as the application's.
    logconfig_dict = {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"json": {"()": "config.logging.JsonFormatter"}},
        "handlers": {
            "console": {
                "class": "logging.StreamHandler",
                "formatter": "json",
                "stream": "ext://sys.stderr",
            }
        },
        "loggers": {
            "gunicorn.error": {
                "handlers": ["console"],
                "level": loglevel.upper(),
                "propagate": False,
            }
        },
    }
