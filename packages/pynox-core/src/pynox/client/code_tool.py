"""``CodeTool``: one code-execution tool for a model, the object every framework adapter builds on.

A tool is fixed by the host when it is made: its pool, profile and grants (checked
then, so a bad grant fails at once, not at the model's first call), its host
functions and whether calls share a session. It carries what the model is told,
as parts (:class:`ToolDescription`) and as one docstring, and what the job will be
confined with (:class:`ToolGrants`), as data, so no adapter re-parses text.
:func:`pynox.tool` is the plain ``run_python(code: str) -> str`` function over one.

A failure of the model's code is a :class:`~pynox.Result`; a :class:`~pynox.PynoxError`
(a refused request, a broken pool) is raised by :meth:`CodeTool.run`, and becomes
text in :meth:`CodeTool.text`, because an exception would abort the agent's run
instead of letting the model read what happened.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import inspect
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TypeGuard, Unpack

from .. import hints
from ..config import EMPTY, default_config_path, load_config
from ..defaults import DEFAULTS
from ..errors import ConfigError, KernelSupportError, PynoxError
from ..grant_types import Grants, check_grants
from ..grants import refuse_write_grant, request_hosts, resolve_path
from ..hosts import one_port_each
from ..names import FUNCTION_RULE, is_function_name
from ..protocol import IMPORTABLE_LISTED, Request
from ..units import format_duration, format_size, parse_duration, parse_size
from .host_functions import HostErrors, visible_signature
from .requests import build_request
from .runner import PoolSession, Runner, SessionRunner, default_runner
from .streaming import OutputCallback

if TYPE_CHECKING:
    from .files import FileInfo
    from .pool import Session
    from .result import Result
    from .saved import SavedSession

__all__ = ["CodeTool", "ToolDescription", "ToolGrants"]

# Failures only the operator can mend (this machine cannot confine code, the config is wrong): they are
# raised from the tool, as from the pool, never handed to the model, which could only retry in vain.
_OPERATORS_ERRORS = (KernelSupportError, ConfigError)

HostFunction = Callable[..., Any]


@dataclass(frozen=True)
class ToolGrants:
    """What every call of the tool is confined with: its profile merged, under the config's ceiling."""

    read: tuple[str, ...]  # absolute paths the code may read (the write grants too)
    write: tuple[str, ...]  # absolute paths the code may read and write
    network: bool
    hosts: tuple[str, ...]  # allow_hosts, one port each (moot with the network)
    timeout: float  # seconds per call
    memory: int  # bytes
    max_output: int  # bytes of stdout and of stderr each
    max_file_size: int | None
    env: tuple[str, ...]  # the names of the variables the host passes (not their values)
    profile: str | None
    scratch: bool = False  # the code works in a scratch directory of the pool's (its files go in and out)
    packages: tuple[str, ...] = ()  # installed by the pool for every call (the packages grant)

    @property
    def network_text(self) -> str:
        """What the code's network is, as the model is told it."""
        if self.network:
            return "allowed"
        if self.hosts:
            return f"TCP connections to {', '.join(self.hosts)} only (no other hosts or ports, no UDP)"
        return "not allowed"


@dataclass(frozen=True)
class ToolDescription:
    """What the model is told, in parts; :attr:`text` is them as one docstring (``Args:``, ``Returns:``)."""

    summary: str  # one line
    usage: str  # how calls behave: their lifetime, what comes back
    permissions: tuple[str, ...]  # "Read files: ...", one line each, as the model reads them
    functions: tuple[str, ...]  # "name(signature): summary" of each host function
    functions_intro: str  # how to import them ("" without host functions)
    closing: str  # what to do when the grants are not enough
    code: str  # the ``code`` argument
    returns: str

    @property
    def rules(self) -> str:
        """What the code may do, the host functions and the closing line: a system prompt's instructions."""
        lines = ["What the code may do:", *(f"- {line}" for line in self.permissions)]
        if self.functions:
            lines += ["", self.functions_intro, *(f"- {line}" for line in self.functions)]
        return "\n".join([*lines, "", self.closing])

    @property
    def body(self) -> str:
        """Everything but the summary and the argument sections."""
        return f"{self.usage}\n\n{self.rules}"

    @property
    def text(self) -> str:
        return "\n".join([self.summary, "", self.body, "", "Args:", f"    code: {self.code}", "",
                          "Returns:", f"    {self.returns}"])


