"""A session's save and restore, timed for a session holding a pandas DataFrame: the state's size, the save, and
the restore (the restoring request that opens a new session and unpickles the state in it, then a first step).

* ``save``: ``Session.save()``, the pickling inside the session's process, the line to the pool, its HMAC;
* ``restore``: ``Pool.session(restore=...)`` and its first ``run("pass")``: the HMAC check, a new session's
  process (its template warm, pandas preloaded), the unpickling, then one empty step;
* ``new_session``: a new session's first ``run("pass")`` without a restore, interleaved with the restores.

    python bench/session_state.py [--rows 20000] [--runs 10] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import pynox


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--settle", type=float, default=6.0, help="seconds for a spare template to start")
    parser.add_argument("--json")
    args = parser.parse_args()
    make = (f"import numpy as np, pandas as pd\nrng = np.random.default_rng(0)\n"
            f"df = pd.DataFrame({{'a': rng.random({args.rows}), 'b': rng.integers(0, 100, {args.rows}), "
            f"'c': rng.random({args.rows})}})")
    saves: list[float] = []
    restores: list[float] = []
    fresh: list[float] = []  # a new session's first step without a restore: what a restore adds is the difference
    size = 0
    with pynox.Pool(workers=1, preload=["pandas"]) as pool:
        with pool.session(timeout=60) as session:
            session.run(make).raise_for_error()
            for _ in range(args.runs):
                start = time.perf_counter()
                saved = session.save()
                saves.append(time.perf_counter() - start)
            size = len(saved.data)
        for _ in range(args.runs):  # interleaved, so both see the same load
            time.sleep(args.settle)  # the pool's spare template for the next session is warm again
            start = time.perf_counter()
            with pool.session(restore=saved, timeout=60) as restored:
                restored.run("pass", return_value=False).raise_for_error()
                restores.append(time.perf_counter() - start)
            time.sleep(args.settle)
            start = time.perf_counter()
            with pool.session(timeout=60) as plain:
                plain.run("pass", return_value=False).raise_for_error()
                fresh.append(time.perf_counter() - start)
    report = {"rows": args.rows, "state_bytes": size,
              "save_ms_p50": round(statistics.median(saves) * 1000, 1),
              "save_ms_max": round(max(saves) * 1000, 1),
              "restore_ms_p50": round(statistics.median(restores) * 1000, 1),
              "restore_ms_max": round(max(restores) * 1000, 1),
              "new_session_ms_p50": round(statistics.median(fresh) * 1000, 1)}
    print(json.dumps(report))
    if args.json:
        with open(args.json, "w") as file:
            json.dump(report, file)


if __name__ == "__main__":
    main()
