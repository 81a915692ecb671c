"""RayPool.stats() adds node pools' stats events up: counts and gauges, histograms bucket by bucket.

Pure: the node pools' events are built by the pool's own Stats, as two nodes would send them.
"""

from __future__ import annotations

import msgspec
import pytest

from pynox.protocol import Result
from pynox.server.stats import Gauges, Stats
from pynox_ray.stats import summed as _summed

pytestmark = pytest.mark.pure


def _node(durations_us: list[int], busy: int, draining: bool, budget_kills: tuple[str, ...] = ()) -> dict[str, object]:
    stats = Stats(2, version="0.1.0")
    for tenant in budget_kills:
        stats.record_budget_kill(tenant)
    for us in durations_us:
        stats.record(Result(id=1, exit=0, duration_us=us, duration_ms=us // 1000, queue_us=100))
    gauges = Gauges(busy_workers=busy, queued=1, queue_capacity=6, in_flight=busy + 1, sessions_active=0,
                    max_sessions=16, draining=draining)
    return msgspec.to_builtins(stats.snapshot(None, gauges))


def test_two_nodes_add_up() -> None:
    one, two = _node([3_000, 3_000], busy=2, draining=False), _node([700_000], busy=1, draining=True)
    total = _summed([one, two])
    assert (total["jobs"], total["ok"], total["workers"], total["busy_workers"]) == (3, 3, 4, 3)
    assert (total["queued"], total["queue_capacity"], total["in_flight"]) == (2, 12, 5)
    assert total["draining"] is True and "pid" not in total and "version" not in total
    duration = total["duration_seconds"]
    assert duration["count"] == 3 and duration["le"] == one["duration_seconds"]["le"]  # type: ignore[index]
    assert duration["counts"][0] == 2 and duration["counts"][-1] == 3
    assert duration["sum"] == pytest.approx(0.706)
    assert _summed([])["duration_seconds"]["count"] == 0 and _summed([])["draining"] is False


def test_counts_by_a_key_add_up_key_by_key() -> None:
    """Errors by type and budget kills by tenant: each key's counts added, a key one node lacks kept."""
    one = _node([1_000], busy=0, draining=False, budget_kills=("ops", "ops", "web"))
    two = _node([1_000], busy=0, draining=False, budget_kills=("ops",))
    assert _summed([one, two])["budget_kills"] == {"ops": 3, "web": 1}
    assert _summed([])["budget_kills"] == {}
