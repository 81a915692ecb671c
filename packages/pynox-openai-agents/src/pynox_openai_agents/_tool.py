"""``python_tool``: Pynox's ``run_python`` as an OpenAI Agents SDK ``FunctionTool``, failing as its tools fail.

* The tool is made by the SDK's own ``function_tool``, so the Runner validates its arguments, traces it
  and applies its failure policy as for any function tool. It is async and awaits ``Pool.arun``.
* A failed run (an exception, a non-zero exit, a timeout, a denial, a refusal by Pynox) raises inside
  the tool, and the SDK's failure path (``failure_error_function``) turns it into the text the model
  reads: error type, failing line, hint. The run goes on, and the SDK records a handled tool error
  (its span carries the error). A failure only the operator can mend (no kernel support, a bad
  config) is not handed to the model: it fails the run, as the core's tool raises it.
* Figures the code drew come back as ``ToolOutputImage`` items (PNG data URLs) after the text.
* ``session=True``: state is scoped as the SDK scopes a run's state. Each ``Runner.run`` (one
  ``RunContextWrapper``, which every tool call of the run shares) gets a session of its own, ended
  when that run's context is dropped or by :meth:`PynoxFunctionTool.close`. A :class:`pynox.Session`
  passed as ``session`` is shared as it is across runs (a conversation's, say) and stays yours to close.
"""

from __future__ import annotations

import asyncio
import base64
import threading
import weakref
from collections.abc import Callable, Mapping
from typing import Any, Unpack

from agents import FunctionTool, RunContextWrapper, ToolOutputImage, ToolOutputText, function_tool

from pynox import CodeTool, ConfigError, Grants, KernelSupportError, Pool, PynoxError, Result, Session, check_grants

__all__ = ["CodeFailed", "PynoxFunctionTool", "python_tool", "tool_output"]

_RUN_SCOPE = "within one Runner run (another run starts with none of them)"
# Failures only the operator can mend: the run fails with them instead of the model retrying in vain.
_OPERATORS_ERRORS = (KernelSupportError, ConfigError)


class CodeFailed(Exception):  # the SDK's failure path takes any exception; this names what failed
    """The model's code failed (or Pynox refused it); ``str()`` is the text the model reads, ``result`` the run
    (``None`` for a refusal by Pynox)."""

    def __init__(self, text: str, result: Result | None) -> None:
        super().__init__(text)
        self.result = result


def tool_output(result: Result) -> str | list[ToolOutputText | ToolOutputImage]:
    """What the model reads of a good run: its text, then each figure as a PNG image."""
    if not result.images:
        return result.text
    return [ToolOutputText(text=result.text),
            *(ToolOutputImage(image_url="data:image/png;base64," + base64.b64encode(image).decode())
              for image in result.images)]


def _failure_text(context: RunContextWrapper[Any], error: Exception) -> str:
    """The SDK's ``failure_error_function``: Pynox's text for the model. An operator's error is raised again
    from here, and fails the run."""
    if isinstance(error, _OPERATORS_ERRORS):
        raise error
    if isinstance(error, CodeFailed):
        return str(error)
    return f"{type(error).__name__}: {error}"


class PynoxFunctionTool(FunctionTool):
    """``run_python(code)`` on Pynox, a ``FunctionTool``; make one with :func:`python_tool`."""

    # Not dataclass fields: set by python_tool on a copy of the tool the SDK's function_tool made.
    runner: CodeTool
    """The core tool calls run through (its grants, its description)."""
    _lock: threading.Lock
    _runs: dict[int, tuple[CodeTool, asyncio.Lock]]
    _shared: asyncio.Lock | None

    async def run(self, context: RunContextWrapper[Any], code: str) -> Result:
        """Run ``code`` where ``context``'s run keeps its state; one call at a time in a session (the SDK runs a
        turn's tool calls concurrently, and a session is one process)."""
        runner, lock = self._for(context)
        if lock is None:
            return await runner.arun(code)
        async with lock:
            return await runner.arun(code)

    def close(self) -> None:
        """End every session this tool started (each run's); the next call starts anew."""
        with self._lock:
            runners, self._runs = [runner for runner, _ in self._runs.values()], {}
        for runner in [*runners, self.runner]:
            runner.close()

    def _for(self, context: RunContextWrapper[Any]) -> tuple[CodeTool, asyncio.Lock | None]:
        if not self.runner.owns_session:
            if self.runner.uses_session and self._shared is None:
                self._shared = asyncio.Lock()
            return self.runner, self._shared
        # Every ToolContext of one run carries that run's Usage object: it identifies the run, and lives as
        # long as the run's context (its result keeps it), so the run's session ends with it.
        key = id(context.usage)
        with self._lock:
            entry = self._runs.get(key)
            if entry is None:
                entry = self._runs[key] = (self.runner.for_run(), asyncio.Lock())
                weakref.finalize(context.usage, self._end, key)
        return entry

    def _end(self, key: int) -> None:
        with self._lock:
            entry = self._runs.pop(key, None)
        if entry is not None:
            entry[0].close()


def python_tool(pool: Pool | None = None, *, profile: str | None = None, session: bool | Session = False,
                functions: Mapping[str, Callable[..., Any]] | None = None,
                **grants: Unpack[Grants]) -> PynoxFunctionTool:
    """An OpenAI Agents SDK tool ``run_python(code: str)`` whose code runs in Pynox.

    Permissions come from ``profile`` and ``grants`` (allow_read, allow_write, allow_network, allow_hosts, env,
    timeout, memory, max_output, max_file_size, package_dirs), never from the model; ``functions`` are
    host functions the code may call through ``pynox_host``. ``pool=None`` uses the default pool,
    started on the first call (never here). ``session=True`` keeps variables between the calls of one
    ``Runner.run``; a :class:`pynox.Session` is shared as it is and stays yours to close.
    """
    check_grants("python_tool()", grants)
    runner = CodeTool(pool, profile=profile, session=session, functions=functions,
                      session_scope=_RUN_SCOPE if session is True else None, **grants)
    made: PynoxFunctionTool | None = None

    async def run_python(context: RunContextWrapper[Any], code: str) -> Any:
        assert made is not None
        try:
            result = await made.run(context, code)
        except _OPERATORS_ERRORS:
            raise
        except PynoxError as exc:  # a refusal or a broken pool: the model reads it, the run goes on
            raise CodeFailed(f"{type(exc).__name__}: {exc}", None) from exc
        if not result.ok:
            raise CodeFailed(result.text, result)
        return tool_output(result)

    run_python.__doc__ = runner.doc  # the SDK reads the description and the code argument's from it
    built = function_tool(run_python, name_override="run_python", docstring_style="google",
                          failure_error_function=_failure_text)
    # Our class over the SDK's tool, made as the SDK's own FunctionTool.__copy__ makes a copy: its state, then
    # its normalisation again (which binds the failure handling to this object).
    made = object.__new__(PynoxFunctionTool)
    made.__dict__.update(built.__dict__)
    FunctionTool.__post_init__(made)  # type: ignore[no-untyped-call]  # the SDK leaves it unannotated
    made.runner, made._lock, made._runs, made._shared = runner, threading.Lock(), {}, None
    return made
