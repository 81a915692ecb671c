"""Each node's pool counts reach Ray's metrics, tagged with its node: what Ray's Prometheus integration scrapes.

The series are read as Prometheus reads them, from each node's own metrics agent (its ``MetricsExportPort``
in Ray's node table), and compared with that node's entry of ``RayPool.stats()``: the node pool's own
stats event, asked through the pipe.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import ray
from prometheus_client.parser import text_string_to_metric_families

from pynox_ray import RayPool
from tests.harness.scrape import metrics_over_http

_DEADLINE = 60.0  # seconds for a count to reach Ray's export: the actor's 5 s, Ray's report (1 s here), load
_OUTCOMES = ("ok", "failed", "timeouts")


def _targets() -> dict[str, tuple[str, int]]:
    """Each alive node's metrics agent, as Ray's service discovery names it to Prometheus."""
    return {str(node["NodeID"]): (str(node["NodeManagerAddress"]), int(node["MetricsExportPort"]))
            for node in ray.nodes() if node["Alive"]}


def _pynox_samples(host: str, port: int, actor: str) -> list[tuple[str, dict[str, str], float]]:
    samples = []
    for family in text_string_to_metric_families(metrics_over_http(host, port, timeout=10)):
        for sample in family.samples:
            if sample.name.startswith("ray_pynox_") and sample.labels.get("actor") == actor:
                samples.append((sample.name, dict(sample.labels), float(sample.value)))
    return samples


def _counts(samples: list[tuple[str, dict[str, str], float]]) -> dict[str, float]:
    """Jobs by outcome, host calls and the latency histogram's count, as the node's stats event names them (a
    count not yet raised: 0)."""
    counts = dict.fromkeys((*_OUTCOMES, "host_calls", "durations"), 0.0)
    for name, labels, value in samples:
        if name == "ray_pynox_jobs_total" and labels["outcome"] in _OUTCOMES:
            counts[labels["outcome"]] = value
        elif name == "ray_pynox_host_calls_total":
            counts["host_calls"] = value
        elif name == "ray_pynox_job_duration_seconds_bucket" and labels["le"] == "+Inf":
            counts["durations"] = value
    return counts


def _expected(pool_stats: dict[str, Any]) -> dict[str, float]:
    return {**{name: float(pool_stats[name]) for name in (*_OUTCOMES, "host_calls")},
            "durations": float(pool_stats["duration_seconds"]["count"])}


def test_each_nodes_counts_reach_rays_metrics_tagged_with_its_node(node_ids: list[str]) -> None:
    def echo(text: str) -> str:
        return text

    with RayPool(workers=1) as pool:
        # Four at once spread two and two (test_runs_spread_over_both_nodes); one fails, one times out.
        codes = ["import time\ntime.sleep(0.3)", "import time\ntime.sleep(0.3)\nraise ValueError('no')",
                 "import time\ntime.sleep(0.3)", "while True:\n    pass"]
        threads = [threading.Thread(target=pool.run, args=(code,), kwargs={"timeout": "2s"}) for code in codes]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        # A session stays on one node: its steps (two host calls among them) make the nodes' counts differ.
        with pool.session(functions={"echo": echo}) as session:
            for _ in range(2):
                assert session.run("from pynox_host import echo\nprint(echo('x'))").ok
            session.run("1 / 0")
        nodes = {entry["node_id"]: entry for entry in pool.stats()["nodes"]}
        assert sorted(nodes) == sorted(node_ids)
        expected = {node: _expected(entry["pool"]) for node, entry in nodes.items()}
        assert all(sum(counts.values()) > 0 for counts in expected.values()), expected
        assert len({tuple(counts.values()) for counts in expected.values()}) == 2, expected  # a swap would show
        targets = _targets()
        deadline = time.monotonic() + _DEADLINE
        while True:
            seen = {node: _pynox_samples(*targets[node], nodes[node]["actor"]) for node in node_ids}
            exported = {node: _counts(samples) for node, samples in seen.items()}
            if exported == expected or time.monotonic() > deadline:
                break
            time.sleep(1)
        assert exported == expected
        for node, samples in seen.items():
            # Every series of a node's pool is on that node's own agent, with its node's ID.
            assert {labels["node_id"] for _, labels, _ in samples} == {node}
            other = next(peer for peer in node_ids if peer != node)
            assert not _pynox_samples(*targets[other], nodes[node]["actor"])
            names = {name for name, _, _ in samples}
            assert {"ray_pynox_workers", "ray_pynox_jobs_total", "ray_pynox_job_duration_seconds_bucket"} <= names
