"""Celery queues by kind of work (config/celery.py): each task goes to its queue, and the
shipped worker commands consume every queue (a deployment splits them with -Q)."""

from __future__ import annotations

from pathlib import Path

import pytest

from config.celery import QUEUES, app

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("task", "queue"),
    [
        ("telemetry.tasks.rollup_task", "rollups"),
        ("telemetry.tasks.partitions_maintain_task", "rollups"),
        ("billing.tasks.weekly_report_task", "reports"),
        ("alerts.tasks.alerts_evaluate_task", "alerts"),
        ("something.else", "celery"),
    ],
)
def test_each_task_goes_to_its_queue(task: str, queue: str) -> None:
    route = app.amqp.router.route({}, task)
    assert (route["queue"].name, route["queue"].routing_key) == (queue, queue)


def test_every_queue_is_declared_for_a_worker_without_q() -> None:
    declared = {q.name for q in app.conf.task_queues}
    assert declared == {"celery", *QUEUES}


def test_shipped_workers_consume_every_queue() -> None:
    for path in ("docker/compose.yml", "docker/systemd/gpufleet-worker.service"):
        text = (ROOT / path).read_text()
        assert " worker" in text or '"worker"' in text, path
        assert "-Q" not in text and "--queues" not in text, path
