"""``tool()``: the ``run_python(code: str) -> str`` function a model calls, with a docstring written for it.

The function is a real ``def`` (frameworks inspect its signature and reject
callable objects and partials), its only parameter is the code, and its
docstring tells the model exactly what it may touch: readable and writable
paths, network, limits, and the host functions it can import. Permissions are
fixed by the host when the tool is made; the model can only ask for more.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import msgspec

from .config import EMPTY, load_config
from .errors import PynoxError
from .host_functions import HostErrors, visible_signature
from .protocol import Request
from .resolve import DEFAULTS, resolve_path
from .units import format_duration, format_size, parse_duration, parse_size

if TYPE_CHECKING:
    from .client import Pool, Session

__all__ = ["default_config_path", "describe", "effective_request", "make_tool"]

HostFunction = Callable[..., Any]


def effective_request(pool: Pool | None, profile: str | None, grants: Mapping[str, Any]) -> Request:
    """The grants ``pool`` (``None``: the default pool) will apply: profile merged, ceiling checked.

    Adapters use it to describe a tool and to clamp what a caller may ask for; a bad grant fails here,
    when the tool is made, not at the model's first call."""
    from .client import build_request

    config_path = pool.config_path if pool is not None else default_config_path()
    config = load_config(config_path) if config_path else EMPTY
    request = msgspec.convert(build_request(profile=profile, **grants), Request)
    return config.apply(request, os.getcwd())


def default_config_path() -> str | None:
    """``$PYNOX_CONFIG``, else ``pynox.toml`` in the working directory if there is one."""
    path = os.environ.get("PYNOX_CONFIG")
    if path:
        return os.path.abspath(path)
    return os.path.abspath("pynox.toml") if os.path.isfile("pynox.toml") else None


def _signature(name: str, function: HostFunction) -> str:
    try:
        signature = str(visible_signature(function))
    except (TypeError, ValueError):
        signature = "(*args, **kwargs)"
    summary = (inspect.getdoc(function) or "").strip().split("\n\n")[0].replace("\n", " ")
    return f"{name}{signature}" + (f": {summary}" if summary else "")


def describe(request: Request, *, session: bool, functions: Mapping[str, HostFunction] | None,
             preloaded: list[str]) -> str:
    """The docstring of a ``run_python`` tool for these grants."""
    cwd = os.getcwd()
    read = [resolve_path(p, cwd, "allow_read") for p in request.allow_read or ()]
    write = [resolve_path(p, cwd, "allow_write") for p in request.allow_write or ()]
    timeout = parse_duration(request.timeout, "timeout") if request.timeout is not None else DEFAULTS.timeout
    memory = parse_size(request.memory, "memory") if request.memory is not None else DEFAULTS.memory
    max_output = (parse_size(request.max_output, "max_output") if request.max_output is not None
                  else DEFAULTS.max_output)
    if session:
        lifetime = ("Calls share one Python process, like notebook cells: variables, imports and functions "
                    "defined in one call are there in the next. If a call times out or crashes, the process "
                    "is replaced and that state is lost (the result says so).")
    else:
        lifetime = "Each call runs in a fresh process: nothing (variables, imports, files in memory) survives it."
    lines = [
        "Run Python code in an isolated sandbox and return what it prints.",
        "",
        f"{lifetime} Only printed output comes back, so print() the results you need. Errors come back as "
        "the exception type, message and line, with a hint when the sandbox refused something.",
        "",
        "What the code may do:",
        f"- Read files: {', '.join(read + write) or 'none'} (plus the Python standard library and installed "
        "packages).",
        f"- Write files: {', '.join(write) or 'nowhere'}.",
        f"- Network: {'allowed' if request.allow_network else 'not allowed'}. Starting programs or "
        "subprocesses: not allowed.",
        f"- Limits per call: {format_duration(timeout)} of time, {format_size(memory)} of memory, "
        f"{format_size(max_output)} of printed output.",
    ]
    if preloaded:
        lines.append(f"- Already imported, fast to use: {', '.join(preloaded)}.")
    if functions:
        names = ", ".join(functions)
        lines += ["", f"Host functions (import them with `from pynox_host import {names}`); they run in the "
                  "host application, take and return JSON values, and raise pynox_host.HostError on failure:"]
        lines += [f"- {_signature(name, fn)}" for name, fn in functions.items()]
    lines += [
        "",
        "Permissions are set by the host. If the task needs more, say so instead of trying to work around it.",
        "",
        "Args:",
        "    code: Python source code to run, as a complete script.",
        "",
        "Returns:",
        "    The printed output, followed by any error and a hint.",
    ]
    return "\n".join(lines)


def make_tool(pool: Pool | None, *, profile: str | None, session: bool,
              functions: Mapping[str, HostFunction] | None, grants: Mapping[str, Any],
              host_errors: HostErrors | None = None) -> Callable[[str], str]:
    """Build ``run_python`` on ``pool`` (``None``: the default pool, started on the first call)."""
    from .client import default_pool

    for name in functions or ():
        if not name.isidentifier() or name.startswith("_"):
            raise PynoxError(f"host function name {name!r} must be a public Python identifier")
    effective = effective_request(pool, profile, grants)
    preloaded = list(pool.ready.get("preloaded_modules", [])) if pool is not None else []
    doc = describe(effective, session=session, functions=functions, preloaded=preloaded)
    run_grants = {**grants, **({"profile": profile} if profile else {})}
    state: dict[str, Session] = {}

    def close() -> None:
        """End the tool's session (if any); the next call starts a fresh one."""
        session_ = state.pop("session", None)
        if session_ is not None:
            session_.close()

    def run(code: str) -> str:
        target = pool if pool is not None else default_pool()
        if session:
            if "session" not in state:
                state["session"] = target.session(functions=functions, host_errors=host_errors, **run_grants)
            return state["session"].run(code).text
        return target.run(code, functions=functions, host_errors=host_errors, **run_grants).text

    def run_python(code: str) -> str:
        if not isinstance(code, str):
            return f"Error: code must be a string of Python source, got {type(code).__name__}."
        try:
            return run(code)
        except PynoxError as exc:  # a refusal or a broken pool: tell the model, don't crash its agent
            return f"{type(exc).__name__}: {exc}"

    run_python.__doc__ = doc
    # Real types, not the strings `from __future__ import annotations` leaves: frameworks inspect them.
    run_python.__annotations__ = {"code": str, "return": str}
    run_python.close = close  # type: ignore[attr-defined]  # a session tool's state lives until closed
    return run_python