def _is_session(value: object) -> TypeGuard[Session]:
    """Whether ``value`` is a :class:`pynox.Session` (its nominal base lives below pool.py: see runner.py)."""
    return isinstance(value, PoolSession)


def _effective_request(pool: Runner | None, profile: str | None, grants: Mapping[str, Any]) -> Request:
    """The request ``pool`` (``None``: the default pool) will apply: profile merged, ceiling checked."""
    config_path = pool.config_path if pool is not None else default_config_path()
    config = load_config(config_path) if config_path else EMPTY
    return config.apply(build_request(profile=profile, **grants), _cwd(pool))


def _cwd(pool: Runner | None) -> str:
    """Where ``pool`` resolves relative grants (its process's directory; the default pool starts here)."""
    return pool.cwd if pool is not None else os.getcwd()


def _tool_grants(request: Request, pool: Runner | None) -> ToolGrants:
    cwd = _cwd(pool)
    write = tuple(resolve_path(p, cwd, "allow_write") for p in request.allow_write or ())
    # The pool's own rule, now rather than at each run, where the model would get a refusal it cannot mend.
    # A pool not started yet (the default one) has not said where its runtime lives: it refuses at the run.
    if pool is not None:
        for path in write:
            refuse_write_grant(path, pool.ready.get("runtime_paths", []))
    return ToolGrants(
        read=tuple(resolve_path(p, cwd, "allow_read") for p in request.allow_read or ()) + write,
        write=write,
        network=bool(request.allow_network),
        hosts=() if request.allow_network else tuple(one_port_each(request_hosts(request.allow_hosts))),
        timeout=parse_duration(request.timeout, "timeout") if request.timeout is not None else DEFAULTS.timeout,
        memory=parse_size(request.memory, "memory") if request.memory is not None else DEFAULTS.memory,
        max_output=(parse_size(request.max_output, "max_output") if request.max_output is not None
                    else DEFAULTS.max_output),
        max_file_size=parse_size(request.max_file_size, "max_file_size") if request.max_file_size is not None
        else None,
        env=tuple(request.env or {}),
        profile=request.profile,
        scratch=bool(request.scratch),
        packages=tuple(request.packages or ()),
    )


def _signature(name: str, function: HostFunction) -> str:
    try:
        signature = str(visible_signature(function))
    except (TypeError, ValueError):
        signature = "(*args, **kwargs)"
    # A partial (a keyword the host fixed, a framework's context) is described by the function it wraps.
    described = function.func if isinstance(function, functools.partial) else function
    summary = (inspect.getdoc(described) or "").strip().split("\n\n")[0].replace("\n", " ")
    return f"{name}{signature}" + (f": {summary}" if summary else "")


def _importable(pool: Runner | None) -> tuple[list[str], list[str]]:
    """What the tool's jobs can import (the preloaded modules first) and which of those are preloaded: as the
    pool's ready event says, or, for the default pool not started yet, as this interpreter (which it runs) has."""
    if pool is None:
        return hints.importable((), (), IMPORTABLE_LISTED), []
    preloaded = list(pool.ready.get("preloaded_modules", []))
    return list(pool.ready.get("importable", [])), preloaded


