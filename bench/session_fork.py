"""The floor of a session fork (issue 48): what the kernel takes to copy a CPython process holding 100 MB.

``Session.fork()`` is built (docs/architecture.md, "Forking a session"): ``pool_fork`` times it. Whatever the pool
adds around it (the request, the steward's check, the copy's cgroup, its new channels), the copy itself is one
``fork()`` of the session's process and a ``SIGSTOP`` before the pool moves it: this measures exactly that, in a
plain interpreter, so that the target stated for the fork rests on a figure of this machine:

* ``fork_stop``: ``os.fork()`` in a process holding ``--mb`` MB (written, so resident), until the parent sees the
  copy stopped (``waitpid(WUNTRACED)``): the page tables copied, the copy scheduled once;
* ``fork_stop_empty``: the same in a fresh interpreter holding nothing more: the baseline, in the same run;
* ``first_write``: the copy then writes every page of the 100 MB once (a step that rewrites all its data): the
  copy-on-write faults a fork defers to the copy's own time, not the fork's;
* ``double_fork``: the design's copy (docs/architecture.md): the process forks C1, C1 forks the copy and exits,
  the copy waits until it is orphaned to S (a child subreaper, as the session's template is to be) and stops
  itself; from S's go until S sees the copy stopped. Two page-table copies, not one;
* ``double_fork_gated``: the same under the job's own seccomp filter, each fork let through by the pool's own
  ``Steward`` in an armed ``ForkWindow`` (server/fork_gate.py), timed from the arming.

* ``pool_fork``: ``Session.fork()`` through a real pool (the Python client, the pool process, the fork step, the
  copy checked, put in its cgroups and adopted, the answer), for a session holding ``--mb`` MB, from the call to
  its return; each copy is closed before the next fork, off the clock. ``pool_fork_empty``: the same for a
  session holding nothing, and ``pool_step``: a step (``pass``) of the same session, the baselines in the run.

    python bench/session_fork.py [--mb 100] [--runs 200] [--pool-runs 40] [--json FILE]

S polls for the stopped copy every 0.2 ms: the double-fork figures carry up to that much more.

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


# S (a child subreaper) and P, as in tests/sandbox/test_fork_gate.py; P holds the memory and double-forks.
_DOUBLE = """
import ctypes, json, os, select, signal, socket, sys, time
mb, runs, gated = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1"
libc = ctypes.CDLL(None, use_errno=True)
libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
ours, theirs = socket.socketpair()
if gated:
    from pynox.config import landlock_abi_from_environment
    from pynox.policy.seccomp import compile_filter, install
    from pynox.server.fork_gate import ForkWindow
    from pynox.server.steward import Steward
    compiled = compile_filter("none", landlock_abi_from_environment() or 1, session=True)
p = os.fork()
if p == 0:
    try:
        ours.close()
        held = bytearray(b"x") * (mb << 20)
        objects = [str(i) for i in range(100_000)] if mb else []
        if gated:
            libc.prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS
            listener = install(compiled)
            socket.send_fds(theirs, [b"L"], [listener])
            os.close(listener)
        for _ in range(runs):
            theirs.sendall(b"a")
            theirs.recv(1)
            c1 = os.fork()
            if c1 == 0:
                born_of = os.getpid()
                if os.fork() == 0:
                    while os.getppid() == born_of:
                        os.sched_yield()
                    os.kill(os.getpid(), signal.SIGSTOP)
                os._exit(0)
            os.waitpid(c1, 0)
            theirs.recv(1)
    finally:
        os._exit(0)
theirs.close()
steward = None
if gated:
    _, fds, _, _ = socket.recv_fds(ours, 1, 1)
    steward = Steward(fds[0], [], os.getuid(), os.getgid())
