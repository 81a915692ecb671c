"""What a worker's template pays to fork: ``fork()`` itself, its faults, and the memory each fork copies.

Starts ``pynox pool --workers=1`` (this checkout's, and with ``--compare CHECKOUT`` that checkout's too,
interleaved round by round so that both see the same load), runs 20 ``print(1)`` jobs to warm it, then
``--jobs`` more (``--gap`` s apart) while the kernel reports on the worker's template:

* ``fork()``: the time from the template's ``clone`` system call entering to it returning, from the
  ``syscalls:sys_enter_clone``/``sys_exit_clone`` tracepoints (``perf record``): median, 10th and 90th
  percentile over every fork of the round;
* the template's own CPU and page faults per job (``perf stat --no-inherit``), and those of its children
  (``perf stat`` following its forks, minus the template's own);
* once the jobs are done and the next children prepared: the template's private anonymous memory
  (``Anonymous`` of ``smaps_rollup``), page tables (``VmPTE``), number of mappings, and the proportional set size
  of the template, of each child prepared ahead and of the zygote.

Absolute times move with the machine's load (printed with each round); the counts and the ratios between the
two pools of one round do not.

    python bench/template_fork.py [--rounds 4] [--jobs 400] [--gap 0.01] [--compare CHECKOUT]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import tempfile
import time
from typing import Any

from breakdown import template_of  # type: ignore[import-not-found]  # run from bench/
from latency import PoolDriver, descendants, process_name  # type: ignore[import-not-found]  # run from bench/
from prepared_memory import page_tables_kb, smaps_rollup  # type: ignore[import-not-found]  # run from bench/

CLONE = "syscalls:sys_enter_clone,syscalls:sys_exit_clone"
STAT = "task-clock,page-faults"


def _mappings(pid: int) -> int:
    with open(f"/proc/{pid}/maps") as maps:
        return sum(1 for _ in maps)


def _stat(report: str) -> dict[str, float]:
    counts = {}
    for line in report.splitlines():  # -x, lines: value,unit,event,...
        fields = line.split(",")
        if len(fields) > 2 and fields[0].replace(".", "", 1).isdigit():
            counts[fields[2]] = float(fields[0])
    return counts


def _fork_durations_us(data: str) -> list[float]:
    script = subprocess.run(["perf", "script", "-i", data, "-F", "time,event"], capture_output=True, text=True,
                            check=True).stdout
    durations, entered = [], None
    for line in script.splitlines():
        match = re.match(r"\s*([\d.]+):\s+(\S+)", line)
        if match is None:
            continue
        at, event = float(match.group(1)), match.group(2)
        if "enter" in event:
            entered = at
        elif entered is not None:
            durations.append((at - entered) * 1e6)
            entered = None
    return durations


def measure(source: str | None, jobs: int, gap: float) -> dict[str, Any]:
    pool = PoolDriver("--workers=1", source=source)
    try:
        for _ in range(20):
            assert pool.request({"code": "print(1)"})["exit"] == 0
        template = template_of(pool.proc.pid)
        with tempfile.TemporaryDirectory() as tmp:
            data = os.path.join(tmp, "perf.data")
            tools = [
                subprocess.Popen(["perf", "record", "-q", "-o", data, "-e", CLONE, "--no-inherit", "-p",
                                  str(template)], stderr=subprocess.DEVNULL),
                subprocess.Popen(["perf", "stat", "-x,", "--no-inherit", "-e", STAT, "-p", str(template)],
                                 stderr=subprocess.PIPE, text=True),
                subprocess.Popen(["perf", "stat", "-x,", "-e", STAT, "-p", str(template)],
                                 stderr=subprocess.PIPE, text=True),
            ]
            time.sleep(1.0)  # attached
            for _ in range(jobs):
                assert pool.request({"code": "print(1)"})["exit"] == 0
                time.sleep(gap)
            time.sleep(0.3)  # the last child reaped and the next prepared: counted, as every job has them
            for tool in tools:
                tool.send_signal(signal.SIGINT)
            tools[0].wait(timeout=60)
            own = _stat(tools[1].communicate(timeout=60)[1])
            with_children = _stat(tools[2].communicate(timeout=60)[1])
            forks = _fork_durations_us(data)
        time.sleep(0.5)  # the children prepared after the last job are confined and wait
        below = descendants(pool.proc.pid)
        ready = [pid for pid in descendants(template) if process_name(pid) == "pynox-ready"]
        zygotes = [pid for pid in below if process_name(pid) == "pynox-zygote"]
        rollup = smaps_rollup(template)
        return {
            "forks": len(forks),
            "fork_us_p10": round(statistics.quantiles(forks, n=10)[0], 1),
            "fork_us_p50": round(statistics.median(forks), 1),
            "fork_us_p90": round(statistics.quantiles(forks, n=10)[-1], 1),
            "template_cpu_ms_per_job": round(own["task-clock"] / jobs, 3),
            "template_faults_per_job": round(own["page-faults"] / jobs, 1),
            "children_faults_per_job": round((with_children["page-faults"] - own["page-faults"]) / jobs, 1),
            "template_and_children_cpu_ms_per_job": round(with_children["task-clock"] / jobs, 3),
            "template_anonymous_kb": rollup["Anonymous"],
            "template_page_tables_kb": page_tables_kb(template),
            "template_mappings": _mappings(template),
            "template_pss_kb": rollup["Pss"],
            "prepared_pss_kb": [smaps_rollup(pid)["Pss"] for pid in ready],
            "zygote_pss_kb": [smaps_rollup(pid)["Pss"] for pid in zygotes],
            "load": round(os.getloadavg()[0], 1),
        }
    finally:
        pool.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--jobs", type=int, default=400)
    parser.add_argument("--gap", type=float, default=0.01, help="seconds between jobs (0: back to back)")
    parser.add_argument("--compare", metavar="CHECKOUT", help="another checkout's pool, interleaved")
    args = parser.parse_args()
    pools = {"this": None, **({os.path.basename(args.compare.rstrip("/")): args.compare} if args.compare else {})}
    for _ in range(args.rounds):
        for name, source in pools.items():
            print(json.dumps({"pool": name, **measure(source, args.jobs, args.gap)}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
