"""What one host call adds to a job, interleaved with plain jobs, beside a plain unix-socket round trip.

A host call travels job → pool → client → pool → job: two round trips between processes, through the
pool's worker (which reads the call) and its intake (which reads the client's reply and writes the answer).
Each round runs, on each pool, a ``print(1)`` job and a job that makes one host call and prints its answer,
alternately, so both see the same machine load; the call's cost is the difference of their medians. The
CPU per job is what the pool's processes were charged (the pool process, its templates, and the children
they reaped, from /proc), over blocks of one kind of job, so it holds under load as latency does not.
The baseline is one round trip over a unix socketpair between two processes, 20 ms apart and back to back.

``--compare CHECKOUT`` runs another checkout's pool (a ``git worktree`` of the previous main, say) in the
same rounds.

    python bench/host_calls.py [--runs 400] [--compare CHECKOUT] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import time
from typing import Any

from latency import PoolDriver, check_ok, summary  # type: ignore[import-not-found]  # run from bench/

PLAIN = {"code": "print(1)"}
CALL = {"code": "from pynox_host import f\nprint(f(1))", "functions": ["f"]}
_TICK = os.sysconf("SC_CLK_TCK")


def _read(path: str) -> str:
    with open(path) as file:
        return file.read()


def cpu_ticks(pid: int, *, reaped: bool = True) -> int:
    """utime + stime of ``pid``, and with ``reaped`` cutime + cstime: the CPU of the children it reaped."""
    fields = _read(f"/proc/{pid}/stat").rpartition(")")[2].split()
    return sum(int(value) for value in fields[11:15 if reaped else 13])


def pool_cpu(pid: int) -> int:
    """The pool's CPU ticks: its own, and each live template's with the jobs it reaped (a template replaced
    meanwhile takes its count with it: the blocks are many, and the median is taken)."""
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


def measure(pools: dict[str, PoolDriver], runs: int, pause: float) -> dict[str, Any]:
    samples: dict[str, dict[str, list[float]]] = {name: {"plain": [], "call": []} for name in pools}
    for pool in pools.values():  # warm both paths (and the prepared children) first
        for _ in range(10):
            _job(pool, PLAIN)
            _job(pool, CALL)
    for _ in range(runs):
        for name, pool in pools.items():
            for kind, message in (("plain", PLAIN), ("call", CALL)):
                if pause:
                    time.sleep(pause)
                samples[name][kind].append(_job(pool, message))
    figures: dict[str, Any] = {}
    for name, kinds in samples.items():
        plain, call = summary(kinds["plain"]), summary(kinds["call"])
        figures[name] = {"plain": plain, "call": call,
                         "call_adds_p50_ms": round(call["p50_ms"] - plain["p50_ms"], 3)}
    return figures


def cpu_per_job(pools: dict[str, PoolDriver], blocks: int, size: int) -> dict[str, Any]:
    """CPU ms per job of each kind, over ``blocks`` interleaved blocks of ``size`` jobs each, back to back."""
    ticks: dict[str, dict[str, list[float]]] = {name: {"plain": [], "call": []} for name in pools}
    for _ in range(blocks):
        for name, pool in pools.items():
            for kind, message in (("plain", PLAIN), ("call", CALL)):
                before = pool_cpu(pool.proc.pid)
                for _ in range(size):
                    _job(pool, message)
                ticks[name][kind].append((pool_cpu(pool.proc.pid) - before) * 1000 / _TICK / size)
    return {name: {kind: round(statistics.median(values), 2) for kind, values in kinds.items()}
            | {"call_adds_ms": round(statistics.median(kinds["call"]) - statistics.median(kinds["plain"]), 2)}
            for name, kinds in ticks.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=400)
    parser.add_argument("--compare", metavar="CHECKOUT")
    parser.add_argument("--json")
    args = parser.parse_args()
    pools = {"this": PoolDriver("--workers=1")}
    if args.compare:
        pools[os.path.basename(args.compare.rstrip("/"))] = PoolDriver("--workers=1", source=args.compare)
    results: dict[str, Any] = {
        "load before": os.getloadavg(),
        "unix socket round trip, 10 ms apart": socket_round_trip(args.runs, 0.01),
        "unix socket round trip, back to back": socket_round_trip(args.runs, 0.0),
        "jobs 10 ms apart": measure(pools, args.runs, 0.01),
        "jobs back to back": measure(pools, args.runs, 0.0),
        "cpu ms per job (pool, templates, jobs)": cpu_per_job(pools, blocks=max(args.runs // 50, 3), size=50),
        "load after": os.getloadavg(),
    }
    for pool in pools.values():
        pool.close()
    emit(results, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
