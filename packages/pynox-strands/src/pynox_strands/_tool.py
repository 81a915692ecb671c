"""``python_tool``: Pynox's ``run_python`` as a strands tool object, behaving as strands' own tools do.

strands registers only tool objects: ``Agent(tools=[fn])`` with a plain function logs a warning and
drops it, so the function goes through ``strands.tool``. The tool is async and awaits ``Pool.arun``.

* A failed run (an exception, a non-zero exit, a timeout, a denial, a refusal by Pynox) is a tool
  result with ``status: "error"`` and the text the model reads, so strands' hooks
  (``AfterToolCallEvent``) and metrics see it fail; figures the code drew are image blocks.
* ``session=True`` makes a strands ``ToolProvider``: each agent given it loads a ``run_python`` of its own,
  with a session of its own, so a tool defined once at module level, the usual strands habit, never lets
  one agent see another's variables; ``agent.cleanup()`` (or the agent's end) ends that agent's session.
* Cancelling (``agent.cancel()``, an invocation's ``cancel_signal``) stops the running code, as strands asks
  of a tool (``ToolContext.cancel_signal``): a fresh job is killed at once; a session's step is interrupted
  (``KeyboardInterrupt``) and keeps the session's variables if it stops within the pool's grace, else it is
  killed and the session's next call says its state is gone.
"""

from __future__ import annotations

import asyncio
import collections
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, Unpack, overload

from strands import ToolContext, tool
from strands.tools.decorator import DecoratedFunctionTool
from strands.tools.tool_provider import ToolProvider
from strands.types.tools import AgentTool

from pynox import CodeTool, Grants, Pool, PynoxError, Result, Session, check_grants

__all__ = ["PynoxSessionTools", "python_tool", "tool_result"]

_CANCEL_POLL = 0.05  # seconds between looks at strands' cancel signal (a threading.Event) while code runs
_AGENT_SCOPE = "of this agent (no other agent sees its variables)"


def tool_result(result: Result) -> dict[str, Any]:
    """A strands tool result for a Pynox run: its text, its figures and displayed images as image blocks, its
    status."""
    content: list[dict[str, Any]] = [{"text": result.text}]
    content += [{"image": {"format": "png" if mime == "image/png" else "jpeg", "source": {"bytes": data}}}
                for data, mime in result.displayed_images]
    return {"status": "success" if result.ok else "error", "content": content}


async def run_cancellable(runner: CodeTool, code: str, cancel_signal: threading.Event) -> Result | None:
    """``runner.arun(code)``, or ``None`` as soon as ``cancel_signal`` is set: the run is cancelled then, which
    stops its code instead of letting it run on (a job killed; a session's step interrupted, see above)."""
    run = asyncio.ensure_future(runner.arun(code))
    while not run.done():
        if cancel_signal.is_set():
            run.cancel()
            try:
                await run
            except (asyncio.CancelledError, PynoxError):
                pass
            return None
        await asyncio.wait({run}, timeout=_CANCEL_POLL)
    return run.result()


CANCELLED = {"status": "error", "content": [{"text": "Cancelled: the agent was cancelled while this code ran, and "
                                                     "the code was stopped."}]}


def tool_for(runner: CodeTool) -> DecoratedFunctionTool[..., dict[str, Any]]:
    """The strands tool named ``run_python`` that runs its code through ``runner`` (its session, if it has one,
    is every caller's: give each agent its own tool, as :class:`PynoxSessionTools` does)."""

    async def run_python(code: str, tool_context: ToolContext) -> dict[str, Any]:
        if not isinstance(code, str):
            return {"status": "error", "content": [{"text": f"Error: code must be a string of Python source, got "
                                                            f"{type(code).__name__}."}]}
        try:
            result = await run_cancellable(runner, code, tool_context.cancel_signal)
        except PynoxError as exc:  # a refusal or a broken pool: the model reads it, the agent goes on
            return {"status": "error", "content": [{"text": f"{type(exc).__name__}: {exc}"}]}
        return tool_result(result) if result is not None else CANCELLED

    run_python.__doc__ = runner.doc
    return tool(context=True)(run_python)  # type: ignore[arg-type]  # strands awaits async tools


class PynoxSessionTools(ToolProvider):
    """What ``python_tool(session=True)`` gives: a strands ``ToolProvider`` whose every consumer (an agent's tool
    registry) loads a ``run_python`` with a session of its own, ended when that agent is cleaned up
    (``agent.cleanup()``, or strands' finalizer when the agent is collected)."""

    def __init__(self, runner: CodeTool) -> None:
        self._runner = runner
        self._lock = threading.Lock()
        # strands calls add_consumer, then load_tools, for each registry: the consumers still to be loaded for.
        self._arriving: collections.deque[Any] = collections.deque()
        self._by_consumer: dict[Any, CodeTool] = {}

    @property
    def doc(self) -> str:
        """What each agent's ``run_python`` tells the model."""
        return self._runner.doc

    def add_consumer(self, consumer_id: Any, **kwargs: Any) -> None:
        with self._lock:
            self._arriving.append(consumer_id)

    async def load_tools(self, **kwargs: Any) -> Sequence[AgentTool]:
        runner = self._runner.for_run()  # the same grants; a session of its own, not yet started
        with self._lock:
            if self._arriving:
                self._by_consumer[self._arriving.popleft()] = runner
        made = tool_for(runner)
        weakref.finalize(made, runner.close)  # an agent never cleaned up: its session ends with its tool
        return [made]

    def remove_consumer(self, consumer_id: Any, **kwargs: Any) -> None:
        with self._lock:
            runner = self._by_consumer.pop(consumer_id, None)
        if runner is not None:
            runner.close()


@overload
def python_tool(pool: Pool | None = None, *, profile: str | None = None, session: Literal[True],
                functions: Mapping[str, Callable[..., Any]] | None = None,
                **grants: Unpack[Grants]) -> PynoxSessionTools: ...


@overload
def python_tool(pool: Pool | None = None, *, profile: str | None = None, session: Literal[False] | Session = False,
                functions: Mapping[str, Callable[..., Any]] | None = None,
                **grants: Unpack[Grants]) -> DecoratedFunctionTool[..., dict[str, Any]]: ...


def python_tool(pool: Pool | None = None, *, profile: str | None = None, session: bool | Session = False,
                functions: Mapping[str, Callable[..., Any]] | None = None,
                **grants: Unpack[Grants]) -> DecoratedFunctionTool[..., dict[str, Any]] | PynoxSessionTools:
    """A strands tool ``run_python(code: str)`` whose code runs in Pynox.

    Permissions come from ``profile`` and ``grants`` (allow_read, allow_write, allow_network, allow_hosts, env,
    timeout, memory, max_output, max_file_size, package_dirs), never from the model; ``functions`` are
    host functions the code may call through ``pynox_host``. ``pool=None`` uses the default pool,
    started on the first call (never at import or here).

    ``session=True`` gives a :class:`PynoxSessionTools` provider: each agent given it gets a ``run_python``
    with a session of its own (variables survive between its calls and turns, never across agents),
    ended by ``agent.cleanup()``. Pass a :class:`pynox.Session` instead to share one session on purpose
    and decide when it ends. A failed run is a tool result with ``status: "error"``.
    """
    check_grants("python_tool()", grants)
    runner = CodeTool(pool, profile=profile, session=session, functions=functions,
                      session_scope=_AGENT_SCOPE if session is True else None, **grants)
    return PynoxSessionTools(runner) if session is True else tool_for(runner)
