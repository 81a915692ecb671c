"""A fleet's stats: its node pools' stats events added up as one."""

from __future__ import annotations

from typing import Any

from pynox.transport import STATS_FIELDS

__all__ = ["summed"]

# A node pool's own, not added up: each is in its node's entry.
_PER_NODE = ("id", "event", "pid", "version")


# Counts by a key (an error's type, a tenant's name): added key by key.
_BY_KEY = ("errors", "budget_kills")


def summed(counters: list[dict[str, Any]]) -> dict[str, Any]:
    """Node pools' stats events as one: every count and gauge added, errors by type and budget kills by tenant
    merged, histograms added bucket by bucket, the longest uptime, draining if any node drains."""
    totals: dict[str, Any] = {name: 0 for name in STATS_FIELDS if name not in _PER_NODE}
    for name in _BY_KEY:
        totals[name] = {}
    totals["draining"] = False
    for name in ("duration_seconds", "queue_seconds"):
        totals[name] = {"le": [], "counts": [], "count": 0, "sum": 0.0}
    for one in counters:
        for name, value in one.items():
            if name in _PER_NODE:
                continue
            if name in _BY_KEY:
                for key, count in value.items():
                    totals[name][key] = totals[name].get(key, 0) + count
            elif name == "uptime_ms":
                totals[name] = max(totals[name], value)
            elif isinstance(value, bool):
                totals[name] = bool(totals[name]) or value
            elif isinstance(value, dict) and "le" in value:
                _add_histogram(totals[name], value)
            elif isinstance(value, int | float):
                totals[name] = totals.get(name, 0) + value
    return {"event": "stats", **totals}


def _add_histogram(total: dict[str, Any], one: dict[str, Any]) -> None:
    if not total["le"]:
        total["le"], total["counts"] = list(one["le"]), [0] * len(one["le"])
    if total["le"] != one["le"]:  # a node of another version counts in other buckets: it cannot be added
        return
    total["counts"] = [a + b for a, b in zip(total["counts"], one["counts"], strict=True)]
    total["count"] += one["count"]
    total["sum"] += one["sum"]
