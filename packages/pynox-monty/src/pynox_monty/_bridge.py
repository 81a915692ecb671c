"""The bridge: ``run_python`` as a Monty external function, its permissions fixed by the host.

``Monty`` calls external functions synchronously on the thread that called
``feed_run`` and needs plain data back, so :func:`python_function` blocks on
``Pool.run``. ``AsyncMonty`` awaits coroutine functions on the caller's event
loop, so :func:`async_python_function` awaits ``Pool.arun``: calls the glue
code gathers run at once, and the loop runs on while they do. Everything the
heavy code did wrong (raised, was denied a path, timed out) is data the glue
code can branch on; only a broken pool raises.
"""

from __future__ import annotations

import builtins
import functools
import inspect
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, NoReturn, Unpack

import pynox
from pynox import Grants, SessionGrants, check_grants, format_duration, parse_duration

from ._result import glue_result, refused
from ._stubs import declare

__all__ = ["async_external_lookup", "async_python_function", "external_lookup", "python_function"]

HostFunction = Callable[..., Any]
_STUB_SIGNATURE = "(code: str, timeout: str | int | float | None = None) -> RunPythonResult"


class LookupOptions(SessionGrants, total=False):
    """:func:`python_function`'s keywords, as :func:`external_lookup` passes them on."""

    name: str


class _Bridge:
    """What every call of one ``run_python`` shares: the pool, the host's grants and limit, the host functions."""

    def __init__(self, pool: pynox.Pool, *, profile: str | None, name: str,
                 functions: Mapping[str, HostFunction] | None, grants: Grants) -> None:
        # The grants after profile and ceiling, exactly as the pool will apply them (a bad one raises here).
        self.effective = pynox.CodeTool(pool, profile=profile, functions=functions, **grants).grants
        self.functions = dict(functions or {})
        self._grants = {"name": name, **grants, **({"profile": profile} if profile else {})}

    def request(self, code: str, timeout: str | int | float | None) -> tuple[dict[str, Any], float]:
        """The keywords of one run and the timeout it gets; a bad argument from the glue code raises here."""
        if not isinstance(code, str):  # the glue code's value, whatever the annotation says
            raise TypeError(f"run_python() code must be a str of Python source, not {type(code).__name__}")
        limit = self.effective.timeout
        if timeout is None:
            return {**self._grants, "functions": self.functions}, limit
        try:
            asked = parse_duration(timeout, "timeout")
        except ValueError as exc:
            raise ValueError(str(exc)) from None  # a builtin type: Monty shows a custom one as Exception
        given = min(asked, limit)
        return {**self._grants, "functions": self.functions, "timeout": given}, given

    def answer(self, run: Callable[[], pynox.Result], given: float) -> dict[str, Any]:
        try:
            result = run()
        except pynox.RequestError as exc:
            return refused(str(exc))
        except pynox.PynoxError as exc:
            raise RuntimeError(f"{type(exc).__name__}: {exc}") from None
        return glue_result(result, given=given, host_limit=self.effective.timeout)

    async def answer_async(self, run: Callable[[], Awaitable[pynox.Result]], given: float) -> dict[str, Any]:
        try:
            result = await run()
        except pynox.RequestError as exc:
            return refused(str(exc))
        except pynox.PynoxError as exc:
            raise RuntimeError(f"{type(exc).__name__}: {exc}") from None
        return glue_result(result, given=given, host_limit=self.effective.timeout)


def python_function(pool: pynox.Pool, *, profile: str | None = None, name: str = "heavy.py",
                    functions: Mapping[str, HostFunction] | None = None,
                    **grants: Unpack[Grants]) -> Callable[..., dict[str, Any]]:
    """The ``run_python(code, timeout=None) -> dict`` external function for ``Monty``, running on ``pool``.

    ``profile`` and ``grants`` (allow_read, allow_write, allow_network, allow_hosts, env, memory, max_output,
    max_file_size, package_dirs, timeout) fix what the code may do; the model's code cannot change them.
    ``timeout`` is the host's limit per call: the glue code may pass a shorter one, and a longer one is cut to
    it. ``functions`` are host functions the heavy code may import from ``pynox_host``. A bad grant raises here.
    """
    check_grants("python_function()", grants)
    bridge = _Bridge(pool, profile=profile, name=name, functions=functions, grants=grants)

    def run_python(code: str, timeout: str | int | float | None = None) -> dict[str, Any]:
        keywords, given = bridge.request(code, timeout)
        return bridge.answer(lambda: pool.run(code, **keywords), given)

    run_python.__doc__ = _docstring(bridge.effective, bridge.functions)
    declare(run_python, _STUB_SIGNATURE)
    return run_python


