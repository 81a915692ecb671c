"""What a tenant budget costs a job: ``print(1)`` round trips on a listening pool of one worker, whose template
serves two tenants.

Three pools of one worker, ``--runs`` jobs each, interleaved job by job so that the machine's load falls on
all three alike: ``same`` (every job of one tenant with a budget: its template stays beneath that tenant's
cgroup), ``alternating`` (two tenants with budgets take turns: before each job the template moves into a
cgroup beneath the other tenant's, and the child it prepared ahead is given up, so the job forks one), and
``no budget`` (the same two tenants taking turns, without budgets: the baseline, no move ever). The two peers
are this process with its own gid and with ``--gid`` as its effective gid when it connects (the kernel's
SO_PEERCRED says which); run as root.

    python bench/tenant_switch.py [--runs 300] [--gid 64998] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any

from host_calls import emit  # type: ignore[import-not-found]  # run from bench/
from latency import summary  # type: ignore[import-not-found]

HERE = os.path.dirname(os.path.abspath(__file__))


class _Connection:
    def __init__(self, path: str, gid: int | None) -> None:
        own = os.getegid()
        if gid is not None:
            os.setegid(gid)
        try:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.connect(path)
        finally:
            os.setegid(own)
        self.lines = self.sock.makefile("rb")
        assert json.loads(self.lines.readline())["event"] == "ready"
        self.next_id = 0

    def run(self) -> float:
        self.next_id += 1
        start = time.perf_counter()
        self.sock.sendall(json.dumps({"id": self.next_id, "code": "print(1)"}).encode() + b"\n")
        reply = json.loads(self.lines.readline())
        elapsed = (time.perf_counter() - start) * 1000
        assert reply["exit"] == 0 and reply["stdout"] == "1\n", reply
        return elapsed


def _pool(directory: str, name: str, budgets: bool, gid: int) -> tuple[subprocess.Popen[bytes], str]:
    budget = 'memory_budget = "1g"\ncpu_weight = 100\n' if budgets else ""
    config = os.path.join(directory, f"{name}.toml")
    with open(config, "w") as out:  # the gid's tenant first: a peer with that effective gid is it, root the other
        out.write(f"[tenants.b]\ngids = [{gid}]\n{budget}\n[tenants.a]\nuids = [0]\n{budget}")
    path = os.path.join(directory, f"{name}.sock")
    pool = subprocess.Popen([sys.executable, "-m", "pynox", "pool", "--workers=1", f"--listen=unix:{path}",
                             f"--config={config}"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert pool.stdout is not None
    assert json.loads(pool.stdout.readline())["event"] == "ready"
    return pool, path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--gid", type=int, default=64998)
    parser.add_argument("--json")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root: the second tenant is this process under another effective gid")
    directory = tempfile.mkdtemp(prefix="pynox-tenant-switch-")
    pools: list[subprocess.Popen[bytes]] = []
    try:
        paths = {}
        for name, budgets in (("same", True), ("alternating", True), ("no budget", False)):
            pool, paths[name] = _pool(directory, name.replace(" ", "-"), budgets, args.gid)
            pools.append(pool)
        # One pool of one worker per pattern, the three interleaved job by job.
        turns = {"same": [_Connection(paths["same"], None)],
                 "alternating": [_Connection(paths["alternating"], None), _Connection(paths["alternating"], args.gid)],
                 "no budget": [_Connection(paths["no budget"], None), _Connection(paths["no budget"], args.gid)]}
        samples: dict[str, list[float]] = {kind: [] for kind in turns}
        load_before = os.getloadavg()
        for n in range(args.runs + 10):
            for kind, connections in turns.items():
                elapsed = connections[n % len(connections)].run()
                if n >= 10:  # warm-up left out
                    samples[kind].append(elapsed)
        results: dict[str, Any] = {kind: summary(values) for kind, values in samples.items()}
        results["load_average"] = {"before": load_before[0], "after": os.getloadavg()[0], "cores": os.cpu_count()}
        emit(results, args.json)
    finally:
        for pool in pools:
            pool.terminate()
            pool.wait(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
