"""Which rejected samples the agent keeps for a later push: by the server's reject ``code``
(docs/ingest.md, "Responses"), and by the wording of a server too old to send codes."""

from __future__ import annotations

from typing import Any

import pytest

from telemetry.agent.client import _retryable


@pytest.mark.parametrize(
    ("reject", "keep"),
    [
        ({"field": "gpu", "error": "anything", "code": "unknown_gpu"}, True),
        ({"field": "start", "error": "anything", "code": "clock_ahead"}, True),
        ({"field": "instance", "error": "anything", "code": "unknown_instance"}, True),
        ({"field": "gpu", "error": "unknown GPU: …", "code": "other_node"}, False),
        ({"field": "gpu", "error": "unknown GPU: …", "code": "not_registered"}, False),
        ({"field": "start", "error": "older than …", "code": "too_old"}, False),
        ({"field": "util_pct", "error": "must be …", "code": "invalid"}, False),
        # No code: the wording of servers before codes.
        ({"field": "gpu", "error": "unknown GPU: list it in the push's gpus block"}, True),
        ({"field": "start", "error": "the interval ends … ahead of the server"}, True),
        ({"field": "gpu", "error": "this GPU belongs to another node"}, False),
    ],
)
def test_retryable_by_code_then_by_wording(reject: dict[str, Any], keep: bool) -> None:
    assert _retryable(reject) is keep


def test_the_server_codes_a_later_push_can_fix_are_the_ones_the_agent_keeps() -> None:
    """The agent's list and the server's meaning agree (the agent imports nothing of the
    server, so the two constants are compared here)."""
    from telemetry.agent.client import RETRYABLE_CODES
    from telemetry.wire import REJECT_CLOCK_AHEAD, REJECT_UNKNOWN_GPU, REJECT_UNKNOWN_INSTANCE

    assert {REJECT_UNKNOWN_GPU, REJECT_CLOCK_AHEAD, REJECT_UNKNOWN_INSTANCE} == RETRYABLE_CODES
