"""A spaced ``print(1)`` job's path in a prepared child, from the server's ``HandOver`` to the report written.

Copies each checkout's ``packages/pynox-core/src`` (this one's, and any ``--compare`` checkout's) to a temporary
directory and adds marks to the copy: each reads ``CLOCK_MONOTONIC`` and the process's minor faults
(``getrusage``) at a point of the path, so each job's segments are read in one clock across the server and the
child. The points:

* the server, just before it sends the ``HandOver`` frame (server/templates.py): written to a file of its own;
* the child: its job's descriptors received (after the frame's read: the Python path's ``recv_raw``, the native
  path's whole ``take_job``), placed (``_await_job`` returned), the job read (the READ step), ``execute`` entered,
  the code about to be compiled, to run, run, the outputs flushed and the report written; the child writes its
  marks on its stderr after the report (the job's result carries them; they are not part of its output otherwise).

The copies' pools (one worker each) run ``--per`` jobs a round, ``--gap`` ms apart, the pools interleaved round by
round (the order reversed every other round), after 20 jobs to warm each. Prints each segment's p50 in µs and its
faults (p50, mean). A mark costs ~1 µs and no fault once warm (the warm-up runs the marks inside ``execute``); it
stays a copy's: the checkout itself is untouched. A mark whose anchor is not in a checkout's source fails the
copy: the anchors are this tree's, and an older checkout may lack some (its segments are then left out).

    python bench/child_path.py [--compare CHECKOUT] [--gaps 10,20] [--rounds 8] [--per 20]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from latency import PoolDriver

ROOT = Path(__file__).resolve().parent.parent

_MARKS = '''
import os, resource, time
_usage, _clock = resource.getrusage, time.monotonic_ns
MARKS = [0] * 24
def mark(i):
    MARKS[2 * i] = _clock()
    MARKS[2 * i + 1] = _usage(0).ru_minflt
def dump():
    os.write(2, ("@@marks %d %s\\n" % (os.getpid(), " ".join(map(str, MARKS)))).encode())
mark(0)
_SERVER = os.environ.get("PYNOX_BENCH_MARKS")
_server = os.open(_SERVER, os.O_WRONLY | os.O_APPEND | os.O_CREAT) if _SERVER else -1
def server(pid):
    if _server >= 0:
        os.write(_server, b"%d %d\\n" % (pid, _clock()))
'''
_M = "__import__('pynox._bench_marks')._bench_marks"
# Each mark's alternatives, (file, anchor, what replaces it), the first found taken: this tree's, and an older one's
# (before the native hand-over, before the job's path after READ was one function).
_PATCHES = [
    [("server/templates.py", "                send_frame(prepared.control, HandOver(),",
      f"                {_M}.server(prepared.pid)\n                send_frame(prepared.control, HandOver(),")],
    [("job/child.py", "        if take_job(*args):\n",
      f"        taken = take_job(*args)\n        {_M}.mark(0)\n        if taken:\n")],
    [("job/child.py", "            _, fds = recv_raw(control_socket)\n",
      f"            _, fds = recv_raw(control_socket)\n        {_M}.mark(0)\n")],
    [("job/child.py", "    _await_job(setup)\n", f"    _await_job(setup)\n    {_M}.mark(1)\n")],
    [("job/child.py", "    _run_or_serve(confinement, setup.payload)\n",
      f"    {_M}.mark(2)\n    _run_or_serve(confinement, setup.payload)\n"),
     ("job/child.py", "    payload = _ready_or_fail(setup, failure or run_steps(setup, READ))\n",
      f"    payload = _ready_or_fail(setup, failure or run_steps(setup, READ))\n    {_M}.mark(2)\n")],
    [("job/execute.py", "    sys.argv = [name, *args]\n", f"    {_M}.mark(3)\n    sys.argv = [name, *args]\n")],
    [("job/execute.py", "    if not return_value:\n        body = compile(",
      f"    {_M}.mark(4)\n    if not return_value:\n        body = compile(")],
    [("job/execute.py", "        exec(body, namespace)\n",
      f"        {_M}.mark(5)\n        exec(body, namespace)\n        {_M}.mark(6)\n")],
    [("job/report.py", "    write_report(report_fd, report, prefix)\n",
      f"    {_M}.mark(7)\n    write_report(report_fd, report, prefix)\n    {_M}.mark(8)\n    {_M}.dump()\n")],
]
# Segments: (name, from mark, to mark); -1 is the server's send.
SEGMENTS = [("the server's send -> descriptors received", -1, 0), ("received -> placed", 0, 1),
            ("placed -> the job read", 1, 2), ("read -> execute()", 2, 3), ("execute() -> compile", 3, 4),
            ("compile", 4, 5), ("exec", 5, 6), ("exec -> flushed", 6, 7), ("flushed -> report written", 7, 8),
            ("the server's send -> report written", -1, 8), ("received -> report written", 0, 8)]


def marked_copy(checkout: Path, into: Path) -> tuple[Path, list[str]]:
    """``checkout``'s core sources with the marks; and the anchors it did not have."""
    src = into / "packages" / "pynox-core" / "src"
    shutil.copytree(checkout / "packages" / "pynox-core" / "src", src)
    package = src / "pynox"
    (package / "_bench_marks.py").write_text(_MARKS)
    missing = []
    for alternatives in _PATCHES:
        for name, anchor, replacement in alternatives:
            path = package / name
            text = path.read_text()
            if text.count(anchor) == 1:
                path.write_text(text.replace(anchor, replacement))
                break
        else:
            missing.append(" or ".join(f"{name}: {anchor.strip()[:50]}" for name, anchor, _ in alternatives))
    return into, missing


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compare", type=Path, help="another checkout, interleaved with this one")
    parser.add_argument("--gaps", default="10,20", help="ms between jobs, comma-separated")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--per", type=int, default=20, help="jobs per pool per round")
    args = parser.parse_args()
    gaps = [float(gap) for gap in args.gaps.split(",")]
    checkouts = {"this": ROOT, **({"other": args.compare.resolve()} if args.compare else {})}
    with tempfile.TemporaryDirectory(prefix="pynox-child-path-") as scratch:
        pools, servers = {}, {}
        try:
            for label, checkout in checkouts.items():
                copy, missing = marked_copy(checkout, Path(scratch) / label)
                if missing:
                    print(f"{label}: no anchor for {missing} (its segments are left out)", file=sys.stderr)
                servers[label] = Path(scratch) / f"{label}-server.txt"
                os.environ["PYNOX_BENCH_MARKS"] = str(servers[label])
                pools[label] = PoolDriver("--workers=1", source=str(copy))
            print("load average before", os.getloadavg())
            for pool in pools.values():
                for _ in range(20):
                    pool.request({"code": "print(1)"})
            rows: dict[tuple[str, float], list[list[int]]] = {(label, gap): [] for label in pools for gap in gaps}
            for round_ in range(args.rounds):
                for gap in gaps:
                    for label in (list(pools) if round_ % 2 == 0 else list(pools)[::-1]):
                        for _ in range(args.per):
                            time.sleep(gap / 1000)
                            result = pools[label].request({"code": "print(1)"})
                            found = [line for line in result.get("stderr", "").splitlines()
                                     if line.startswith("@@marks ")]
                            if found:
                                rows[(label, gap)].append([int(word) for word in found[0].split()[1:]])
            print("load average after", os.getloadavg())
        finally:
            for pool in pools.values():
                pool.close()
        for label in pools:
            sent = {}
            if servers[label].exists():
                for line in servers[label].read_text().splitlines():
                    pid, at = map(int, line.split())
                    sent[pid] = at
            for gap in gaps:
                print(f"{label}, {gap:g} ms apart, {len(rows[(label, gap)])} jobs: p50 µs, faults p50 / mean")
                for name, start, end in SEGMENTS:
                    times, faults = [], []
                    for row in rows[(label, gap)]:
                        pid, marks = row[0], row[1:]
                        if start == -1 and pid not in sent:
                            continue
                        t0 = sent[pid] if start == -1 else marks[2 * start]
                        f0 = None if start == -1 else marks[2 * start + 1]
                        if not t0 or not marks[2 * end]:
                            continue
                        times.append((marks[2 * end] - t0) / 1000)
                        if f0 is not None:
                            faults.append(marks[2 * end + 1] - f0)
                    if times:
                        counted = (f"{statistics.median(faults):5.1f} / {statistics.mean(faults):5.1f}" if faults
                                   else "    -")
                        print(f"  {name:42s} {statistics.median(times):8.1f}   {counted}")


if __name__ == "__main__":
    main()
