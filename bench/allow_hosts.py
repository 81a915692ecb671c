"""What a TCP connection costs under ``allow_hosts`` (the pool connects the job's socket for it) against a plain
granted network (the job's own ``connect``), and what the pool's name resolution adds to a job.

Each round runs two jobs on one pool, alternately: one with ``allow_network=True`` and one with
``allow_hosts`` listing a loopback listener. Each job connects ``--connects`` times to the listener,
blocking and then non-blocking, and times each ``connect`` inside the job (``perf_counter``), so the
figures are the call itself, not the job around it. The listener accepts in a thread and closes.

Also: ``print(1)`` with ``allow_hosts=["localhost:<port>"]`` against ``print(1)`` with the network, 10 ms
apart: what resolving a name once per job and installing the pinned resolver cost.

    python bench/allow_hosts.py [--rounds 40] [--connects 50] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import threading
import time
from typing import Any

from host_calls import emit  # type: ignore[import-not-found]  # run from bench/
from latency import PoolDriver, check_ok, summary  # type: ignore[import-not-found]

CONNECTS = """
import json, select, socket, time
blocking, nonblocking = [], []
for _ in range({n}):
    s = socket.socket()
    start = time.perf_counter()
    s.connect(("127.0.0.1", {port}))
    blocking.append((time.perf_counter() - start) * 1e6)
    s.close()
for _ in range({n}):
    s = socket.socket()
    s.setblocking(False)
    start = time.perf_counter()
    s.connect_ex(("127.0.0.1", {port}))
    select.select([], [s], [], 5)
    nonblocking.append((time.perf_counter() - start) * 1e6)
    s.close()
print(json.dumps([blocking, nonblocking]))
"""


def _listen() -> socket.socket:
    server = socket.create_server(("127.0.0.1", 0), backlog=512)

    def accept() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            conn.close()

    threading.Thread(target=accept, daemon=True).start()
    return server


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--connects", type=int, default=50)
    parser.add_argument("--json")
    args = parser.parse_args()
    server = _listen()
    port = server.getsockname()[1]
    grants = {"network": {"allow_network": True}, "hosts": {"allow_hosts": [f"127.0.0.1:{port}"]}}
    named = {"network": {"allow_network": True}, "hosts": {"allow_hosts": [f"localhost:{port}"]}}
    driver = PoolDriver("--workers=1")
    load_before = os.getloadavg()
    connects: dict[str, dict[str, list[float]]] = {kind: {"blocking": [], "non-blocking": []} for kind in grants}
    jobs: dict[str, list[float]] = {kind: [] for kind in grants}
    code = CONNECTS.format(n=args.connects, port=port)
    for _ in range(3):  # warm-up
        for grant in grants.values():
            check_ok(driver.request({"code": code, **grant}))
    for _ in range(args.rounds):
        for kind, grant in grants.items():
            reply = driver.request({"code": code, **grant})
            check_ok(reply)
            blocking, nonblocking = json.loads(reply["stdout"])
            connects[kind]["blocking"] += blocking
            connects[kind]["non-blocking"] += nonblocking
        for kind, grant in named.items():
            time.sleep(0.01)
            start = time.perf_counter()
            check_ok(driver.request({"code": "print(1)", **grant}))
            jobs[kind].append((time.perf_counter() - start) * 1000)
    driver.close()
    server.close()
    results: dict[str, Any] = {"load before": load_before, "load after": os.getloadavg(),
                               "connects per figure": args.rounds * args.connects}
    for mode in ("blocking", "non-blocking"):
        figures = {kind: {"p50_us": round(statistics.median(samples[mode]), 1),
                          "p99_us": round(statistics.quantiles(samples[mode], n=100)[98], 1)}
                   for kind, samples in connects.items()}
        figures["hosts - network, p50"] = round(figures["hosts"]["p50_us"] - figures["network"]["p50_us"], 1)
        results[f"connect to loopback, {mode}, inside the job"] = figures
    job_figures = {kind: summary(samples) for kind, samples in jobs.items()}
    job_figures["hosts - network, p50"] = round(job_figures["hosts"]["p50_ms"] - job_figures["network"]["p50_ms"], 3)
    results["print(1) 10 ms apart, allow_hosts=[localhost:port] vs allow_network"] = job_figures
    emit(results, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