def async_python_function(pool: pynox.Pool, *, profile: str | None = None, name: str = "heavy.py",
                          functions: Mapping[str, HostFunction] | None = None,
                          **grants: Unpack[Grants]) -> Callable[..., Awaitable[dict[str, Any]]]:
    """:func:`python_function` for ``AsyncMonty``: ``async def run_python``, over ``Pool.arun``. The glue code
    awaits it; calls it gathers (``asyncio.gather``) run at once, as many as the pool has workers."""
    check_grants("async_python_function()", grants)
    bridge = _Bridge(pool, profile=profile, name=name, functions=functions, grants=grants)

    async def run_python(code: str, timeout: str | int | float | None = None) -> dict[str, Any]:
        keywords, given = bridge.request(code, timeout)
        return await bridge.answer_async(lambda: pool.arun(code, **keywords), given)

    run_python.__doc__ = _docstring(bridge.effective, bridge.functions)
    declare(run_python, _STUB_SIGNATURE)
    return run_python


def external_lookup(pool: pynox.Pool, *, functions: Mapping[str, HostFunction] | None = None,
                    **options: Unpack[LookupOptions]) -> dict[str, HostFunction]:
    """The ``external_lookup`` mapping for ``MontySession.feed_run``: ``run_python`` (see :func:`python_function`,
    which takes the same ``options``) and each host function in ``functions``.

    A host function is callable both from the Monty glue code (by its name) and from the heavy code (through
    ``pynox_host``). An exception it raises reaches Monty with its type name in the message. An ``async def``
    one needs :func:`async_external_lookup` (``Monty`` has no event loop to run it on). Declare them all to
    Monty's type checker with :func:`pynox_monty.type_stubs`.
    """
    functions = _host_functions(functions)
    for name, function in functions.items():
        if inspect.iscoroutinefunction(function):
            raise TypeError(f"{name} is an async function: Monty calls external_lookup's functions without an "
                            "event loop; use async_external_lookup with AsyncMonty (or give it to python_function "
                            "alone, for the heavy code)")
    lookup: dict[str, HostFunction] = {"run_python": python_function(pool, functions=functions, **options)}
    lookup.update({name: _readable_errors(name, function) for name, function in functions.items()})
    return lookup


def async_external_lookup(pool: pynox.Pool, *, functions: Mapping[str, HostFunction] | None = None,
                          **options: Unpack[LookupOptions]) -> dict[str, HostFunction]:
    """:func:`external_lookup` for ``AsyncMontySession.feed_run``: ``run_python`` is
    :func:`async_python_function`, and host functions may be ``async def`` (the glue code awaits those; the
    heavy code calls them as it calls any other, and they are awaited on the loop that awaits run_python)."""
    functions = _host_functions(functions)
    lookup: dict[str, HostFunction] = {"run_python": async_python_function(pool, functions=functions, **options)}
    lookup.update({name: _readable_errors(name, function) for name, function in functions.items()})
    return lookup


def _host_functions(functions: Mapping[str, HostFunction] | None) -> dict[str, HostFunction]:
    functions = dict(functions or {})
    if "run_python" in functions:
        raise ValueError("'run_python' is the bridge's own name: give the host function another one")
    return functions


def _readable_error(name: str, exc: Exception) -> Exception:
    """Monty turns an exception type it does not know into a bare ``Exception``: keep the type in the message."""
    if getattr(builtins, type(exc).__name__, None) is type(exc):
        return exc
    return RuntimeError(f"{name}() failed: {type(exc).__name__}: {exc}")


def _readable_errors(name: str, function: HostFunction) -> HostFunction:
    if inspect.iscoroutinefunction(function):

        @functools.wraps(function)
        async def call_async(*args: Any, **kwargs: Any) -> Any:
            try:
                return await function(*args, **kwargs)
            except Exception as exc:
                _raise_readable(name, exc)

        return call_async

    @functools.wraps(function)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except Exception as exc:
            _raise_readable(name, exc)

    return call


def _raise_readable(name: str, exc: Exception) -> NoReturn:
    """Raise ``exc`` as Monty can show it (called while ``exc`` is being handled, so it stays the cause)."""
    readable = _readable_error(name, exc)
    if readable is exc:
        raise exc
    raise readable from exc


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
        f"{', '.join(write) or 'no files'}; network: {grants.network_text}. "
        f"Each call may run for {format_duration(grants.timeout)}; `timeout` can only shorten that.",
    ]
    if functions:
        lines.append(f"It can call the host's functions with `from pynox_host import {', '.join(functions)}`.")
    return "\n".join(lines)