def _describe(grants: ToolGrants, *, session: bool, functions: Mapping[str, HostFunction] | None,
              preloaded: list[str], session_scope: str | None = None,
              importable: list[str] | None = None) -> ToolDescription:
    if session:
        lifetime = (f"Calls share one Python process{' ' if session_scope else ''}{session_scope or ''}, like "
                    "notebook cells: variables, imports and functions defined in one call are there in the "
                    "next. If a call times out, crashes or is cancelled, the process is replaced and that state "
                    "is lost (the result says so).")
    else:
        lifetime = "Each call runs in a fresh process: nothing (variables, imports, files in memory) survives it."
    permissions = [
        f"Read files: {', '.join(grants.read) or 'none'} (plus the Python standard library and the importable "
        "packages).",
        f"Write files: {', '.join(grants.write) or 'nowhere'}." if not grants.scratch else
        "Write files: the working directory, a scratch directory of its own (files written there, like "
        f"open('out.csv', 'w'), reach the user, who can also put files there){', and ' if grants.write else ''}"
        f"{', '.join(grants.write)}.",
        f"Network: {grants.network_text}. Starting programs or subprocesses: not allowed.",
        f"Limits per call: {format_duration(grants.timeout)} of time, {format_size(grants.memory)} of memory, "
        f"{format_size(grants.max_output)} of printed output.",
    ]
    if preloaded:
        permissions.append(f"Already imported, fast to use: {', '.join(preloaded)}.")
    if importable:
        permissions.append(f"Importable packages beyond the standard library: {', '.join(importable)}. Code cannot "
                           "install packages (no pip, no shell commands or magics).")
    if grants.packages:
        permissions.append(f"Installed for this tool: {', '.join(grants.packages)}.")
    names = ", ".join(functions or ())
    return ToolDescription(
        summary="Run Python code in an isolated sandbox and return what it prints.",
        usage=f"{lifetime} What the code prints comes back, then what it wrote to stderr. The value of a "
              "final expression comes back too, as `Out: ...`, like a notebook cell, and so do matplotlib "
              "figures (shown with plt.show() or left open), as images. Errors come back as the "
              "exception type, message and failing line, with a hint when the sandbox refused something.",
        permissions=tuple(permissions),
        functions=tuple(_signature(name, fn) for name, fn in (functions or {}).items()),
        functions_intro=f"Host functions (import them with `from pynox_host import {names}`); they run in the "
                        "host application, take and return JSON values, and raise pynox_host.HostError on "
                        "failure. Calls from threads, or awaited together from `pynox_host.aio`, run at the "
                        "same time (8 at most):" if functions else "",
        closing="Permissions are set by the host. If the task needs more, say so instead of trying to work "
                "around it.",
        code="Python source code to run, as a complete script.",
        returns="The printed output and stderr, the final expression's value, then any error with a hint.",
    )


