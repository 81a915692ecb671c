"""Where a job's time goes: CPU, page faults and system calls per job, by process, on a real ``pynox pool``.

Runs ``--jobs`` trivial jobs (``print(1)``, ``--gap`` ms apart) through the JSON Lines protocol while the
kernel counts, per process role:

* ``server``: the ``pynox pool`` process (intake, workers, result writing);
* ``template``: the warm interpreter that forks the children (its own work only);
* ``children``: the job processes, counted through the template (``perf stat`` follows its forks);

with ``perf stat`` (task-clock, page-faults, context-switches) and, in a second pass, ``strace -c -f`` (system
calls, by name). Counts are divided by the number of jobs. Both tools slow the processes they watch: the
per-job counts are what matter, the wall time under them is not a latency figure (``latency.py`` gives those).

    python bench/breakdown.py [--jobs 300] [--gap 20] [--preload pandas] [--json breakdown.json]
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import time
from typing import Any

from latency import PoolDriver, children_of, process_name, save_json  # type: ignore[import-not-found]  # from bench/

PERF_EVENTS = "task-clock,page-faults,context-switches"


def template_of(server: int) -> int:
    """The worker's template: the server's child, or the zygote's when workers' templates are forked from it."""
    for child in children_of(server):
        if process_name(child) == "pynox-template":
            return child
        if process_name(child) == "pynox-zygote":
            for grandchild in children_of(child):
                if process_name(grandchild) == "pynox-template":
                    return grandchild
    raise RuntimeError("no pynox-template under the pool")


def run_jobs(pool: PoolDriver, jobs: int, gap: float) -> float:
    start = time.perf_counter()
    for _ in range(jobs):
        reply = pool.request({"code": "print(1)"})
        assert reply["exit"] == 0, reply
        time.sleep(gap)
    return time.perf_counter() - start


def watched(tool: list[str], pool: PoolDriver, jobs: int, gap: float) -> str:
    """Run ``jobs`` under ``tool`` (a perf or strace command line ending in its -p argument); its report."""
    watcher = subprocess.Popen(tool, stderr=subprocess.PIPE, text=True)
    time.sleep(1.0)  # attached
    run_jobs(pool, jobs, gap)
    time.sleep(0.3)  # the last child is reaped and a new one prepared: count it, as every job has one
    watcher.send_signal(signal.SIGINT)
    _, report = watcher.communicate(timeout=60)
    return report


def perf_counts(report: str) -> dict[str, float]:
    counts: dict[str, float] = {}
    for line in report.splitlines():
        match = re.match(r"\s*([\d,.]+)\s+(?:msec\s+)?([\w-]+)", line)
        if match and match.group(2) in ("task-clock", "page-faults", "context-switches"):
            counts[match.group(2)] = float(match.group(1).replace(",", ""))
    return counts


def strace_counts(report: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for line in report.splitlines():
        fields = line.split()
        # % time, seconds, usecs/call, calls, [errors], syscall
        if len(fields) >= 5 and fields[0][0].isdigit() and fields[-1].isidentifier() and fields[-1] != "total":
            counts[fields[-1]] = int(fields[3])
    return counts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--gap", type=float, default=20.0, help="milliseconds between jobs")
    parser.add_argument("--preload", default=None)
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    gap = args.gap / 1000
    pool = PoolDriver("--workers=1", *([f"--preload={args.preload}"] if args.preload else []))
    figures: dict[str, Any] = {"jobs": args.jobs, "gap_ms": args.gap, "preload": args.preload,
                               "load_average": os.getloadavg()}
    try:
        run_jobs(pool, 20, gap)  # warm
        server, template = pool.proc.pid, template_of(pool.proc.pid)
        per_role: dict[str, dict[str, float]] = {}
        # perf: the server alone (its threads), then the template with the children it forks (inherited).
        for role, pid, inherit in (("server", server, False), ("template+children", template, True)):
            command = ["perf", "stat", "-e", PERF_EVENTS, *([] if inherit else ["--no-inherit"]), "-p", str(pid)]
            counts = perf_counts(watched(command, pool, args.jobs, gap))
            per_role[role] = {name: value / args.jobs for name, value in counts.items()}
        command = ["perf", "stat", "-e", PERF_EVENTS, "--no-inherit", "-p", str(template)]
        counts = perf_counts(watched(command, pool, args.jobs, gap))
        per_role["template"] = {name: value / args.jobs for name, value in counts.items()}
        per_role["children"] = {name: per_role["template+children"][name] - per_role["template"].get(name, 0.0)
                                for name in per_role["template+children"]}
        figures["perf_per_job"] = per_role
        calls: dict[str, dict[str, float]] = {}
        for role, pid, follow in (("server", server, False), ("template+children", template, True)):
            command = ["strace", "-c", "-q", *(["-f"] if follow else []), "-p", str(pid)]
            if not follow:  # every thread of the server
                command = ["strace", "-c", "-q", *[arg for tid in os.listdir(f"/proc/{pid}/task")
                                                   for arg in ("-p", tid)]]
            counted = strace_counts(watched(command, pool, args.jobs, gap))
            calls[role] = {name: count / args.jobs for name, count in sorted(counted.items(),
                                                                            key=lambda item: -item[1])}
        figures["syscalls_per_job"] = calls
    finally:
        pool.close()
    for role, counts in figures["perf_per_job"].items():
        print(f"{role:18} cpu {counts.get('task-clock', 0):6.3f} ms  faults {counts.get('page-faults', 0):7.1f}  "
              f"switches {counts.get('context-switches', 0):5.1f}  per job")
    for role, counted in figures["syscalls_per_job"].items():
        total = sum(counted.values())
        top = ", ".join(f"{name} {count:.1f}" for name, count in list(counted.items())[:14])
        print(f"{role:18} {total:6.1f} syscalls per job: {top}")
    if args.json:
        save_json(figures, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
