"""The bridge: ``run_python`` as a Monty external function, its permissions fixed by the host.

Monty calls external functions synchronously on the thread that called
``feed_run`` and needs plain data back, so ``run_python`` blocks on
``Pool.run`` and returns a dict. Everything the heavy code did wrong (raised,
was denied a path, timed out) is data the glue code can branch on; only a
broken pool raises.
"""

from __future__ import annotations

import builtins
import functools
from collections.abc import Callable, Mapping
from typing import Any

import pynox
from pynox import format_duration, parse_duration

__all__ = ["external_lookup", "python_function"]

HostFunction = Callable[..., Any]


def python_function(pool: pynox.Pool, *, profile: str | None = None, name: str = "heavy.py",
                    timeout: str | int | float | None = None, functions: Mapping[str, HostFunction] | None = None,
                    **grants: Any) -> Callable[..., dict[str, Any]]:
    """The ``run_python(code, timeout=None) -> dict`` external function for Monty, running on ``pool``.

    ``profile`` and ``grants`` (allow_read, allow_write, allow_network, env, memory, max_output, max_file_size,
    package_dirs) fix what the code may do; the model's code cannot change them. ``timeout`` is the host's limit
    per call: the glue code may pass a shorter one, and a longer one is cut to it. ``functions`` are host
    functions the heavy code may import from ``pynox_host``. A bad grant raises here.
    """
    host_grants = {**grants, **({"timeout": timeout} if timeout is not None else {})}
    # The grants after profile and ceiling, exactly as the pool will apply them (a bad one raises here).
    effective = pynox.CodeTool(pool, profile=profile, functions=functions, **host_grants).grants
    limit = effective.timeout
    run_grants = {**host_grants, **({"profile": profile} if profile else {})}
    host_functions = dict(functions or {})

    def run_python(code: str, timeout: str | int | float | None = None) -> dict[str, Any]:
        if not isinstance(code, str):
            raise TypeError(f"run_python() code must be a str of Python source, not {type(code).__name__}")
        call_grants = dict(run_grants)
        if timeout is not None:
            try:
                asked = parse_duration(timeout, "timeout")
            except ValueError as exc:
                raise ValueError(str(exc)) from None  # a builtin type: Monty shows a custom one as Exception
            call_grants["timeout"] = min(asked, limit)
        try:
            result = pool.run(code, name=name, functions=host_functions, **call_grants)
        except pynox.RequestError as exc:
            return _refused(str(exc))
        except pynox.PynoxError as exc:
            raise RuntimeError(f"{type(exc).__name__}: {exc}") from None
        return {"exit": result.exit, "stdout": result.stdout, "stderr": result.stderr, "error": result.error,
                "truncated": result.truncated}

    run_python.__doc__ = _docstring(effective, host_functions)
    return run_python


def external_lookup(pool: pynox.Pool, *, functions: Mapping[str, HostFunction] | None = None,
                    **options: Any) -> dict[str, HostFunction]:
    """The ``external_lookup`` mapping for ``MontySession.feed_run``: ``run_python`` (see :func:`python_function`,
    which takes the same ``options``) and each host function in ``functions``.

    A host function is callable both from the Monty glue code (by its name) and from the heavy code (through
    ``pynox_host``). An exception it raises reaches Monty with its type name in the message.
    """
    functions = dict(functions or {})
    if "run_python" in functions:
        raise ValueError("'run_python' is the bridge's own name: give the host function another one")
    lookup: dict[str, HostFunction] = {"run_python": python_function(pool, functions=functions, **options)}
    lookup.update({name: _readable_errors(name, function) for name, function in functions.items()})
    return lookup


def _refused(message: str) -> dict[str, Any]:
    """A request the pool refused before running it, in the shape of a result (the protocol's exit 2)."""
    error = {"type": "RequestError", "message": message, "file": None, "line": None, "path": None, "hint": None}
    return {"exit": 2, "stdout": "", "stderr": "", "error": error, "truncated": False}


def _readable_errors(name: str, function: HostFunction) -> HostFunction:
    """Monty turns an exception type it does not know into a bare ``Exception``: keep the type in the message."""

    @functools.wraps(function)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except Exception as exc:
            if getattr(builtins, type(exc).__name__, None) is type(exc):
                raise
            raise RuntimeError(f"{name}() failed: {type(exc).__name__}: {exc}") from exc

    return call


def _docstring(grants: pynox.ToolGrants, functions: Mapping[str, HostFunction]) -> str:
    read, write = grants.read, grants.write
    lines = [
        "Run `code`, a complete CPython script (any installed library), in a fresh sandboxed process.",
        "",
        "Returns a dict: `exit` (0 when it succeeded, 124 on timeout), `stdout` (only printed output comes back), "
        "`stderr`, `error` (None, or a dict with `type`, `message`, `file`, `line`, `path` and `hint`) and "
        "`truncated`. Check `exit` before using `stdout`.",
        "",
        f"The code may read {', '.join(read) or 'no files'} (plus the Python runtime) and write "
        f"{', '.join(write) or 'no files'}; network: {'allowed' if grants.network else 'not allowed'}. "
        f"Each call may run for {format_duration(grants.timeout)}; `timeout` can only shorten that.",
    ]
    if functions:
        lines.append(f"It can call the host's functions with `from pynox_host import {', '.join(functions)}`.")
    return "\n".join(lines)
