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


class _Recorder:
    """What Ray's metric classes were given, by metric name and tags: counters summed, gauges as last set."""

    def __init__(self) -> None:
        self.values: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}

    def classes(self) -> tuple[type, type]:
        values = self.values

        class Metric:
            def __init__(self, name: str, description: str = "", tag_keys: tuple[str, ...] = ()) -> None:
                self.name, self.tag_keys = name, tag_keys

            def _key(self, tags: dict[str, str]) -> tuple[str, tuple[tuple[str, str], ...]]:
                assert set(tags) == set(self.tag_keys), (self.name, tags)
                return self.name, tuple(sorted(tags.items()))

        class Counter(Metric):
            def inc(self, value: float, tags: dict[str, str]) -> None:
                assert value > 0, "Ray refuses a counter's increase of 0 or less"
                values[self._key(tags)] = values.get(self._key(tags), 0.0) + value

        class Gauge(Metric):
            def set(self, value: float, tags: dict[str, str]) -> None:
                values[self._key(tags)] = value

        return Counter, Gauge

    def get(self, name: str, **labels: str) -> float | None:
        return self.values.get((name, tuple(sorted({"node_id": "n1", "actor": "a1", **labels}.items()))))


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> _Recorder:
    """Ray's metric classes replaced by a recorder: what a node's actor would hand Ray, read back."""
    import pynox_ray.metrics

    recorder = _Recorder()
    counter, gauge = recorder.classes()
    monkeypatch.setattr(pynox_ray.metrics, "Counter", counter)
    monkeypatch.setattr(pynox_ray.metrics, "Gauge", gauge)
    return recorder


def test_ray_metrics_follow_a_node_pools_stats_events(recorded: _Recorder) -> None:
    from pynox_ray.metrics import NodeMetrics

    metrics = NodeMetrics("n1", "a1")
    metrics.record(_node([3_000], busy=1, draining=False))
    metrics.record(_node([3_000], busy=1, draining=False))  # the same totals again: nothing added
    later = _node([3_000, 700_000, 700_000], busy=2, draining=True, budget_kills=("ops",))
    metrics.record(later)
    assert recorded.get("pynox_jobs_total", outcome="ok") == 3 and recorded.get("pynox_workers_busy") == 2
    assert recorded.get("pynox_jobs_total", outcome="failed") is None  # never raised: no sample, as in Ray
    assert recorded.get("pynox_draining") == 1.0 and recorded.get("pynox_workers") == 2
    assert recorded.get("pynox_job_duration_seconds_bucket", le="+Inf") == 3
    assert recorded.get("pynox_job_duration_seconds_sum") == pytest.approx(1.403)
    assert recorded.get("pynox_job_duration_seconds_bucket", le=repr(float(later["duration_seconds"]["le"][0]))) == 1  # type: ignore[index]
    # A new pool on the node (restarted at the fleet's ABI cap) counts from zero: its counts are added on top.
    metrics.restart()
    metrics.record(_node([3_000], busy=0, draining=False))
    assert recorded.get("pynox_jobs_total", outcome="ok") == 4
    assert recorded.get("pynox_job_duration_seconds_bucket", le="+Inf") == 1  # a gauge: the pool's own count


def test_a_stats_event_of_another_shape_is_not_exported_and_raises_nothing(recorded: _Recorder,
                                                                           caplog: pytest.LogCaptureFixture) -> None:
    from pynox_ray.metrics import NodeMetrics

    NodeMetrics("n1", "a1").record({"workers": "two", "ok": 1})
    assert "could not be exported to Ray's metrics" in caplog.text
