"""How fast a saturated pool answers for its state: stats on the pipe, and the metrics socket.

Starts a real ``pynox pool --metrics-socket`` with 2 workers and fills it: every worker busy and the queue
full with jobs that wait for a gate file (so none ends while it is measured), then:

* ``pipe``: the time from writing ``{"stats": true}`` just behind a full queue (one more job per worker, as
  intake reads ahead) to its answer;
* ``socket``: ``GET /metrics`` and ``GET /readyz`` on the metrics socket, with intake blocked behind even
  more jobs than it reads ahead, and for comparison on the idle pool.

    python bench/saturated_stats.py [--runs 200] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

WORKERS = 2


def _scrape(path: Path, route: str) -> float:
    began = time.perf_counter()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as peer:
        peer.connect(str(path))
        peer.sendall(f"GET {route} HTTP/1.0\r\n\r\n".encode())
        while peer.recv(65536):
            pass
    return time.perf_counter() - began


def _figures(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {"p50_ms": round(statistics.median(ordered) * 1000, 3),
            "p99_ms": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000, 3), "n": len(ordered)}


class Pool:
    def __init__(self, cwd: Path, metrics: Path) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "pynox", "pool", f"--workers={WORKERS}",
                                      f"--metrics-socket={metrics}"], cwd=cwd, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE)
        assert json.loads(self.read())["event"] == "ready"

    def read(self) -> str:
        assert self.proc.stdout is not None
        return self.proc.stdout.readline().decode()

    def send(self, message: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(message).encode() + b"\n")
        self.proc.stdin.flush()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        gate, metrics = root / "gate", root / "run" / "metrics.sock"
        gate.mkdir()
        metrics.parent.mkdir()
        pool = Pool(root, metrics)
        idle = {route: _figures([_scrape(metrics, route) for _ in range(args.runs)])
                for route in ("/metrics", "/readyz")}
        wait = f"import os, time\nwhile not os.path.exists({str(gate / 'open')!r}):\n    time.sleep(0.01)\n"
        job = {"code": wait, "allow_read": [str(gate)], "timeout": "10m"}
        # Every worker busy, the queue (2 per worker) full, and one more per worker read ahead.
        for n in range(WORKERS + 2 * WORKERS + WORKERS):
            pool.send({"id": f"hold-{n}", **job})
        pipe = []
        for n in range(args.runs):
            began = time.perf_counter()
            pool.send({"id": f"s-{n}", "stats": True})
            answer = json.loads(pool.read())
            pipe.append(time.perf_counter() - began)
            assert answer["event"] == "stats" and answer["busy_workers"] == WORKERS, answer
        for n in range(4):  # beyond the read-ahead: intake now blocks, and a stats line behind it would wait
            pool.send({"id": f"excess-{n}", **job})
        blocked = {route: _figures([_scrape(metrics, route) for _ in range(args.runs)])
                   for route in ("/metrics", "/readyz")}
        (gate / "open").touch()
        assert pool.proc.stdin is not None
        pool.proc.stdin.close()
        pool.proc.wait(60)
    report = {"workers": WORKERS, "cpus": os.cpu_count(), "python": sys.version.split()[0],
              "pipe_stats_behind_a_full_queue": _figures(pipe), "socket_idle": idle,
              "socket_with_intake_blocked": blocked}
    print(json.dumps(report, indent=2))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
