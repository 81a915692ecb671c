"""What host calls add to a job, in the same run as plain jobs, beside a plain unix-socket round trip.

A host call travels job → pool → client → pool → job: two round trips between processes, through the
pool's worker (which reads the call) and its intake (which reads the client's reply and writes the answer).
Three kinds of job run on each pool: ``print(1)`` (plain), a job that makes one host call and prints its
answer (call), and one that makes ten calls in a row (calls10). Each round runs, on each pool, a short
block of each kind in turn, so that all see the same machine load; the first job of a block is not timed
(the child prepared ahead of it was confined for the other kind, and is replaced: see
server/prepared.py), so every timed job starts in a child prepared for it, as a stream of like jobs does.
A call's cost is the difference of medians: ``call_adds_p50_ms`` (call - plain, the first call of a fresh
child and the channel's set-up) and ``per_call_adds_p50_ms`` ((calls10 - plain) / 10). The CPU per job is
what the pool's processes were charged (the pool process, its templates, and the children they reaped,
from /proc), over blocks of one kind of job, so it holds under load as latency does not. The baseline is
one round trip over a unix socketpair between two processes, 10 ms apart and back to back.

The job's own side of the path is also timed apart from the pool's, in children forked from a process
prepared as a template is (``prepare_template``, ``gc.freeze``), each rehearsing as a child prepared ahead
does (``pynox_host.warm_up(calls=2)``) and then timing, with its page faults: ``pynox_host``'s installation
(the job's setup), ``from pynox_host import f``, and three calls whose answers are already waiting (no
wake-up in them): ``job side`` in the output, medians over ``--children`` children (for the compared
checkout too, run in a process of its own).

``--compare CHECKOUT`` runs another checkout's pool (a ``git worktree`` of the previous main, say, with its
native extension built: ``pip install -e packages/pynox-core`` there, or a copy of this checkout's
``_confine*.so``, as ``PYNOX_NATIVE=1`` needs it) in the same rounds.

    python bench/host_calls.py [--runs 400] [--block 5] [--children 80] [--compare CHECKOUT] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from typing import Any

from latency import PoolDriver, check_ok, summary  # type: ignore[import-not-found]  # run from bench/

PLAIN = {"code": "print(1)"}
CALL = {"code": "from pynox_host import f\nprint(f(1))", "functions": ["f"]}
CALLS10 = {"code": "from pynox_host import f\nfor n in range(9):\n    f(n)\nprint(f(1))", "functions": ["f"]}
KINDS = {"plain": PLAIN, "call": CALL, "calls10": CALLS10}
_TICK = os.sysconf("SC_CLK_TCK")


def _read(path: str) -> str:
    with open(path) as file:
        return file.read()


def cpu_ticks(pid: int, *, reaped: bool = True) -> int:
    """utime + stime of ``pid``, and with ``reaped`` cutime + cstime: the CPU of the children it reaped."""
    fields = _read(f"/proc/{pid}/stat").rpartition(")")[2].split()
    return sum(int(value) for value in fields[11:15 if reaped else 13])


def pool_cpu(pid: int) -> int:
    """The pool's CPU ticks: its own, and each live template's with the jobs it reaped, a template forked from
    the zygote included (a template replaced meanwhile takes its count with it: the blocks are many, and the
    median is taken)."""
    ticks = cpu_ticks(pid, reaped=False)  # a template the pool reaped is counted no more: see below
    children = set()
    for task in os.listdir(f"/proc/{pid}/task"):  # a template is the child of the thread that started it
        try:
            children.update(_read(f"/proc/{pid}/task/{task}/children").split())
        except OSError:
            pass  # the thread ended
    for child in children:
        try:
            ticks += cpu_ticks(int(child))
            if _read(f"/proc/{child}/comm").strip() == "pynox-zygote":  # the templates it forked are its children
                for template in _read(f"/proc/{child}/task/{child}/children").split():
                    ticks += cpu_ticks(int(template))
        except OSError:
            pass  # gone between the two reads
    return ticks


def emit(results: dict[str, Any], path: str | None) -> None:
    """Print the figures, and write them to ``path`` too if one was given (--json)."""
    text = json.dumps(results, indent=2)
    print(text)
    if path:
        with open(path, "w") as out:
            out.write(text + "\n")


def socket_round_trip(runs: int, pause: float) -> dict[str, float]:
    """One byte there and back over a unix socketpair, between this process and a forked echo."""
    ours, theirs = socket.socketpair()
    pid = os.fork()
    if pid == 0:
        ours.close()
        while data := theirs.recv(64):
            theirs.sendall(data)
        os._exit(0)
    theirs.close()
    samples = []
    for _ in range(runs):
        if pause:
            time.sleep(pause)
        start = time.perf_counter()
        ours.sendall(b"x")
        ours.recv(64)
        samples.append((time.perf_counter() - start) * 1000)
    ours.close()
    os.waitpid(pid, 0)
    return summary(samples)


def _job(pool: PoolDriver, message: dict[str, Any]) -> float:
    start = time.perf_counter()
    reply = pool.request(message, on_call=lambda call: call["args"][0])
    took = (time.perf_counter() - start) * 1000
    check_ok(reply)
    assert reply["stdout"] == "1\n", reply
    return took


def measure(pools: dict[str, PoolDriver], runs: int, pause: float, block: int) -> dict[str, Any]:
    """``runs`` timed jobs of each kind on each pool, in rounds of one block per kind and pool (the first
    job of a block untimed), ``pause`` seconds before each job."""
    samples: dict[str, dict[str, list[float]]] = {name: {kind: [] for kind in KINDS} for name in pools}
    for pool in pools.values():  # warm every path (and the prepared children) first
        for _ in range(5):
            for message in KINDS.values():
                _job(pool, message)
    for _ in range(-(-runs // (block - 1))):
        for name, pool in pools.items():
            for kind, message in KINDS.items():
                for index in range(block):
                    if pause:
                        time.sleep(pause)
                    took = _job(pool, message)
                    if index:
                        samples[name][kind].append(took)
    figures: dict[str, Any] = {}
    for name, kinds in samples.items():
        plain, call, calls10 = (summary(kinds[kind][:runs]) for kind in KINDS)
        figures[name] = {"plain": plain, "call": call, "calls10": calls10,
                         "call_adds_p50_ms": round(call["p50_ms"] - plain["p50_ms"], 3),
                         "per_call_adds_p50_ms": round((calls10["p50_ms"] - plain["p50_ms"]) / 10, 3)}
    return figures


def cpu_per_job(pools: dict[str, PoolDriver], blocks: int, size: int) -> dict[str, Any]:
    """CPU ms per job of each kind, over ``blocks`` interleaved blocks of ``size`` jobs each, back to back."""
    ticks: dict[str, dict[str, list[float]]] = {name: {kind: [] for kind in KINDS} for name in pools}
    for _ in range(blocks):
        for name, pool in pools.items():
            for kind, message in KINDS.items():
                before = pool_cpu(pool.proc.pid)
                for _ in range(size):
                    _job(pool, message)
                ticks[name][kind].append((pool_cpu(pool.proc.pid) - before) * 1000 / _TICK / size)
    return {name: {kind: round(statistics.median(values), 2) for kind, values in kinds.items()}
            | {"call_adds_ms": round(statistics.median(kinds["call"]) - statistics.median(kinds["plain"]), 2),
               "per_call_adds_ms": round((statistics.median(kinds["calls10"]) - statistics.median(kinds["plain"]))
                                         / 10, 3)}
            for name, kinds in ticks.items()}


def job_side(children: int) -> dict[str, dict[str, float]]:
    """Median page faults and µs of each step of a job's host-call path, in ``children`` forked children of
    this process, prepared first as a template is (see the module's docstring)."""
    import gc
    import resource

    from pynox.job import pynox_host
    from pynox.job.child import prepare_template
    from pynox.wire.host_channel import HostAnswer, encode_frame

    prepare_template()
    gc.collect()
    gc.freeze()
    steps = ("install", "import", "call 1", "call 2", "call 3")
    code = compile("from pynox_host import f", "<job>", "exec")

    def child(out: int) -> None:
        pynox_host.warm_up(calls=2)  # as a child prepared ahead for a job with host functions does
        ours, theirs = socket.socketpair()
        for tag in (1, 2, 3):  # the answers wait already: a call's time is the job's own work
            theirs.sendall(encode_frame(HostAnswer(tag=tag, result=tag)))
        namespace: dict[str, Any] = {}
        # A step that does nothing comes first, twice: the measuring's own first faults are not a step's.
        actions = [lambda: None, lambda: None, lambda: pynox_host.install_host_module(["f"], ours.detach()),
                   lambda: exec(code, namespace), *(lambda: namespace["f"](1) for _ in range(3))]
        figures = [(0.0, 0)] * len(actions)
        for n, action in enumerate(actions):
            faults, start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.perf_counter_ns()
            action()
            end, after = time.perf_counter_ns(), resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            figures[n] = ((end - start) / 1000, after - faults)
        os.write(out, json.dumps(figures[2:]).encode())
        os._exit(0)

    rows = []
    for _ in range(children):
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read)
            child(write)
        os.close(write)
        with os.fdopen(read, "rb") as pipe:
            rows.append(json.loads(pipe.read()))
        os.waitpid(pid, 0)
    return {step: {"us": round(statistics.median(row[n][0] for row in rows), 1),
                   "faults": statistics.median(row[n][1] for row in rows)} for n, step in enumerate(steps)}


