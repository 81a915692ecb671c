"""Plants the bug ``$PYNOX_PLANTED_BUG`` names in the pool this process is (see __init__.py); nothing elsewhere."""

from __future__ import annotations

import os
import sys
from typing import Any

_BUG = os.environ.get("PYNOX_PLANTED_BUG")


class PlantedBug(Exception):
    """What the planted step raises."""


def _plant() -> None:
    if _BUG == "scratch":
        from pynox.server import scratch

        collect = scratch.ScratchRoot.files_of

        def files_of(self: Any, path: str, budget: int) -> Any:
            if any(name.startswith("bug-") for name in os.listdir(path)):
                raise PlantedBug("planted in Scratch.files_of")
            return collect(self, path, budget)

        scratch.ScratchRoot.files_of = files_of  # type: ignore[method-assign]
    elif _BUG == "record":
        from pynox.server import stats

        record = stats.Stats.record

        def record_planted(self: Any, result: Any) -> str:
            # The pool's answer in its place (an error) is counted.
            if str(result.id).startswith("bug-") and result.error is None:
                raise PlantedBug("planted in Stats.record")
            return record(self, result)

        stats.Stats.record = record_planted  # type: ignore[method-assign]


if _BUG and "pool" in sys.argv:  # `pynox pool` or `python -m pynox pool` (its templates start isolated: -I)
    _plant()
