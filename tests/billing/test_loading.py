"""What a computation loads for each GPU (``billing.selectors.loading._load``): read in one
query as plain values, with the timestamps as integer microseconds on PostgreSQL. Each fact
is checked against the model instance Django reads independently."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest

from billing.selectors.loading import _load
from billing.selectors.types import Filters
from tests.billing.conftest import FleetBuilder

# Timestamps with microseconds, one before the epoch's 2^31 seconds and one far after it.
IN_SERVICE = dt.datetime(2026, 3, 2, 5, 17, 3, 999_999, tzinfo=dt.UTC)
SEEN = dt.datetime(2026, 3, 20, 23, 59, 59, 1, tzinfo=dt.UTC)
RETIRED = dt.datetime(2041, 1, 19, 3, 14, 8, 123_456, tzinfo=dt.UTC)


@pytest.mark.smoke  # and on SQLite, where the timestamps come as Django reads them
def test_load_reads_each_gpu_as_its_model_does(fleet: FleetBuilder) -> None:
    north, south = fleet.site("north"), fleet.site("south", pue="1.2")
    infra, ml = fleet.team("infra"), fleet.team("ml")
    training = fleet.pool("training", site=north, team=ml)
    model = fleet.model("H200")
    # Site from the node over its pool's; team from the GPU over its pool's.
    on_pool = fleet.node("a1", pool=training)
    own_site = fleet.node("a2", pool=training, site=south)
    bare = fleet.node("b1")
    fleet.owned("pool:training", purchase_price="30000.00")
    gpus = [
        fleet.gpu(
            "GPU-a", node=on_pool, index=3, in_service_at=IN_SERVICE, last_seen_at=SEEN, model=model
        ),
        fleet.gpu("GPU-b", node=own_site, team=infra, first_seen_at=IN_SERVICE, retired_at=RETIRED),
        fleet.gpu("GPU-c", node=bare, index=None),
    ]
    loaded = _load(start=dt.date(2026, 3, 1), end=dt.date(2026, 4, 1), filters=Filters(), now=SEEN)
    a, b, c = (loaded.gpus[g.pk] for g in gpus)
    assert (a.label, b.label, c.label) == ("a1#3", "a2#0", "b1")
    assert (a.service_start, a.last_seen_at, a.retired_at) == (IN_SERVICE, SEEN, None)
    assert (b.service_start, b.retired_at) == (IN_SERVICE, RETIRED)  # first seen stands in
    assert c.service_start is None and c.last_seen_at is None
    assert (a.site_id, b.site_id, c.site_id) == (north.pk, south.pk, None)
    assert (a.team_id, b.team_id, c.team_id) == (ml.pk, infra.pk, None)
    assert (a.pool_id, c.pool_id) == (training.pk, None)
    assert (a.model_key, a.max_power_w, c.model_key, c.model_name) == ("H200", 700, "", "(none)")
    # The pool's profile: 30,000 / (5 × 8,766 h) + 0.10 opex while depreciating.
    assert a.rates[0] == Decimal("30000.00") / Decimal(5 * 8766) + Decimal("0.10")
    assert c.terms is None and c.rates[0] == 0
    assert loaded.names.nodes == {on_pool.pk: "a1", own_site.pk: "a2", bare.pk: "b1"}
    for gpu in gpus:  # the model instances agree, to the microsecond
        gpu.refresh_from_db()
        info = loaded.gpus[gpu.pk]
        assert info.service_start == (gpu.in_service_at or gpu.first_seen_at)
        assert (info.retired_at, info.last_seen_at) == (gpu.retired_at, gpu.last_seen_at)
