"""A Celery worker whose consumer drops marked messages, as kombu's Redis transport does after
a broker blip (config/watchdog.py): ``python -m tests.reliability.lossy_worker <celery args>``.

A message sent with the header ``LOSE`` is taken off its queue and filed in kombu's unacked set
as usual, then never handed to the worker: the state a worker was left in after a blip, made
deterministic. A message kombu put back (``redelivered``) goes through, as it would to a fresh
worker.
"""

from __future__ import annotations

import sys
from typing import Any

LOSE = "x-gpufleet-test-lose"


def _lossy_consume() -> None:
    from kombu.transport.virtual.base import Channel

    consume: Any = Channel.basic_consume

    def basic_consume(
        self: Any, queue: str, no_ack: bool, callback: Any, *args: Any, **kw: Any
    ) -> Any:
        def lossy(message: Any) -> Any:
            headers = message.headers or {}
            if headers.get(LOSE) and not headers.get("redelivered"):
                return None  # taken and filed as unacknowledged by kombu; lost to the worker
            return callback(message)

        return consume(self, queue, no_ack, lossy, *args, **kw)

    Channel.basic_consume = basic_consume  # type: ignore[method-assign]


if __name__ == "__main__":
    _lossy_consume()
    from celery.__main__ import main

    sys.argv = ["celery", *sys.argv[1:]]
    main()