def job_side_of(checkout: str, children: int) -> dict[str, dict[str, float]]:
    """:func:`job_side` of another checkout's pynox, in a process of its own."""
    env = dict(os.environ, PYTHONPATH=os.path.join(checkout, "packages", "pynox-core", "src"))
    done = subprocess.run([sys.executable, __file__, "--job-side-only", "--children", str(children)], env=env,
                          capture_output=True, text=True, check=True)
    figures: dict[str, dict[str, float]] = json.loads(done.stdout)
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=400)
    parser.add_argument("--block", type=int, default=5, help="jobs of one kind in a row (the first untimed)")
    parser.add_argument("--compare", metavar="CHECKOUT")
    parser.add_argument("--children", type=int, default=80, help="forked children timing the job's side")
    parser.add_argument("--job-side-only", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--json")
    args = parser.parse_args()
    if args.job_side_only:  # the compared checkout's figures (see job_side_of)
        print(json.dumps(job_side(args.children)))
        return 0
    pools = {"this": PoolDriver("--workers=1")}
    if args.compare:
        pools[os.path.basename(args.compare.rstrip("/"))] = PoolDriver("--workers=1", source=args.compare)
    results: dict[str, Any] = {
        "load before": os.getloadavg(),
        "uptime before": subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip(),
        "unix socket round trip, 10 ms apart": socket_round_trip(args.runs, 0.01),
        "unix socket round trip, back to back": socket_round_trip(args.runs, 0.0),
        "jobs 10 ms apart": measure(pools, args.runs, 0.01, max(args.block, 2)),
        "jobs back to back": measure(pools, args.runs, 0.0, max(args.block, 2)),
        "cpu ms per job (pool, templates, jobs)": cpu_per_job(pools, blocks=max(args.runs // 50, 3), size=50),
        "job side (forked children: median us and page faults)":
            {"this": job_side_of(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."), args.children)}
            | ({os.path.basename(args.compare.rstrip("/")): job_side_of(args.compare, args.children)}
               if args.compare else {}),
        "load after": os.getloadavg(),
        "uptime after": subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip(),
    }
    for pool in pools.values():
        pool.close()
    emit(results, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
