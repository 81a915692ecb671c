"""What ``run_python`` returns to the glue code: one dict shape for every outcome, and its type for the checker.

A run's :class:`pynox.Result` becomes ``{"exit", "stdout", "stderr", "error", "truncated"}``. A request the
pool refused reaches the client as an exception with only its message, so it is rebuilt here as the result
the pool wrote for it, and then shown like any other. A timeout's hint is the bridge's own: the core's tells
the model to ask for more time with ``timeout=``, which for the glue code is ``run_python``'s argument, cut
back to the host's limit, so a model that followed it would retry for ever.
"""

from __future__ import annotations

from typing import Any

import pynox
from pynox import format_duration

__all__ = ["STUB_TYPES", "STUB_TYPE_NAMES", "glue_result", "refused"]

_REFUSED_EXIT = 2  # the protocol's exit status of a request refused before anything ran

# The result's keys as the checker sees them. `error` is `RunPythonError | Any`, not `| None`: glue code
# checks `exit` before it reads `error` (the Monty document's does), which a checker cannot narrow on;
# with `Any` standing for the None of a success, such code checks and a misspelt key is still caught.
STUB_TYPES = '''\
class RunPythonFrame(TypedDict):
    file: str | None
    line: int | None
    source: str | None
    column: int | None
    omitted: int


class RunPythonError(TypedDict):
    type: str
    message: str
    file: str | None
    line: int | None
    path: str | None
    hint: str | None
    traceback: list[RunPythonFrame] | None


class RunPythonResult(TypedDict):
    exit: int
    stdout: str
    stderr: str
    error: RunPythonError | Any
    truncated: bool
'''
STUB_TYPE_NAMES = ("RunPythonFrame", "RunPythonError", "RunPythonResult")


def glue_result(result: pynox.Result, *, given: float, host_limit: float) -> dict[str, Any]:
    """``result`` as the glue code reads it; ``given`` is the timeout the run had, ``host_limit`` the most
    the host allows a call."""
    error = result.error
    if error is not None and result.timed_out:
        error = {**error, "hint": _timeout_hint(given, host_limit)}
    return _shape(result, error)


def refused(message: str) -> dict[str, Any]:
    """The result of a request the pool refused (``RequestError``), as the pool itself wrote it."""
    result = pynox.Result(exit=_REFUSED_EXIT, error={"type": "RequestError", "message": message, "file": None,
                                                     "line": None, "path": None, "hint": None, "traceback": None})
    return _shape(result, result.error)


def _shape(result: pynox.Result, error: dict[str, Any] | None) -> dict[str, Any]:
    return {"exit": result.exit, "stdout": result.stdout, "stderr": result.stderr, "error": error,
            "truncated": result.truncated}


def _timeout_hint(given: float, host_limit: float) -> str:
    if given < host_limit:
        return (f"The code ran longer than the {format_duration(given)} its `timeout` gave it and was stopped. "
                f"A run_python call may run for at most {format_duration(host_limit)}, the host's limit: pass a "
                f"longer `timeout`, up to {format_duration(host_limit)}, or make the code faster (check for "
                "endless loops or waits).")
    limit = format_duration(host_limit)
    return (f"The code ran longer than its {limit} limit and was stopped. {limit} is the most the host allows a "
            "run_python call, and only the host can raise it: a longer `timeout` is cut back to it. Make the code "
            "faster (check for endless loops or waits), or do less in each call.")
