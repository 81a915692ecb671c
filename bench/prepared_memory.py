"""What each child prepared ahead costs in memory, read from the host beside a pool that prepares none.

For each ``[pool] prepared_children`` value it starts ``pynox pool --workers=1`` with that value, runs a few
``print(1)`` jobs, waits until the template's prepared children ("pynox-ready") are all there and still, and
reads:

* each prepared child's ``Pss`` and USS (``Private_Clean + Private_Dirty``) from ``/proc/PID/smaps_rollup``:
  what it copied of its template's pages (its confinement's writes) or allocated, and its share of the rest;
* each prepared child's page tables (``VmPTE`` of ``/proc/PID/status``): a fork copies them, more for a
  template with large preloads;
* the template's memory cgroup (``memory.current``, where the pool made one): what the kernel charges for the
  template and its children together, page tables and kernel stacks included. Its growth over the pool that
  prepares none, divided by the children, is what one costs the host; page cache charged to the cgroup
  (a preload's files) makes it move between pools, so it is a check of the sum above, not a finer figure.

Each value is measured over ``--rounds`` fresh pools; the medians are printed as JSON.

    python bench/prepared_memory.py [--counts 0 1 2 4] [--rounds 3] [--preload pandas]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

from breakdown import template_of  # type: ignore[import-not-found]  # run from bench/
from latency import PoolDriver, descendants, process_name  # type: ignore[import-not-found]  # run from bench/

READY = "pynox-ready"


def smaps_rollup(pid: int) -> dict[str, int]:
    with open(f"/proc/{pid}/smaps_rollup") as rollup:
        return {line.split(":")[0]: int(line.split()[1]) for line in rollup if line.endswith("kB\n")}


def page_tables_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmPTE:"))


def _memory_current(pid: int) -> int | None:
    """The bytes charged to ``pid``'s memory cgroup (v2, or v1's memory hierarchy), None without one."""
    with open(f"/proc/{pid}/cgroup") as groups:
        for line in groups:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            if controllers == "":
                file = f"/sys/fs/cgroup{path}/memory.current"
            elif "memory" in controllers.split(","):
                file = f"/sys/fs/cgroup/memory{path}/memory.usage_in_bytes"
            else:
                continue
            try:
                with open(file) as current:
                    return int(current.read())
            except OSError:
                continue
    return None


def _ready(template: int) -> list[int]:
    return sorted(pid for pid in descendants(template) if process_name(pid) == READY)


def measure(count: int, preload: str | None) -> dict[str, float | None]:
    with tempfile.TemporaryDirectory() as tmp:
        config = os.path.join(tmp, "pynox.toml")
        with open(config, "w") as file:
            file.write(f"[pool]\nprepared_children = {count}\n")
        args = ["--workers=1", f"--config={config}", *([f"--preload={preload}"] if preload else [])]
        pool = PoolDriver(*args)
        try:
            for _ in range(5):
                reply = pool.request({"code": "print(1)"})
                assert reply["exit"] == 0, reply
            # The worker's template: the one with children (a session's template, if any, has none here).
            template = template_of(pool.proc.pid)  # the server's child, or the zygote's
            end = time.monotonic() + 10
            while len(_ready(template)) < count or (count and smaps_rollup(_ready(template)[-1]).get("Pss") is None):
                assert time.monotonic() < end, f"{count} children were not prepared"
                time.sleep(0.01)
            time.sleep(0.5)  # confined by now: each waits on its control socket
            children = _ready(template)
            assert len(children) == count, children
            rollups = [smaps_rollup(pid) for pid in children]
            tables = [page_tables_kb(pid) for pid in children]
            template_rollup = smaps_rollup(template)
            current = _memory_current(template)
        finally:
            pool.close()
    return {
        "children": len(children),
        "child_pss_kb": statistics.mean(r["Pss"] for r in rollups) if rollups else None,
        "child_uss_kb": statistics.mean(r["Private_Clean"] + r["Private_Dirty"] for r in rollups) if rollups else None,
        "child_page_tables_kb": statistics.mean(tables) if tables else None,
        "template_pss_kb": template_rollup["Pss"],
        "cgroup_kb": current // 1024 if current is not None else None,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counts", type=int, nargs="+", default=[0, 1, 2, 4])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--preload", help="modules the templates preload (comma-separated)")
    args = parser.parse_args()
    rounds: dict[int, list[dict[str, float | None]]] = {count: [] for count in args.counts}
    for _ in range(args.rounds):
        for count in args.counts:  # interleaved: each value sees the same load
            rounds[count].append(measure(count, args.preload))
    figures: dict[str, dict[str, float | None]] = {}
    for count, measured in rounds.items():
        figures[f"prepared_children = {count}"] = {
            key: (round(statistics.median(values), 1) if (values := [m[key] for m in measured if m[key] is not None])
                  else None)
            for key in measured[0]}
    base = figures.get("prepared_children = 0", {}).get("cgroup_kb")
    for count in args.counts:
        entry = figures[f"prepared_children = {count}"]
        if count and base is not None and entry["cgroup_kb"] is not None:
            entry["cgroup_kb_per_child"] = round((entry["cgroup_kb"] - base) / count, 1)
    json.dump({"load": os.getloadavg(), "preload": args.preload, "figures": figures}, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
