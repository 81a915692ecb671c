"""What an idle session costs, and how long a new session's first step takes beside a plain job.

Drives a real ``pynox pool`` through its JSON Lines protocol (bench/latency.py's driver):

* memory: the proportional set size (``Pss`` of ``/proc/PID/smaps_rollup``, so pages shared copy-on-write
  count once, split between their sharers) of the pool and every process under it, with no session, then
  with ``--sessions`` idle sessions open, each having run one step (``x = 0``); the difference divided by
  the number of sessions is what one idle session costs;
* time: the first step of a new session (``x = 1``, the session closed after, untimed) and a plain job
  (``print(1)``), interleaved run by run so both see the same load, with a template of the pool's preload
  warm; p50 and p90 of each, and their ratio.

    python bench/session_capacity.py [--preload pandas] [--sessions 100] [--runs 60] [--source CHECKOUT]

``--source`` names another checkout of this repository (a ``git worktree`` of main, say): the pool runs its
code instead of this one's, for a before-and-after on the same machine.
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


def first_steps(pool: PoolDriver, runs: int, pause: float) -> dict[str, float]:
    firsts: list[float] = []
    plains: list[float] = []
    for index in range(runs):
        time.sleep(pause)  # a spare template of the preload has time to be warm again
        start = time.perf_counter()
        check_ok(pool.request({"code": "print(1)"}))
        plains.append((time.perf_counter() - start) * 1000)
        time.sleep(pause)
        start = time.perf_counter()
        check_ok(pool.request({"session": f"first{index}", "code": "x = 1"}))
        firsts.append((time.perf_counter() - start) * 1000)
        pool.request({"session": f"first{index}", "close": True})

    def p(samples: list[float], q: float) -> float:
        return round(sorted(samples)[min(int(len(samples) * q), len(samples) - 1)], 2)

    return {"first_step_p50_ms": round(statistics.median(firsts), 2), "first_step_p90_ms": p(firsts, 0.9),
            "plain_job_p50_ms": round(statistics.median(plains), 2), "plain_job_p90_ms": p(plains, 0.9),
            "ratio_p50": round(statistics.median(firsts) / statistics.median(plains), 2), "runs": runs}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preload", default="pandas")
    parser.add_argument("--sessions", type=int, default=100)
    parser.add_argument("--runs", type=int, default=60)
    parser.add_argument("--pause", type=float, default=0.3, help="seconds before each timed request")
    parser.add_argument("--source", help="another checkout whose pool to measure")
    parser.add_argument("--skip-memory", action="store_true")
    args = parser.parse_args()
    results: dict[str, object] = {"load_before": os.getloadavg()}
    pool_args = ["--workers=2", f"--max-sessions={max(args.sessions, 16)}", "--session-idle=1h"]
    if args.preload:
        pool_args.append(f"--preload={args.preload}")
    pool = PoolDriver(*pool_args, source=args.source)
    try:
        check_ok(pool.request({"code": "print(1)"}))
        results["first_step"] = first_steps(pool, args.runs, args.pause)
        if not args.skip_memory:
            results["memory"] = idle_sessions(pool, args.sessions)
    finally:
        pool.close()
    results["load_after"] = os.getloadavg()
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
