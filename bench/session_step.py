"""Where a session step's CPU goes: per step, by process, this checkout's pool beside other checkouts'.

Each pool (``--workers=1``) opens one session and runs ``--rounds`` rounds of 20 steps (``x += 1``, ``--gap``
ms apart), the pools interleaved round by round so that each sees the same machine load. Per step:

* CPU time, from the kernel's scheduler statistics (``/proc/<pid>/task/<tid>/schedstat``: nanoseconds on a CPU,
  per thread, so the pool's intake thread and the session's thread are told apart): the pool server (its intake
  thread, the session's thread, the others), its templates, and the session's process;
* minor faults and context switches of the server and of the session's process;
* the median over rounds of each round's CPU ratio (this checkout / the other), which holds better under load
  than the ratio of the totals;
* with ``--strace``, a second pass: system calls per step by name, of the server (every thread) and of the
  session's process (``strace -c -f``). Counts hold under load; the CPU figures do not: compare them only
  within one run, and say the load (printed) beside them.

    python bench/session_step.py [--rounds 40] [--gap 10] [--strace] [--json FILE] CHECKOUT [CHECKOUT ...]

A CHECKOUT is another tree of this repository (``git archive REV | tar -x -C DIR``, with the built
``_confine*.so`` copied in if that revision has ``_confine.c``).
"""

from __future__ import annotations

import argparse
import collections
import os
import signal
import statistics
import subprocess
import sys
import time
from typing import Any

from breakdown import strace_counts  # type: ignore[import-not-found]  # run from bench/
from latency import PoolDriver, descendants, process_name, save_json  # type: ignore[import-not-found]

STEP = {"session": "bench", "code": "x += 1"}
ROUND = 20


def _read(path: str) -> str:
    with open(path) as file:
        return file.read()


def _thread_ns(pid: int, tid: str) -> int:
    return int(_read(f"/proc/{pid}/task/{tid}/schedstat").split()[0])


def counters(server: int, step_thread: int | None) -> collections.Counter[str]:
    """The pool's counters now: CPU ns by role, faults and switches of the server and the session's process."""
    counts: collections.Counter[str] = collections.Counter()
    for tid in os.listdir(f"/proc/{server}/task"):
        try:
            role = "intake" if int(tid) == server else "session thread" if int(tid) == step_thread else "other"
            counts[f"server {role} cpu_us"] += _thread_ns(server, tid)
        except OSError:
            pass  # the thread ended
    for pid in [server, *descendants(server)]:
        try:
            role = "server" if pid == server else process_name(pid)
            if role != "server":
                counts[f"{role} cpu_us"] += sum(_thread_ns(pid, tid) for tid in os.listdir(f"/proc/{pid}/task"))
            fields = _read(f"/proc/{pid}/stat").rpartition(")")[2].split()
            counts[f"{role} minflt"] += int(fields[7])
            for line in _read(f"/proc/{pid}/status").splitlines():
                if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                    counts[f"{role} switches"] += int(line.split()[1])
        except OSError:
            pass  # gone between the listing and the read
    return counts


def step_thread_of(pool: PoolDriver) -> int | None:
    """The server thread that serves the session's steps: the one whose CPU grows most over a few steps."""
    server = pool.proc.pid
    before = {tid: _thread_ns(server, tid) for tid in os.listdir(f"/proc/{server}/task") if int(tid) != server}
    for _ in range(10):
        pool.request(STEP)
    grown = {tid: _thread_ns(server, tid) - ns for tid, ns in before.items()
             if os.path.exists(f"/proc/{server}/task/{tid}")}
    return int(max(grown, key=lambda tid: grown[tid])) if grown else None


