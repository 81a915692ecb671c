"""``python_tool``: Pynox's ``run_python`` as a strands tool object, behaving as strands' own tools do.

strands registers only tool objects: ``Agent(tools=[fn])`` with a plain function logs a warning and
drops it, so the function goes through ``strands.tool``. The tool is async and awaits ``Pool.arun``.

* A failed run (an exception, a non-zero exit, a timeout, a denial, a refusal by Pynox) is a tool
  result with ``status: "error"`` and the text the model reads, so strands' hooks
  (``AfterToolCallEvent``) and metrics see it fail; figures the code drew are image blocks.
* ``session=True`` gives each agent that calls the tool a session of its own, keyed on that agent
  (strands' ``ToolContext``), so a tool defined once at module level, the usual strands habit,
  never lets one agent see another's variables; an agent's session ends when the agent is gone.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping
from typing import Any, Unpack

from strands import ToolContext, tool
from strands.tools.decorator import DecoratedFunctionTool

from pynox import CodeTool, Grants, Pool, PynoxError, Result, Session, check_grants

__all__ = ["python_tool", "tool_result"]


def tool_result(result: Result) -> dict[str, Any]:
    """A strands tool result for a Pynox run: its text, its figures as PNG image blocks, its status."""
    content: list[dict[str, Any]] = [{"text": result.text}]
    content += [{"image": {"format": "png", "source": {"bytes": image}}} for image in result.images]
    return {"status": "success" if result.ok else "error", "content": content}


class _PerAgent:
    """The runner each calling agent uses: the tool's own, or, if the tool owns a session, one per agent."""

    def __init__(self, runner: CodeTool) -> None:
        self.runner = runner
        self._by_agent: weakref.WeakKeyDictionary[Any, CodeTool] = weakref.WeakKeyDictionary()

    def for_agent(self, agent: Any) -> CodeTool:
        if not self.runner.owns_session or agent is None:
            return self.runner
        runner = self._by_agent.get(agent)
        if runner is None:
            runner = self._by_agent[agent] = self.runner.for_run()
            # The agent is gone: so is its session (its process, its variables).
            weakref.finalize(agent, runner.close)
        return runner


def tool_for(runner: CodeTool, *, per_agent: bool = True) -> DecoratedFunctionTool[..., dict[str, Any]]:
    """The strands tool named ``run_python`` that runs its code through ``runner``; ``per_agent=False``
    keeps ``runner``'s own session for every caller (a sandbox's, which belongs to its one agent)."""
    runners = _PerAgent(runner)

    async def run_python(code: str, tool_context: ToolContext) -> dict[str, Any]:
        if not isinstance(code, str):
            return {"status": "error", "content": [{"text": f"Error: code must be a string of Python source, got "
                                                            f"{type(code).__name__}."}]}
        try:
            result = await (runners.for_agent(tool_context.agent) if per_agent else runner).arun(code)
        except PynoxError as exc:  # a refusal or a broken pool: the model reads it, the agent goes on
            return {"status": "error", "content": [{"text": f"{type(exc).__name__}: {exc}"}]}
        return tool_result(result)

    run_python.__doc__ = runner.doc
    return tool(context=True)(run_python)  # type: ignore[arg-type]  # strands awaits async tools


def python_tool(pool: Pool | None = None, *, profile: str | None = None, session: bool | Session = False,
                functions: Mapping[str, Callable[..., Any]] | None = None,
                **grants: Unpack[Grants]) -> DecoratedFunctionTool[..., dict[str, Any]]:
    """A strands tool ``run_python(code: str)`` whose code runs in Pynox.

    Permissions come from ``profile`` and ``grants`` (allow_read, allow_write, allow_network, env,
    timeout, memory, max_output, max_file_size, package_dirs), never from the model; ``functions`` are
    host functions the code may call through ``pynox_host``. ``pool=None`` uses the default pool,
    started on the first call (never at import or here).

    ``session=True``: each agent that calls the tool gets a session of its own (variables survive
    between its calls and turns, never across agents), ended when the agent is gone. Pass a
    :class:`pynox.Session` instead to share one session on purpose and decide when it ends. A failed
    run is a tool result with ``status: "error"``.
    """
    check_grants("python_tool()", grants)
    return tool_for(CodeTool(pool, profile=profile, session=session, functions=functions, **grants))
