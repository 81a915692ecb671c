"""A node pool's counters and gauges, exported through Ray's metrics (``ray.util.metrics``), tagged by node.

Ray's Prometheus integration scrapes each node's metrics agent (the targets are in Ray's service-discovery
file); what a Ray worker records with ``ray.util.metrics`` is served there as ``ray_<name>``, beside Ray's
own series and with Ray's tags (``NodeAddress``, ``SessionName``, ``WorkerId``). The actor that owns a
node's pool records that pool's stats event here: so an operator who scrapes Ray already has every
node's Pynox series, each with the ``node_id`` of its node and the ``actor`` of its pool (two RayPools on
one node are two actors), and no scrape target to add per node.

The names are the metrics socket's (``pynox.server.metrics``, docs/protocol.md), under Ray's prefix.
Counters are Ray counters fed the increase since the last stats event (Ray counters only go up; a new
pool, after :meth:`NodeMetrics.restart`, counts from zero), so a counter with no increase yet has no
sample. The latency histograms are their series as Prometheus names them (``_bucket`` with ``le``, ``_sum``,
``_count``), each a gauge holding the pool's cumulative count: Ray's exporter appends ``_total`` to a
counter's name, which would hide them from ``histogram_quantile``, and a gauge keeps the name.

Where Ray runs without its metrics agent (``pip install ray`` without ``[default]``), Ray drops what is
recorded: nothing fails, and the node's pool serves as before.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from ray.util.metrics import Counter, Gauge

__all__ = ["NodeMetrics"]

_log = logging.getLogger(__name__)
_TAGS = ("node_id", "actor")

# Gauges: the stats event's field, the metric's name, its help.
_GAUGES = (
    ("workers", "pynox_workers", "Workers (concurrent jobs) of the node's pool."),
    ("busy_workers", "pynox_workers_busy", "Workers of the node's pool running a job now."),
    ("queued", "pynox_queue_depth", "Accepted jobs waiting for a worker on the node's pool."),
    ("queue_capacity", "pynox_queue_capacity", "Jobs that may wait on the node's pool before intake stops."),
    ("in_flight", "pynox_in_flight", "Requests the node's pool accepted and has not answered yet."),
    ("sessions_active", "pynox_sessions_active", "Sessions open on the node's pool now."),
    ("max_sessions", "pynox_sessions_max", "The most sessions the node's pool opens at once."),
    ("draining", "pynox_draining", "1 once the node's pool drains: accepted work finishes, no more is read."),
)
# Counters without labels of their own: the stats event's field, the metric's name, its help.
_COUNTERS = (
    ("host_calls", "pynox_host_calls_total", "Host-function calls the node's pool relayed to the caller."),
    ("template_restarts", "pynox_template_restarts_total", "Worker templates the node's pool started to replace "
                                                           "one that died or broke."),
    ("sessions_opened", "pynox_sessions_opened_total", "Sessions the node's pool started."),
    ("sessions_closed", "pynox_sessions_closed_total", "Sessions the node's pool ended, for any reason."),
    ("sessions_expired", "pynox_sessions_expired_total", "Sessions the node's pool closed for being idle."),
)
_OUTCOMES = ("ok", "failed", "timeouts", "signals", "setup_errors", "request_errors", "worker_errors", "cancelled")
_HISTOGRAMS = (
    ("duration_seconds", "pynox_job_duration_seconds", "How long each job ran on the node's pool"),
    ("queue_seconds", "pynox_queue_wait_seconds", "How long each job waited for a worker on the node's pool"),
)


class NodeMetrics:
    """The Ray metrics of one node's pool: :meth:`record` its stats events, :meth:`restart` for a new pool."""

    def __init__(self, node_id: str, actor: str) -> None:
        self._tags = {"node_id": node_id, "actor": actor}
        self._seen: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        self._gauges = {name: Gauge(name, description=text, tag_keys=_TAGS) for _, name, text in _GAUGES}
        self._counters: dict[str, Counter] = {name: Counter(name, description=text, tag_keys=_TAGS)
                                              for _, name, text in _COUNTERS}
        self._counters["pynox_jobs_total"] = Counter(
            "pynox_jobs_total", description="Results the node's pool wrote, by outcome.",
            tag_keys=(*_TAGS, "outcome"))
        self._counters["pynox_errors_total"] = Counter(
            "pynox_errors_total", description="Results of the node's pool by error type.", tag_keys=(*_TAGS, "type"))
        for _, name, text in _HISTOGRAMS:
            self._gauges[f"{name}_bucket"] = Gauge(f"{name}_bucket", description=f"{text}: jobs of at most le "
                                                   "seconds, since the pool started.", tag_keys=(*_TAGS, "le"))
            self._gauges[f"{name}_sum"] = Gauge(f"{name}_sum", description=f"{text}: seconds in all, since the "
                                                "pool started.", tag_keys=_TAGS)
            self._gauges[f"{name}_count"] = Gauge(f"{name}_count", description=f"{text}: jobs, since the pool "
                                                  "started.", tag_keys=_TAGS)

    def restart(self) -> None:
        """The node's pool is a new one: its counters start again from zero."""
        self._seen.clear()

    def record(self, stats: Mapping[str, Any]) -> None:
        """A stats event of the node's pool (the protocol's, as a dict): every gauge set, every counter raised
        by what it counted since the event before."""
        try:
            for field, name, _ in _GAUGES:
                self._gauges[name].set(float(stats.get(field, 0)), tags=self._tags)
            for field, name, _ in _COUNTERS:
                self._count(name, stats.get(field, 0))
            for outcome in _OUTCOMES:
                self._count("pynox_jobs_total", stats.get(outcome, 0), outcome=outcome)
            for error_type, count in dict(stats.get("errors") or {}).items():
                self._count("pynox_errors_total", count, type=str(error_type))
            for field, name, _ in _HISTOGRAMS:
                histogram = stats.get(field) or {}
                for bound, count in zip(histogram.get("le", ()), histogram.get("counts", ()), strict=False):
                    self._gauges[f"{name}_bucket"].set(float(count), tags={**self._tags, "le": repr(float(bound))})
                count = float(histogram.get("count", 0))
                self._gauges[f"{name}_bucket"].set(count, tags={**self._tags, "le": "+Inf"})
                self._gauges[f"{name}_sum"].set(float(histogram.get("sum", 0.0)), tags=self._tags)
                self._gauges[f"{name}_count"].set(count, tags=self._tags)
        except (TypeError, ValueError) as exc:  # a pool of another version sent another shape: not worth its pool
            _log.warning("pynox-ray: a stats event could not be exported to Ray's metrics: %s", exc)

    def _count(self, name: str, total: object, **labels: str) -> None:
        if isinstance(total, bool) or not isinstance(total, int | float):
            return
        key = (name, tuple(sorted(labels.items())))
        increase = float(total) - self._seen.get(key, 0.0)
        if increase <= 0:  # nothing new (a Ray counter takes only increases)
            return
        self._seen[key] = float(total)
        self._counters[name].inc(increase, tags={**self._tags, **labels})
