"""What this machine charges for the steps every job takes, whatever Pynox does: the floors under its figures.

Each figure is measured here, without the pool, so that docs/performance.md can say which part of a job's
time is the design's and which is the machine's:

* a pipe round trip between two processes, back to back and with 20 ms of idleness before each (an idle CPU
  of a VM sleeps, and waking it is part of every hop between processes);
* a page fault per 4 KiB page: copy-on-write after ``fork()`` (what a child pays for each page of its
  template it writes), a fresh zero page, and a write that faults nothing (the baseline);
* ``os.fork()`` of an interpreter holding what a template holds (Pynox's pool modules and msgspec): the
  parent's time in the call, and the child's time and faults until its first statement;
* the skeleton of the pool server: a JSON Lines echo with one intake thread handing each line to a worker
  thread (as ``pynox pool`` does), 20 ms apart, timed by a client over pipes.

    python bench/floors.py [--runs 300] [--json floors.json]
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import resource
import statistics
import subprocess
import sys
import time
from typing import Any

from latency import report  # type: ignore[import-not-found]  # run as a script from bench/

_PAGES = 10_000
_ECHO_SERVER = r"""
import os, queue, select, threading, msgspec
lines = queue.Queue()
def worker():
    while True:
        request = msgspec.json.decode(lines.get())
        os.write(1, msgspec.json.encode({"id": request["id"], "exit": 0, "stdout": "1\n"}) + b"\n")
threading.Thread(target=worker, daemon=True).start()
os.write(1, b'{"event": "ready"}\n')
pending = b""
while True:
    select.select([0], [], [])
    chunk = os.read(0, 65536)
    if not chunk:
        break
    pending += chunk
    while b"\n" in pending:
        line, pending = pending.split(b"\n", 1)
        lines.put(line)
"""


def summary_us(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {"p50_us": round(statistics.median(ordered), 1),
            "p99_us": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))], 1), "runs": len(ordered)}


def pipe_round_trip(runs: int, idle: float) -> dict[str, float]:
    ping_r, ping_w = os.pipe()
    pong_r, pong_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(ping_w)
        os.close(pong_r)
        while byte := os.read(ping_r, 1):
            os.write(pong_w, byte)
        os._exit(0)
    os.close(ping_r)
    os.close(pong_w)
    samples = []
    for _ in range(runs):
        if idle:
            time.sleep(idle)
        start = time.perf_counter_ns()
        os.write(ping_w, b"x")
        os.read(pong_r, 1)
        samples.append((time.perf_counter_ns() - start) / 1000)
    os.close(ping_w)
    os.waitpid(pid, 0)
    return summary_us(samples)


def page_faults() -> dict[str, float]:
    """Microseconds per page written, in a child: copy-on-write, a fresh zero page, and no fault."""
    shared = mmap.mmap(-1, _PAGES * 4096, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    for page in range(_PAGES):
        shared[page * 4096] = 1
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        def per_page(memory: mmap.mmap, value: int) -> float:
            start = time.perf_counter()
            for page in range(_PAGES):
                memory[page * 4096] = value
            return (time.perf_counter() - start) / _PAGES * 1e6
        fresh = mmap.mmap(-1, _PAGES * 4096, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        measured = {"copy_on_write_us": per_page(shared, 2), "zero_page_us": per_page(fresh, 2),
                    "no_fault_us": per_page(fresh, 3)}
        os.write(write, json.dumps({key: round(value, 2) for key, value in measured.items()}).encode())
        os._exit(0)
    os.close(write)
    figures: dict[str, float] = json.loads(os.read(read, 4096))
    os.close(read)
    os.waitpid(pid, 0)
    return figures


def template_sized_fork(runs: int) -> dict[str, float]:
    """fork() of this interpreter once it holds a template's modules: the parent's call, the child's start."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "packages", "pynox-core", "src"))
    import gc

    import pynox.template.fork_server  # type: ignore[import-untyped]  # noqa: F401  - a template's modules, a heap of its size

    gc.collect()
    gc.freeze()
    parent, child, faults = [], [], []
    for _ in range(runs):
        read, write = os.pipe()
        start = time.perf_counter_ns()
        pid = os.fork()
        if pid == 0:
            started = time.perf_counter_ns()
            os.write(write, json.dumps([(started - start) / 1000,
                                        resource.getrusage(resource.RUSAGE_SELF).ru_minflt]).encode())
            os._exit(0)
        parent.append((time.perf_counter_ns() - start) / 1000)
        os.close(write)
        child_us, child_faults = json.loads(os.read(read, 4096))
        os.close(read)
        os.waitpid(pid, 0)
        child.append(child_us)
        faults.append(child_faults)
        time.sleep(0.005)
    return {"parent_p50_us": round(statistics.median(parent), 1),
            "child_start_p50_us": round(statistics.median(child), 1), "child_faults_p50": statistics.median(faults),
            "runs": runs}


def echo_server(runs: int) -> dict[str, float]:
    """The pool server's skeleton (intake thread -> worker thread -> result line), 20 ms apart."""
    server = subprocess.Popen([sys.executable, "-c", _ECHO_SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert server.stdin is not None and server.stdout is not None
    server.stdout.readline()
    samples = []
    for index in range(runs):
        time.sleep(0.02)
        start = time.perf_counter_ns()
        server.stdin.write(json.dumps({"id": index, "code": "print(1)"}).encode() + b"\n")
        server.stdin.flush()
        json.loads(server.stdout.readline())
        samples.append((time.perf_counter_ns() - start) / 1000)
    server.stdin.close()
    server.wait(timeout=10)
    return summary_us(samples)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    results: dict[str, dict[str, Any]] = {
        "pipe round trip, back to back": pipe_round_trip(args.runs, 0.0),
        "pipe round trip, 20 ms idle before": pipe_round_trip(args.runs, 0.02),
        "page fault per page": page_faults(),
        "echo server via a worker thread, 20 ms apart": echo_server(args.runs),
        "fork of a template-sized interpreter": template_sized_fork(max(args.runs // 10, 20)),
        "machine": {"cpus": os.cpu_count(), "load_average_after": [round(x, 2) for x in os.getloadavg()]},
    }
    report(results, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
