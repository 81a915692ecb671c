"""What an idle session costs, and how long a new session's first step takes beside a plain job.

Drives a real ``pynox pool`` through its JSON Lines protocol (bench/latency.py's driver):

* memory: the proportional set size (``Pss`` of ``/proc/PID/smaps_rollup``, so pages shared copy-on-write
  count once, split between their sharers) of the pool and every process under it, with no session, then
  with ``--sessions`` idle sessions open, each having run one step (``x = 0``); the difference divided by
  the number of sessions is what one idle session costs;
* time: the first step of a new session (``x = 1``, the session closed after, untimed) and a plain job
  (``print(1)``), interleaved run by run so both see the same load, with a template of the pool's preload
  warm (the pool has had one session before); p50, p90 and p99 of each, and their ratio.

    python bench/session_capacity.py [--preload pandas] [--sessions 100] [--runs 60] [--compare CHECKOUT]

``--compare`` names another checkout of this repository (a ``git worktree`` of main, say): its pool runs beside
this one's, the timed requests interleaved run by run (the order alternating), and its memory is measured after
this one's, one pool at a time. ``--source`` runs another checkout's pool instead of this one's. The load average
(``/proc/loadavg``, as ``uptime`` prints it) is given before, between and after.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from latency import PoolDriver, check_ok, tree_rss_mb


def idle_sessions(pool: PoolDriver, sessions: int) -> dict[str, float]:
    time.sleep(1.0)  # the spare template (if any) and the workers settle
    before = tree_rss_mb(pool.proc.pid)
    start = time.perf_counter()
    for index in range(sessions):
        check_ok(pool.request({"session": f"idle{index}", "code": "x = 0"}))
    opened_s = time.perf_counter() - start
    time.sleep(1.0)
    after = tree_rss_mb(pool.proc.pid)
    for index in range(sessions):
        pool.request({"session": f"idle{index}", "close": True})
    return {"pss_without_sessions_mb": before, "pss_with_sessions_mb": after,
            "pss_per_idle_session_mb": round((after - before) / sessions, 2), "sessions": sessions,
            "opened_in_s": round(opened_s, 2)}


def _percentile(samples: list[float], q: float) -> float:
    return round(sorted(samples)[min(int(len(samples) * q), len(samples) - 1)], 2)


def _summary(firsts: list[float], plains: list[float]) -> dict[str, float]:
    return {"first_step_p50_ms": round(statistics.median(firsts), 2), "first_step_p90_ms": _percentile(firsts, 0.9),
            "first_step_p99_ms": _percentile(firsts, 0.99),
            "plain_job_p50_ms": round(statistics.median(plains), 2), "plain_job_p90_ms": _percentile(plains, 0.9),
            "plain_job_p99_ms": _percentile(plains, 0.99),
            "ratio_p50": round(statistics.median(firsts) / statistics.median(plains), 2),
            "ratio_p99": round(_percentile(firsts, 0.99) / _percentile(plains, 0.99), 2), "runs": len(firsts)}


def first_steps(pools: dict[str, PoolDriver], runs: int, pause: float) -> dict[str, dict[str, float]]:
    """Each run, on each pool in turn (the order alternating run by run, so both see the same load): a plain
    job, then the first step of a new session (closed after, untimed)."""
    firsts: dict[str, list[float]] = {name: [] for name in pools}
    plains: dict[str, list[float]] = {name: [] for name in pools}
    names = list(pools)
    for index in range(runs):
        for name in names if index % 2 == 0 else names[::-1]:
            pool = pools[name]
            time.sleep(pause)  # a spare template of the preload has time to be warm again
            start = time.perf_counter()
            check_ok(pool.request({"code": "print(1)"}))
            plains[name].append((time.perf_counter() - start) * 1000)
            time.sleep(pause)
            start = time.perf_counter()
            check_ok(pool.request({"session": f"first{index}", "code": "x = 1"}))
            firsts[name].append((time.perf_counter() - start) * 1000)
            pool.request({"session": f"first{index}", "close": True})
    return {name: _summary(firsts[name], plains[name]) for name in pools}


def _uptime() -> str:
    with open("/proc/loadavg") as loadavg:
        return " ".join(loadavg.read().split()[:3])


def _pool_args(args: argparse.Namespace) -> list[str]:
    pool_args = ["--workers=2", f"--max-sessions={max(args.sessions, 16)}", "--session-idle=1h"]
    if args.preload:
        pool_args.append(f"--preload={args.preload}")
    return pool_args


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preload", default="pandas")
    parser.add_argument("--sessions", type=int, default=100)
    parser.add_argument("--runs", type=int, default=60)
    parser.add_argument("--pause", type=float, default=0.3, help="seconds before each timed request")
    parser.add_argument("--source", help="another checkout whose pool to measure instead of this one's")
    parser.add_argument("--compare", help="another checkout whose pool to measure beside this one's, interleaved")
    parser.add_argument("--skip-memory", action="store_true")
    args = parser.parse_args()
    results: dict[str, object] = {"load_before": _uptime()}
    sources = {"this": args.source} if args.compare is None else {"this": args.source, "compare": args.compare}
    pools = {name: PoolDriver(*_pool_args(args), source=source) for name, source in sources.items()}
    try:
        for pool in pools.values():
            check_ok(pool.request({"code": "print(1)"}))
            # The pool's first session: its zygote and the template waiting ahead start (untimed, as a warm pool).
            check_ok(pool.request({"session": "warm", "code": "x = 0"}))
            pool.request({"session": "warm", "close": True})
        results["first_step"] = first_steps(pools, args.runs, args.pause)
        results["load_after_first_steps"] = _uptime()
    finally:
        for pool in pools.values():
            pool.close()
    if not args.skip_memory:
        memory: dict[str, object] = {}
        for name, source in sources.items():  # one pool at a time: pages two pools share would split their PSS
            pool = PoolDriver(*_pool_args(args), source=source)
            try:
                check_ok(pool.request({"code": "print(1)"}))
                check_ok(pool.request({"session": "warm", "code": "x = 0"}))
                pool.request({"session": "warm", "close": True})
                memory[name] = idle_sessions(pool, args.sessions)
            finally:
                pool.close()
        results["memory"] = memory
    results["load_after"] = _uptime()
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