times = []
for _ in range(runs):
    ours.recv(1)
    start = time.perf_counter_ns()
    if steward is not None:
        steward.forks = ForkWindow(p, 10.0)
    ours.sendall(b"k")
    while True:
        if steward is not None and select.select([steward.listener], [], [], 0.0002)[0]:
            steward.answer()
        elif steward is None:
            time.sleep(0.0002)
        pid, status = os.waitpid(-1, os.WUNTRACED | os.WNOHANG)
        if pid and os.WIFSTOPPED(status):
            times.append((time.perf_counter_ns() - start) / 1e6)
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            break
    ours.sendall(b"n")
os.waitpid(p, 0)
print(json.dumps(times))
"""


def _double(mb: int, runs: int, gated: bool) -> list[float]:
    done = subprocess.run([sys.executable, "-c", _DOUBLE, str(mb), str(runs), "1" if gated else "0"],
                          capture_output=True, text=True, check=True, timeout=600)
    times: list[float] = json.loads(done.stdout)
    return times


def _case(mb: int, runs: int, write: bool) -> list[float]:
    done = subprocess.run([sys.executable, "-c", _CHILD, str(mb), str(runs), "1" if write else "0"],
                          capture_output=True, text=True, check=True, timeout=600)
    times: list[float] = json.loads(done.stdout)
    return times


def _pool(mb: int, runs: int) -> tuple[list[float], list[float]]:
    """Times of ``Session.fork()`` and of a plain step, on a session holding ``mb`` MB."""
    import time

    from pynox import Pool

    forks: list[float] = []
    steps: list[float] = []
    with Pool(workers=1, max_sessions=4) as pool, pool.session(memory=f"{mb + 256}m", timeout="60s") as session:
        session.run(f"held = bytearray(b'x') * ({mb} << 20)\nobjects = [str(i) for i in range({100_000 if mb else 0})]"
                    ).raise_for_error()
        for _ in range(runs):
            start = time.perf_counter_ns()
            session.run("pass").raise_for_error()
            steps.append((time.perf_counter_ns() - start) / 1e6)
            start = time.perf_counter_ns()
            copy = session.fork()
            forks.append((time.perf_counter_ns() - start) / 1e6)
            copy.close()
    return forks, steps


def _figures(times: list[float]) -> dict[str, float]:
    ordered = sorted(times)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return {"p50_ms": round(statistics.median(ordered), 3), "p99_ms": round(p99, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mb", type=int, default=100)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--pool-runs", type=int, default=40)
    parser.add_argument("--pool-only", action="store_true", help="only the pool's figures")
    parser.add_argument("--json")
    args = parser.parse_args()
    if args.pool_only:
        load = subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()
        forks, steps = _pool(args.mb, args.pool_runs)
        empty, _ = _pool(0, args.pool_runs)
        print(json.dumps({"mb": args.mb, "runs": args.pool_runs, "uptime": load, "pool_fork": _figures(forks),
                          "pool_fork_empty": _figures(empty), "pool_step": _figures(steps)}, indent=1))
        return
    load = subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()
    report = {
        "mb": args.mb, "runs": args.runs, "cpus": os.cpu_count(), "uptime": load,
        "fork_stop": _figures(_case(args.mb, args.runs, write=False)),
        "fork_stop_empty": _figures(_case(0, args.runs, write=False)),
        "first_write": _figures(_case(args.mb, max(args.runs // 10, 10), write=True)),
        "double_fork": _figures(_double(args.mb, args.runs, gated=False)),
        "double_fork_gated": _figures(_double(args.mb, args.runs, gated=True)),
        "double_fork_gated_empty": _figures(_double(0, args.runs, gated=True)),
    }
    forks, steps = _pool(args.mb, args.pool_runs)
    report["pool_fork"], report["pool_step"] = _figures(forks), _figures(steps)
    report["pool_fork_empty"] = _figures(_pool(0, args.pool_runs)[0])
    print(json.dumps(report, indent=1))
    if args.json:
        with open(args.json, "w") as file:
            json.dump(report, file)


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    main()
