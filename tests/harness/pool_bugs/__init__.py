"""A bug of ours planted in a real pool: a ``sitecustomize`` (this directory on the pool's PYTHONPATH) that makes
one of the pool's own steps raise for the requests whose id starts with ``bug-``, as a bug of the pool would. What
it tests is the guard around those steps (every accepted request still gets one answer, and the thread that
answers lives on), not what the steps do: everything else of the pool, and the job's confinement, are real.

- ``scratch``: collecting a finished job's scratch files (``ScratchRoot.files_of``) raises.
- ``record``: counting a result in the pool's stats (``Stats.record``), before its line is written, raises."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

__all__ = ["planted"]

_HERE = Path(__file__).parent


def planted(bug: Literal["scratch", "record"]) -> dict[str, str]:
    """This environment, with ``bug`` planted in a ``pynox pool`` started in it."""
    path = os.pathsep.join([str(_HERE), *filter(None, [os.environ.get("PYTHONPATH")])])
    return {**os.environ, "PYTHONPATH": path, "PYNOX_PLANTED_BUG": bug}
