"""The agent's fake fleet (no Django, so it keeps its own model table) and the server's GPU
model catalogue must agree: every fake GPU name maps to the catalogue entry with the same
nominal max and idle power, so the demo's break-even falls back to the right figures."""

from __future__ import annotations

import pytest

from fleet.catalogue import catalogue_match
from telemetry.agent.fake import MODELS


@pytest.mark.parametrize("key", sorted(MODELS))
def test_fake_models_match_the_catalogue(key):
    fake = MODELS[key]
    entry = catalogue_match(fake.name)
    assert entry is not None, f"{fake.name!r} is not in fleet/catalogue.py"
    assert (entry.max_power_w, entry.idle_power_w) == (fake.max_w, fake.idle_w)
