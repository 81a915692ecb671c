"""Throughput of a local pynox.Pool against a RayPool on one node and on three, in one run, and how long a
node that joins the cluster takes to run a job.

Starts a three-node Ray cluster on this machine (``ray.cluster_utils.Cluster``, one CPU each), then, with
``workers=1`` per pool and 8 caller threads:

* jobs per second of ``print(1)`` and of a job that waits 50 ms: local ``Pool``, ``RayPool(nodes=1)``,
  ``RayPool(nodes=3)``, the three measured round by round (``--rounds``) so they see the same load;
* one host call per job, p50 latency, local against one node;
* where the time of a ``print(1)`` job goes: CPU milliseconds per job of the caller, of the node's actor and of
  the pool process, local against one node (from ``/proc``; the pool's templates and jobs are not counted);
* a fourth node added under a running ``RayPool``: seconds until its pool serves, and until a job ran there.

    python bench/ray_fleet.py [--jobs 150] [--rounds 3] [--json results.json]

The machine is shared with other engineers' builds and tests: the load average is printed with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from typing import Any

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # no report leaves this machine

import ray
from ray.cluster_utils import Cluster
from ray_overhead import rate  # type: ignore[import-not-found]  # run from bench/

import pynox
from pynox_ray import RayPool

CODES = {"print(1)": "print(1)", "50 ms wait": "import time\ntime.sleep(0.05)"}


def host_call_p50(pool: pynox.Pool, runs: int = 60) -> float:
    code, functions = "from pynox_host import echo\necho(1)", {"echo": lambda x: x}
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        assert pool.run(code, functions=functions).ok
        times.append(time.perf_counter() - start)
    return round(statistics.median(times) * 1000, 2)


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as file:
        fields = file.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as file:
        return int(file.read().rsplit(")", 1)[1].split()[1])


def cpu_per_job(pool: pynox.Pool, jobs: int) -> dict[str, float]:
    """CPU ms per ``print(1)`` job of this process, the node's actor (a RayPool's) and the pool process."""
    if isinstance(pool, RayPool):
        pool_pid = int(pool.stats()["nodes"][0]["pool"]["pid"])
        processes = {"actor": _parent(pool_pid), "pool": pool_pid}  # the actor started the pool
    else:
        processes = {"pool": int(pool.stats()["pid"])}
    before = {name: _cpu_seconds(pid) for name, pid in processes.items()}
    times = os.times()
    rate(pool, "print(1)", jobs)
    after = os.times()
    used = {name: _cpu_seconds(pid) - before[name] for name, pid in processes.items()}
    used["caller"] = after.user + after.system - times.user - times.system
    return {name: round(seconds * 1000 / jobs, 2) for name, seconds in sorted(used.items())}


def joined(cluster: Cluster, pool: RayPool) -> dict[str, float]:
    pool.run("print(1)")
    start = time.monotonic()
    node_id = str(cluster.add_node(num_cpus=1).node_id)
    added = time.monotonic() - start

    def serving() -> dict[str, Any] | None:
        return next((node for node in pool.stats()["nodes"] if node["node_id"] == node_id and node["serving"]), None)

    while serving() is None:
        time.sleep(0.05)
    ready = time.monotonic() - start
    while (serving() or {}).get("runs_sent", 0) == 0:
        threading.Thread(target=pool.run, args=("import time\ntime.sleep(0.3)",)).start()
        time.sleep(0.05)
    return {"add_node returned (s)": round(added, 2), "its pool serving (s)": round(ready, 2),
            "a job sent to it (s)": round(time.monotonic() - start, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=150, help="jobs per throughput measurement")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the three pools, interleaved")
    parser.add_argument("--json", help="also write the figures to this file")
    options = parser.parse_args()
    if options.jobs < 1 or options.rounds < 1:
        parser.error("--jobs and --rounds must be at least 1")

    load_before = os.getloadavg()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    figures: dict[str, Any] = {}
    try:
        for _ in range(2):
            cluster.add_node(num_cpus=1)
        ray.init(address=cluster.address, log_to_driver=False)
        cluster.wait_for_nodes()
        with pynox.Pool(workers=1) as local, RayPool(workers=1, nodes=1, watch=0) as one, \
                RayPool(workers=1, nodes=3, watch=0) as three:
            pools: dict[str, pynox.Pool] = {"local": local, "ray, 1 node": one, "ray, 3 nodes": three}
            for name, code in CODES.items():
                samples: dict[str, list[float]] = {pool: [] for pool in pools}
                for _ in range(options.rounds):
                    for pool_name, pool in pools.items():
                        samples[pool_name].append(rate(pool, code, options.jobs))
                rates = {pool: round(statistics.median(values), 1) for pool, values in samples.items()}
                rates["ray 1 node / local"] = round(rates["ray, 1 node"] / rates["local"], 2)
                figures[f"jobs/s, {name}"] = rates
            figures["one host call, p50 ms"] = {"local": host_call_p50(local), "ray, 1 node": host_call_p50(one)}
            figures["CPU ms per print(1) job"] = {"local": cpu_per_job(local, options.jobs * 2),
                                                  "ray, 1 node": cpu_per_job(one, options.jobs * 2)}
        with RayPool(workers=1) as following:
            figures["a node that joins"] = joined(cluster, following)
    finally:
        ray.shutdown()
        cluster.shutdown()
    figures["conditions"] = {
        "machine": f"{os.cpu_count()} cores, shared with other engineers' work (a loaded machine)",
        "load average before, after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
        "cluster": "3 Ray nodes on this machine (a 4th added), num_cpus=1 each; workers=1 per node pool; 8 threads",
        "python": sys.version.split()[0], "ray": ray.__version__, "jobs per measurement": options.jobs,
        "rounds": options.rounds,
    }
    text = json.dumps(figures, indent=2)
    print(text)
    if options.json:
        with open(options.json, "w") as file:
            file.write(text + "\n")


if __name__ == "__main__":
    main()
