"""The replica test refuses to copy a cluster too large, naming what fills it."""

from __future__ import annotations

import pytest

from tests.deploy import replica_support
from tests.deploy.replica_support import StandbyError, _cluster_size_check


def test_a_cluster_over_the_limit_is_refused_naming_its_largest_databases() -> None:
    gib = 2**30
    sizes = [("bench_y10k", 12 * gib), ("test_gpufleet", gib // 8), ("postgres", 7 * 2**20)]
    with pytest.raises(StandbyError) as caught:
        _cluster_size_check(sizes)
    message = str(caught.value)
    assert "12.13 GiB" in message and "bench_y10k 12.00 GiB" in message
    assert "test_gpufleet 0.12 GiB" in message and "drop" in message


def test_a_cluster_under_the_limit_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(replica_support, "STANDBY_MAX_CLUSTER_BYTES", 100)
    _cluster_size_check([("test_gpufleet", 60), ("postgres", 40)])  # 100: at the limit
    with pytest.raises(StandbyError):
        _cluster_size_check([("test_gpufleet", 61), ("postgres", 40)])