class CodeTool:
    """One tool for a model to run Python with, on ``pool`` (``None``: the default pool, started on first use).

    ``session``: ``False`` runs each call in a fresh process; ``True`` keeps one session the tool owns,
    started by the first call and ended by :meth:`close` (:meth:`for_run` gives a copy with a session of
    its own, for frameworks whose state lives per agent run); a :class:`pynox.Session` is used as it is and
    stays the caller's to close. ``session_scope`` says to the model what one session spans, as the framework
    keeps it ("within one agent run": "Calls share one Python process within one agent run").
    ``host_globals`` binds the host functions as globals of the code too (see :meth:`pynox.Pool.run`). Raises
    :class:`pynox.RequestError` (or ``ConfigError``) for a grant or profile the pool would refuse.
    """

    def __init__(self, pool: Runner | None = None, *, profile: str | None = None, session: bool | Session = False,
                 functions: Mapping[str, HostFunction] | None = None, host_errors: HostErrors | None = None,
                 session_scope: str | None = None, host_globals: Literal["call", "await"] | None = None,
                 **grants: Unpack[Grants]) -> None:
        check_grants(f"{type(self).__name__}()", grants)
        requested: dict[str, Any] = dict(grants)
        if _is_session(session):
            if (pool is not None or profile is not None or functions or grants or host_errors is not None
                    or host_globals is not None):
                raise TypeError("a pynox.Session carries its own pool, permissions and functions: pass it alone")
            pool = session.pool
            requested = dict(session.grants)
            profile = requested.pop("profile", None)
            host_globals = requested.pop("host_globals", None)
            functions = session.functions or None
        for name in functions or ():
            if not is_function_name(name):
                raise PynoxError(f"host function name {name!r} {FUNCTION_RULE}")
        self.grants: ToolGrants = _tool_grants(_effective_request(pool, profile, requested), pool)
        importable, preloaded = _importable(pool)
        self.description: ToolDescription = _describe(self.grants, session=bool(session), functions=functions,
                                                      preloaded=preloaded, session_scope=session_scope,
                                                      importable=importable)
        self._pool = pool
        self._functions = dict(functions) if functions else None
        self._host_errors = host_errors
        # The host functions as globals of the code too (see Pool.run), fixed with the tool.
        self._host_globals = host_globals
        self._grants = {**requested, **({"profile": profile} if profile else {})}
        self.owns_session = session is True
        self._session: SessionRunner | None = session if _is_session(session) else None

    @property
    def doc(self) -> str:
        """The docstring a model reads (:attr:`description` as one text)."""
        return self.description.text

    @property
    def requested(self) -> dict[str, Any]:
        """The grants as the host asked for them, ``profile`` among them, before profile and ceiling apply: an
        equal tool is ``CodeTool(pool, session=..., **tool.requested)`` (adapters save a tool this way)."""
        return dict(self._grants)

    @property
    def functions(self) -> tuple[str, ...]:
        """The names of the host functions the code may call."""
        return tuple(self._functions or ())

    @property
    def uses_session(self) -> bool:
        """Whether calls share one process (calls must then not run concurrently)."""
        return self.owns_session or self._session is not None

    def for_run(self) -> CodeTool:
        """A tool with the same grants and, if this one owns its session, a session of its own not yet started."""
        fresh = copy.copy(self)
        if self.owns_session:
            fresh._session = None
        return fresh

    @property
    def pool(self) -> Runner:
        """The pool calls run on (the default pool is started here, on first use)."""
        return self._target()

    def _target(self) -> Runner:
        if self._pool is None:
            self._pool = default_runner()
        return self._pool

    def _call(self, timeout: float | None, env: Mapping[str, str] | None, fresh: bool,
              functions: Mapping[str, HostFunction] | None = None) -> tuple[SessionRunner | None, dict[str, Any]]:
        """Where a call runs (its session, or None for a fresh process) and the keywords of its run."""
        if functions is not None:
            unknown = sorted(set(functions) - set(self._functions or ()))
            if unknown:
                raise PynoxError(f"host functions of one call must be the tool's own, under its names; not "
                                 f"among them: {', '.join(unknown)}")
        self._target()  # the default pool starts here, on first use
        seconds = min(timeout, self.grants.timeout) if timeout is not None else None
        if not fresh:
            self._own_session()
        if not fresh and self._session is not None:
            if env:
                raise ValueError("a session's environment is fixed when it starts: env cannot change per call")
            return self._session, {"timeout": seconds, "functions": functions}
        grants = dict(self._grants)
        if env:
            grants["env"] = {**(grants.get("env") or {}), **env}
        if seconds is not None:
            grants["timeout"] = seconds
        callables = {**(self._functions or {}), **(functions or {})} or None
        return None, {"functions": None if fresh else callables, "host_errors": self._host_errors,
                      "host_globals": None if fresh else self._host_globals, **grants}

    def run(self, code: str, *, timeout: float | None = None, env: Mapping[str, str] | None = None,
            fresh: bool = False, functions: Mapping[str, HostFunction] | None = None,
            on_output: OutputCallback | None = None) -> Result:
        """Run ``code`` (in the session, unless ``fresh``); raises :class:`pynox.PynoxError` only for Pynox's
        own failures. ``timeout`` (seconds) may only shorten the tool's; ``env`` adds to the tool's;
        ``functions`` replaces host functions of the tool, under their names, for this call only (a
        framework's run context bound into them, say). ``on_output``: output as it happens (see
        :meth:`pynox.Pool.run`)."""
        session, keywords = self._call(timeout, env, fresh, functions)
        if on_output is not None:  # only when asked: a pool over another transport may not stream
            keywords["on_output"] = on_output
        if session is not None:
            return session.run(code, **keywords)
        return self._target().run(code, **keywords)

    async def arun(self, code: str, *, timeout: float | None = None, env: Mapping[str, str] | None = None,
                   fresh: bool = False, functions: Mapping[str, HostFunction] | None = None,
                   on_output: OutputCallback | None = None) -> Result:
        """:meth:`run`, awaitable; starting the default pool (which waits for its templates) is off the loop."""
        if self._pool is None:
            await asyncio.to_thread(self._target)
        session, keywords = self._call(timeout, env, fresh, functions)
        if on_output is not None:
            keywords["on_output"] = on_output
        if session is not None:
            return await session.arun(code, **keywords)
        return await self._target().arun(code, **keywords)

    def text(self, code: str) -> str:
        """What the model reads: the run's text, or what went wrong in Pynox itself."""
        if not isinstance(code, str):
            return f"Error: code must be a string of Python source, got {type(code).__name__}."
        try:
            return self.run(code).text
        except _OPERATORS_ERRORS:
            raise
        except PynoxError as exc:  # a refusal or a broken pool: tell the model, don't crash its agent
            return f"{type(exc).__name__}: {exc}"

    async def atext(self, code: str) -> str:
        """:meth:`text`, awaitable."""
        if not isinstance(code, str):
            return f"Error: code must be a string of Python source, got {type(code).__name__}."
        try:
            return (await self.arun(code)).text
        except _OPERATORS_ERRORS:
            raise
        except PynoxError as exc:
            return f"{type(exc).__name__}: {exc}"

    def _own_session(self) -> SessionRunner | None:
        """The tool's session (the one it owns is made here, not yet started), or None without one."""
        if self.owns_session and self._session is None:
            self._session = self._target().session(functions=self._functions, host_errors=self._host_errors,
                                                   host_globals=self._host_globals, **self._grants)
        return self._session

    @property
    def alive(self) -> bool:
        """Whether the tool's session holds a process (and so variables) now."""
        return self._session is not None and self._session.alive

    def save(self) -> SavedSession | None:
        """The tool's session's state (see :meth:`pynox.Session.save`), or None while it holds no process."""
        session = self._session
        if not _is_session(session) or not session.alive:
            return None
        return session.save()

    async def asave(self) -> SavedSession | None:
        """:meth:`save`, off the event loop."""
        return await asyncio.to_thread(self.save)

    def restore(self, state: SavedSession | bytes) -> None:
        """Start the tool's own session afresh from ``state`` (a :meth:`save` of a pool with the same key): its
        next call runs with those variables, under this tool's grants. Ends the session it has now, if any."""
        if not self.owns_session:
            raise PynoxError("only a tool that owns its session (session=True) restores one")
        self.close()
        self._session = self._target().session(functions=self._functions, host_errors=self._host_errors,
                                               host_globals=self._host_globals, restore=state, **self._grants)

    def _files_session(self) -> Session:
        session = self._own_session()
        if not _is_session(session) or not self.grants.scratch:
            raise PynoxError("this tool has no files: they live in a session's scratch directory (make the tool "
                             "with session=True and scratch=True, on a pynox.Pool)")
        return session

    def files(self) -> list[FileInfo]:
        """The files of the tool's session's scratch directory; none before its first call."""
        session = self._files_session()
        return session.files() if session.alive else []

    def download(self, path: str) -> bytes:
        """A file of the tool's session's scratch directory (see :meth:`pynox.Session.download`)."""
        return self._files_session().download(path)

    def upload(self, path: str, data: bytes) -> FileInfo:
        """Put a file in the tool's session's scratch directory (it starts the session if it has none yet)."""
        return self._files_session().upload(path, data)

    async def afiles(self) -> list[FileInfo]:
        """:meth:`files`, off the event loop."""
        return await asyncio.to_thread(self.files)

    async def adownload(self, path: str) -> bytes:
        """:meth:`download`, off the event loop."""
        return await asyncio.to_thread(self.download, path)

    async def aupload(self, path: str, data: bytes) -> FileInfo:
        """:meth:`upload`, off the event loop."""
        return await asyncio.to_thread(self.upload, path, data)

    def close(self) -> None:
        """End the session this tool owns, if one was started (the next call starts a fresh one). A caller's
        session is left alone."""
        if not self.owns_session or self._session is None:
            return
        session, self._session = self._session, None
        session.close()

    async def aclose(self) -> None:
        """:meth:`close`, without holding up the event loop while the pool confirms."""
        await asyncio.to_thread(self.close)
