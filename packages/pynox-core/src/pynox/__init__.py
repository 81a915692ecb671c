"""Pynox: run model-written Python in a fresh, kernel-confined process, in milliseconds.

    run_python = pynox.tool(allow_write=["out"], timeout="10s")
    run_python("print(2 + 2)")          # '4'

``tool()`` gives a model a ``run_python(code) -> str`` function; ``run()``
returns a :class:`Result`; :class:`Pool` and :class:`Session` give explicit
control. Every failure of the sandboxed code is a ``Result``; exceptions are
for Pynox's own failures (see :mod:`pynox.errors`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Unpack

from .errors import (
    ConfigError,
    HostError,
    JobError,
    KernelSupportError,
    PoolError,
    PoolWorkerError,
    PynoxError,
    RequestError,
    SandboxSetupError,
    SessionStateError,
)
from .grant_types import Grants, RunGrants, SessionGrants, check_grants

if TYPE_CHECKING:
    from .client.code_tool import CodeTool, ToolDescription, ToolGrants
    from .client.files import FileInfo
    from .client.pool import Pool, PynoxPool, Session
    from .client.result import Output, Result, Usage
    from .client.runner import Runner, SessionRunner
    from .client.saved import SavedSession
    from .client.streaming import OutputEvent, StreamText
    from .grant_flags import add_grant_arguments, grant_argv, grants_from_arguments
    from .units import format_duration, format_size, parse_duration, parse_size

__version__ = "0.1.0"

__all__ = [
    "CodeTool",
    "ConfigError",
    "FileInfo",
    "Grants",
    "HostError",
    "JobError",
    "KernelSupportError",
    "Output",
    "OutputEvent",
    "Pool",
    "PoolError",
    "PoolWorkerError",
    "PynoxError",
    "PynoxPool",
    "RequestError",
    "Result",
    "RunGrants",
    "Runner",
    "SandboxSetupError",
    "SavedSession",
    "Session",
    "SessionGrants",
    "SessionRunner",
    "SessionStateError",
    "StreamText",
    "ToolDescription",
    "ToolGrants",
    "Usage",
    "__version__",
    "add_grant_arguments",
    "check_grants",
    "format_duration",
    "format_size",
    "grant_argv",
    "grants_from_arguments",
    "parse_duration",
    "parse_size",
    "run",
    "tool",
]


_LAZY = {"Pool": "client.pool", "PynoxPool": "client.pool", "Session": "client.pool", "Result": "client.result",
         "SavedSession": "client.saved",
         "CodeTool": "client.code_tool", "ToolDescription": "client.code_tool", "ToolGrants": "client.code_tool",
         "Usage": "client.result", "Output": "client.result", "OutputEvent": "client.streaming",
         "StreamText": "client.streaming",
         "FileInfo": "client.files", "Runner": "client.runner", "SessionRunner": "client.runner",
         "format_duration": "units", "format_size": "units", "parse_duration": "units",
         "parse_size": "units", "add_grant_arguments": "grant_flags", "grant_argv": "grant_flags",
         "grants_from_arguments": "grant_flags"}


def __getattr__(name: str) -> Any:
    # The client (asyncio, threads, subprocess) loads on first use: the template imports this package
    # too, and every module it holds is memory each job's fork copies on write.
    if name in _LAZY:
        from importlib import import_module

        value = getattr(import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'pynox' has no attribute {name!r}")


def run(code: str | None = None, *, functions: Mapping[str, Callable[..., Any]] | None = None,
        **grants: Unpack[RunGrants]) -> Result:
    """Run code on the default pool (started on first use, closed at exit); see :meth:`Pool.run`."""
    from .client.default import default_pool

    return default_pool().run(code, functions=functions, **grants)


def tool(profile: str | None = None, *, session: bool = False,
         functions: Mapping[str, Callable[..., Any]] | None = None, host_errors: str | None = None,
         **grants: Unpack[Grants]) -> Callable[[str], str]:
    """A ``run_python(code: str) -> str`` function for a model, on the default pool.

    Permissions come from ``profile`` (in ``$PYNOX_CONFIG`` or ``./pynox.toml``) and from ``grants``
    (allow_read, allow_write, allow_network, allow_hosts, env, timeout, memory, max_output, max_file_size,
    package_dirs): never from the model. ``session=True`` keeps variables between calls;
    ``functions`` lets the code call the host's own functions through ``pynox_host``; a function's
    exception reaches the code only as its type unless it is a :class:`HostError`, or
    ``host_errors="full"``.
    """
    from .client.model_tool import make_tool

    return make_tool(None, profile=profile, session=session, functions=functions, grants=grants,
                     host_errors=host_errors)  # type: ignore[arg-type]  # host_errors: checked by the pool's run