def measure(pools: dict[str, PoolDriver], rounds: int, gap: float) -> dict[str, Any]:
    threads = {name: step_thread_of(pool) for name, pool in pools.items()}
    totals = {name: collections.Counter[str]() for name in pools}
    per_round: dict[str, list[int]] = {name: [] for name in pools}
    latency: dict[str, list[float]] = {name: [] for name in pools}
    for _ in range(rounds):
        for name, pool in pools.items():
            before = counters(pool.proc.pid, threads[name])
            for _ in range(ROUND):
                time.sleep(gap)
                start = time.perf_counter()
                reply = pool.request(STEP)
                latency[name].append((time.perf_counter() - start) * 1000)
                assert reply["exit"] == 0, reply
            after = counters(pool.proc.pid, threads[name])
            delta = {key: after[key] - before.get(key, 0) for key in after}
            totals[name].update(delta)
            per_round[name].append(sum(value for key, value in delta.items() if key.endswith("cpu_us")))
    steps = rounds * ROUND
    figures: dict[str, Any] = {}
    for name in pools:
        row = {key: round(value / steps / (1000 if key.endswith("cpu_us") else 1), 2)
               for key, value in sorted(totals[name].items())}
        row["all cpu_us"] = round(sum(v for k, v in row.items() if k.endswith("cpu_us")), 1)
        row["p50_ms"] = round(statistics.median(latency[name]), 3)
        figures[name] = row
    this = per_round["this"]
    for name in pools:
        if name != "this":
            ratios = sorted(mine / theirs for mine, theirs in zip(this, per_round[name], strict=True) if theirs)
            figures[f"this/{name} cpu, median of rounds"] = round(statistics.median(ratios), 3)
    return figures


def syscalls(pools: dict[str, PoolDriver], steps: int, gap: float) -> dict[str, Any]:
    """strace -c of the server (every thread) and of the session's process, over ``steps`` steps, per step."""
    figures: dict[str, Any] = {}
    for name, pool in pools.items():
        server = pool.proc.pid
        session = next(pid for pid in descendants(server) if process_name(pid) == "pynox-session")
        watchers = {
            "server": subprocess.Popen(["strace", "-c", "-q", "-f", "-p", str(server)], stderr=subprocess.PIPE,
                                       text=True),
            "session": subprocess.Popen(["strace", "-c", "-q", "-p", str(session)], stderr=subprocess.PIPE,
                                        text=True),
        }
        time.sleep(1.0)  # attached
        for _ in range(steps):
            time.sleep(gap)
            assert pool.request(STEP)["exit"] == 0
        time.sleep(0.3)
        for role, watcher in watchers.items():
            watcher.send_signal(signal.SIGINT)
            _, report = watcher.communicate(timeout=60)
            counted = strace_counts(report)
            figures[f"{name} {role}"] = {"total": round(sum(counted.values()) / steps, 2),
                                         **{call: round(count / steps, 2) for call, count in
                                            sorted(counted.items(), key=lambda item: -item[1])}}
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkouts", nargs="+", metavar="CHECKOUT")
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--gap", type=float, default=10.0, help="milliseconds between steps")
    parser.add_argument("--strace", action="store_true", help="also count system calls per step (a second pass)")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    gap = args.gap / 1000
    pools = {"this": PoolDriver("--workers=1")}
    for checkout in args.checkouts:
        pools[os.path.basename(checkout.rstrip("/"))] = PoolDriver("--workers=1", source=checkout)
    results: dict[str, Any] = {"load_average_before": [round(load, 2) for load in os.getloadavg()]}
    try:
        for pool in pools.values():
            assert pool.request({**STEP, "code": "x = 0", "open": True})["exit"] == 0
            for _ in range(20):
                pool.request(STEP)
        results["per_step"] = measure(pools, args.rounds, gap)
        if args.strace:
            results["syscalls_per_step"] = syscalls(pools, args.rounds * ROUND // 2, gap)
    finally:
        for pool in pools.values():
            pool.close()
    results["load_average_after"] = [round(load, 2) for load in os.getloadavg()]
    rows = [name for name in results["per_step"] if not name.startswith("this/")]
    keys = sorted({key for name in rows for key in results["per_step"][name]})
    print(f"per step, load {results['load_average_before']} -> {results['load_average_after']}")
    print(f"{'':32}" + "".join(f"{name:>16}" for name in rows))
    for key in keys:
        print(f"{key:32}" + "".join(f"{results['per_step'][name].get(key, 0):>16}" for name in rows))
    for name, ratio in results["per_step"].items():
        if name.startswith("this/"):
            print(f"{name}: {ratio}")
    for name, counted in results.get("syscalls_per_step", {}).items():
        print(f"{name:24} " + ", ".join(f"{call} {count}" for call, count in counted.items()))
    if args.json:
        save_json(results, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
