"""Container health checks for docker/compose.yml (the slim image has no curl).

    python docker/healthcheck.py http URL          200 from URL (web: /healthz)
    python docker/healthcheck.py worker            this container's Celery worker answers a ping
    python docker/healthcheck.py beat FILE [AGE_S] beat's schedule file changed in AGE_S (600)

Exit 0 when healthy, 1 otherwise, with one line saying why.
"""

from __future__ import annotations

import glob
import os
import socket
import sys
import time
import urllib.request


def check_http(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:  # noqa: S310 - fixed local URL
            return None if response.status == 200 else f"HTTP {response.status}"
    except Exception as exc:  # noqa: BLE001
        return f"{url}: {exc}"


def check_worker() -> str | None:
    from config.celery import app

    name = f"celery@{socket.gethostname()}"
    replies = app.control.ping(destination=[name], timeout=5)
    return None if replies else f"{name} did not answer a ping"


def check_beat(path: str, max_age_s: float) -> str | None:
    # The shelve behind the schedule may be FILE, FILE.db or FILE.dat depending on dbm.
    files = glob.glob(path) + glob.glob(path + ".*")
    if not files:
        return f"no schedule file at {path}"
    age = time.time() - max(os.path.getmtime(f) for f in files)
    # Beat writes the file every few minutes while it sends tasks (every minute: rollup).
    return None if age <= max_age_s else f"schedule file unchanged for {age:.0f} s"


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[0] == "http":
        problem = check_http(argv[1])
    elif argv[:1] == ["worker"]:
        problem = check_worker()
    elif len(argv) >= 2 and argv[0] == "beat":
        problem = check_beat(argv[1], float(argv[2]) if len(argv) > 2 else 600.0)
    else:
        print(__doc__, file=sys.stderr)
        return 2
    if problem:
        print(f"unhealthy: {problem}")
        return 1
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
