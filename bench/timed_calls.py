"""What the benches that time a few calls side by side share: their summary and their command line.

Each such bench times callables in interleaved rounds (seconds from ``time.perf_counter``), then prints p50 and p99
per name in milliseconds, as JSON, and writes the same to ``--json FILE`` if asked.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable
from typing import Any


def summary(seconds: list[float]) -> dict[str, float]:
    """p50 and p99 of ``seconds``, in milliseconds."""
    ordered = sorted(seconds)
    return {"p50_ms": round(statistics.median(ordered) * 1000, 2),
            "p99_ms": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000, 2)}


def main(doc: str | None, measure: Callable[[int], dict[str, Any]], runs: int = 200) -> None:
    """The command line: ``--runs N`` (``runs`` by default) and ``--json FILE``; ``doc``'s first paragraph is the
    description."""
    parser = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=runs)
    parser.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    args = parser.parse_args()
    figures = measure(args.runs)
    print(json.dumps(figures, indent=2))
    if args.json:
        with open(args.json, "w") as out:
            json.dump(figures, out, indent=2)
