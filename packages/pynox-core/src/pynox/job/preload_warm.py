"""Warm-ups of preloaded modules: the state a module builds lazily on its first use, built once in the template.

``--preload=pandas`` leaves the template with pandas imported, nothing more. The first DataFrame a process
builds fills caches, dispatch tables and interned objects of pandas and numpy; in a child forked from the
template, each of those writes is a copy-on-write fault (microseconds each, on every job). Run once in the
template before any job exists (``job.child.prepare_template``), a warm-up builds that state there, and every
child inherits it.

A warm-up is keyed by the module it warms, and runs only where that module is imported already (preloaded,
or imported by a preload): it never imports one. What a job could see of it is nothing but that state:

* no variable: each warm-up is a function whose objects are gone when it returns (the template collects and
  freezes its heap afterwards, see template/fork_server.py);
* no output, no file, no descriptor: it computes on small in-memory values only, with warnings ignored;
* no other module: it uses only paths that import nothing more (``tests/pool/test_preload_warm.py`` checks
  the job's modules against a plain import), and never touches a random generator or an option;
* a warm-up that fails is ignored: the job then builds that state itself, as it did before.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable

__all__ = ["warm_preloaded"]


def _numpy() -> None:
    import numpy as np

    values = np.arange(100)
    float(values.sum()) + float(values.mean()) + float((values * 2 + 1).max())
    np.array([1.5, 2.5]).astype(np.int64).tolist()


def _pandas() -> None:
    import pandas as pd

    frame = pd.DataFrame({"a": range(100), "b": range(100)})
    int(frame.a.sum()) + int(frame["b"].max())
    frame["c"] = frame.a * 2 + frame.b
    float(frame.mean().sum())
    frame[frame.a > 50].c.tolist()
    pd.Series([1.5, 2.5, None]).fillna(0).sum()


# Module name -> its warm-up, in order (pandas builds on numpy).
_WARM_UPS: dict[str, Callable[[], None]] = {"numpy": _numpy, "pandas": _pandas}


# CPython 3.11 specializes a function's code after 8 calls (each call before that writes its counter):
# run that often, a warm-up leaves the code it ran specialized, so a child does not write those code objects.
TEMPLATE_RUNS = 8


def warm_preloaded(runs: int = TEMPLATE_RUNS) -> list[str]:
    """Run ``runs`` times the warm-up of each module that has one and is imported; the names of those that
    completed (a warm-up that raised once is not run again)."""
    warmed = []
    for name, warm in _WARM_UPS.items():
        if name not in sys.modules:
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                for _ in range(runs):
                    warm()
        except Exception:  # an optimisation: the job builds the same state itself
            continue
        warmed.append(name)
    return warmed
