"""The floor of a session fork (issue 48): what the kernel takes to copy a CPython process holding 100 MB.

``Session.fork()`` is designed (docs/architecture.md, "Forking a session") but not built yet. Whatever the pool
adds around it (the request, the steward's check, the copy's cgroup, its new channels), the copy itself is one
``fork()`` of the session's process and a ``SIGSTOP`` before the pool moves it: this measures exactly that, in a
plain interpreter, so that the target stated for the fork rests on a figure of this machine:

* ``fork_stop``: ``os.fork()`` in a process holding ``--mb`` MB (written, so resident), until the parent sees the
  copy stopped (``waitpid(WUNTRACED)``): the page tables copied, the copy scheduled once;
* ``fork_stop_empty``: the same in a fresh interpreter holding nothing more: the baseline, in the same run;
* ``first_write``: the copy then writes every page of the 100 MB once (a step that rewrites all its data): the
  copy-on-write faults a fork defers to the copy's own time, not the fork's.

    python bench/session_fork.py [--mb 100] [--runs 200] [--json FILE]

Each figure is the median and the 99th percentile in milliseconds, with the machine's load (``uptime``).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys

# Run in a fresh interpreter per case, so the baseline holds nothing of the other case's memory.
_CHILD = """
import json, os, signal, sys, time
mb, runs, write = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1"
held = bytearray(b"x") * (mb << 20)  # written: resident, as a session's data is
objects = [str(i) for i in range(100_000)] if mb else []  # and some Python objects, as a session's variables
times = []
for _ in range(runs):
    start = time.perf_counter_ns()
    pid = os.fork()
    if pid == 0:
        os.kill(os.getpid(), signal.SIGSTOP)
        if write:
            for offset in range(0, len(held), 4096):
                held[offset] = 0
        os._exit(0)
    os.waitpid(pid, os.WUNTRACED)
    stopped = time.perf_counter_ns()
    if write:
        os.kill(pid, signal.SIGCONT)
        os.waitpid(pid, 0)
        times.append((time.perf_counter_ns() - stopped) / 1e6)
    else:
        times.append((stopped - start) / 1e6)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
print(json.dumps(times))
"""


def _case(mb: int, runs: int, write: bool) -> list[float]:
    done = subprocess.run([sys.executable, "-c", _CHILD, str(mb), str(runs), "1" if write else "0"],
                          capture_output=True, text=True, check=True, timeout=600)
    times: list[float] = json.loads(done.stdout)
    return times


def _figures(times: list[float]) -> dict[str, float]:
    ordered = sorted(times)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return {"p50_ms": round(statistics.median(ordered), 3), "p99_ms": round(p99, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mb", type=int, default=100)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--json")
    args = parser.parse_args()
    load = subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()
    report = {
        "mb": args.mb, "runs": args.runs, "cpus": os.cpu_count(), "uptime": load,
        "fork_stop": _figures(_case(args.mb, args.runs, write=False)),
        "fork_stop_empty": _figures(_case(0, args.runs, write=False)),
        "first_write": _figures(_case(args.mb, max(args.runs // 10, 10), write=True)),
    }
    print(json.dumps(report, indent=1))
    if args.json:
        with open(args.json, "w") as file:
            json.dump(report, file)


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    main()
