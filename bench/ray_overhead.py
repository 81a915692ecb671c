"""What RayPool costs over a local pynox.Pool on the same machine, and what a second node gives.

Starts a two-node Ray cluster on this machine (``ray.cluster_utils.Cluster``, one CPU each), then:

* per-job latency of ``print(1)``, run after run, on a local ``pynox.Pool(workers=1)`` and on a
  ``RayPool(workers=1, nodes=1)``, interleaved round by round so both see the same load: p50, p99, and
  the difference (RayPool's overhead per job);
* the same for a job that makes one host-function call (the call travels node -> caller -> node);
* throughput, jobs per second from 8 threads, on one node against two (``workers=1`` each): a job that
  waits 50 ms (it scales with nodes whatever the cores) and a job that computes for about 20 ms (it
  scales only as far as free cores allow: this machine has two, shared).

    python bench/ray_overhead.py [--runs 300] [--jobs 120] [--json results.json]

The machine is shared with other engineers' builds and tests: the load average is printed with the
figures, and they are from a loaded machine unless it says otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # no report leaves this machine

import ray
from ray.cluster_utils import Cluster

import pynox
from pynox_ray import RayPool

WAIT_CODE = "import time\ntime.sleep(0.05)"
COMPUTE_CODE = "total = 0\nfor i in range(600_000):\n    total += i\nprint(total)"


def percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def summary(samples: list[float]) -> dict[str, float]:
    return {"p50_ms": round(statistics.median(samples) * 1000, 2),
            "p99_ms": round(percentile(samples, 0.99) * 1000, 2)}


def timed(call: Callable[[], pynox.Result]) -> float:
    start = time.perf_counter()
    result = call()
    elapsed = time.perf_counter() - start
    assert result.ok, result.text
    return elapsed


def latency(local: pynox.Pool, remote: RayPool, runs: int, code: str,
            functions: dict[str, Callable[..., Any]] | None = None) -> dict[str, Any]:
    for _ in range(20):  # warm: templates forked, node pool started, Ray's connections open
        local.run(code, functions=functions)
        remote.run(code, functions=functions)
    local_times, remote_times = [], []
    for _ in range(runs):
        local_times.append(timed(lambda: local.run(code, functions=functions)))
        remote_times.append(timed(lambda: remote.run(code, functions=functions)))
    here, there = summary(local_times), summary(remote_times)
    return {"local": here, "ray": there,
            "overhead_p50_ms": round(there["p50_ms"] - here["p50_ms"], 2),
            "overhead_p99_ms": round(there["p99_ms"] - here["p99_ms"], 2)}


def throughput(pool: RayPool, code: str, jobs: int, threads: int = 8) -> float:
    return round(rate(pool, code, jobs, threads), 1)


def rate(pool: pynox.Pool, code: str, jobs: int, threads: int = 8) -> float:
    """Jobs per second of ``code`` on ``pool``, from ``threads`` threads taking ``jobs`` in turn (after 4 to warm)."""
    for _ in range(4):
        pool.run(code)
    left = iter(range(jobs))
    lock = threading.Lock()

    def worker() -> None:
        while True:
            with lock:
                if next(left, None) is None:
                    return
            result = pool.run(code)
            assert result.ok, result.text

    start = time.perf_counter()
    running = [threading.Thread(target=worker) for _ in range(threads)]
    for thread in running:
        thread.start()
    for thread in running:
        thread.join()
    return jobs / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=300, help="runs per latency case")
    parser.add_argument("--jobs", type=int, default=120, help="jobs per throughput case")
    parser.add_argument("--json", help="also write the figures to this file")
    options = parser.parse_args()
    if options.runs < 1 or options.jobs < 1:
        parser.error("--runs and --jobs must be at least 1")

    load_before = os.getloadavg()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    figures: dict[str, Any] = {}
    try:
        cluster.add_node(num_cpus=1)
        ray.init(address=cluster.address, log_to_driver=False)
        cluster.wait_for_nodes()
        with pynox.Pool(workers=1) as local, RayPool(workers=1, nodes=1) as one_node:
            figures["print(1)"] = latency(local, one_node, options.runs, "print(1)")
            figures["one host call"] = latency(local, one_node, options.runs,
                                               "from pynox_host import echo\necho(1)", {"echo": lambda x: x})
            figures["throughput, 50 ms wait, 1 node (jobs/s)"] = throughput(one_node, WAIT_CODE, options.jobs)
            figures["throughput, 20 ms compute, 1 node (jobs/s)"] = throughput(one_node, COMPUTE_CODE, options.jobs)
        with RayPool(workers=1, nodes=2) as two_nodes:
            figures["throughput, 50 ms wait, 2 nodes (jobs/s)"] = throughput(two_nodes, WAIT_CODE, options.jobs)
            figures["throughput, 20 ms compute, 2 nodes (jobs/s)"] = throughput(two_nodes, COMPUTE_CODE,
                                                                                 options.jobs)
    finally:
        ray.shutdown()
        cluster.shutdown()
    figures["conditions"] = {
        "machine": f"{os.cpu_count()} cores, shared with other engineers' work (a loaded machine)",
        "load average before, after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
        "cluster": "2 Ray nodes on this machine, num_cpus=1 each; workers=1 per node pool",
        "python": sys.version.split()[0], "ray": ray.__version__,
        "runs per latency case": options.runs, "jobs per throughput case": options.jobs,
    }
    text = json.dumps(figures, indent=2)
    print(text)
    if options.json:
        with open(options.json, "w") as file:
            file.write(text + "\n")


if __name__ == "__main__":
    main()
