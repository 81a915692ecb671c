"""The pool process's own CPU per ``print(1)`` job (its threads only: intake, worker, result), this checkout's
against another's, interleaved in blocks on the same machine.

Each block runs ``--per-block`` jobs on one pool, then as many on the other (the order alternates from block
to block), and reads the CPU time every thread of each pool process has run (``/proc/<pid>/task/*/schedstat``,
nanoseconds, preemption excluded) before and after. The medians of the blocks, their ratio and in how many
blocks this checkout's was lower say whether a change to the server's per-job path moved it; the template
and the children are not in it (``breakdown.py`` and ``latency.py``'s ``cpu_ms_per_job`` count them).

    python bench/server_cpu.py --compare CHECKOUT [--gap 0] [--blocks 30] [--per-block 50]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from latency import PoolDriver  # type: ignore[import-not-found]  # from bench/


def threads_cpu_ns(pid: int) -> int:
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as stat:
                total += int(stat.read().split()[0])
        except OSError:  # a thread that ended meanwhile
            pass
    return total


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--compare", required=True, help="another checkout (its packages/pynox-core/src is used)")
    parser.add_argument("--gap", type=float, default=0.0, help="milliseconds between jobs")
    parser.add_argument("--blocks", type=int, default=30)
    parser.add_argument("--per-block", type=int, default=50)
    args = parser.parse_args()
    gap = args.gap / 1000
    label = os.path.basename(args.compare.rstrip("/"))
    pools = {"this": PoolDriver("--workers=1"), label: PoolDriver("--workers=1", source=args.compare)}
    per_job: dict[str, list[float]] = {name: [] for name in pools}
    try:
        for pool in pools.values():  # warm: templates up, children prepared
            for _ in range(30):
                pool.request({"code": "print(1)"})
                time.sleep(gap)
        for block in range(args.blocks):
            order = list(pools.items()) if block % 2 == 0 else list(reversed(pools.items()))
            for name, pool in order:
                before = threads_cpu_ns(pool.proc.pid)
                for _ in range(args.per_block):
                    reply = pool.request({"code": "print(1)"})
                    assert reply["exit"] == 0, reply
                    time.sleep(gap)
                per_job[name].append((threads_cpu_ns(pool.proc.pid) - before) / args.per_block / 1000)
    finally:
        for pool in pools.values():
            pool.close()
    this, other = statistics.median(per_job["this"]), statistics.median(per_job[label])
    lower = sum(1 for mine, theirs in zip(per_job["this"], per_job[label], strict=True) if mine < theirs)
    print(f"server CPU per job, {args.gap:g} ms apart, median of {args.blocks} blocks of {args.per_block}: "
          f"this {this:.0f} us, {label} {other:.0f} us, ratio {this / other:.3f}; this lower in {lower}/{args.blocks} "
          f"blocks; load average {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
