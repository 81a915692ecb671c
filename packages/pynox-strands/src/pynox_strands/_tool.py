"""``python_tool``: Pynox's ``run_python`` as a strands tool object.

strands registers only tool objects: ``Agent(tools=[fn])`` with a plain
function logs a warning and drops it, so the function must go through
``strands.tool``. The tool here is async and awaits ``Pool.arun``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from strands import tool
from strands.tools.decorator import DecoratedFunctionTool

from pynox import CodeTool, Pool, Session

__all__ = ["python_tool"]


def tool_for(runner: CodeTool) -> DecoratedFunctionTool[..., str]:
    """The strands tool named ``run_python`` that runs its code through ``runner``."""

    async def run_python(code: str) -> str:
        return await runner.atext(code)

    run_python.__doc__ = runner.doc
    return tool(run_python)  # type: ignore[arg-type]  # strands awaits async tools; its annotation names sync ones


def python_tool(pool: Pool | None = None, *, profile: str | None = None, session: bool | Session = False,
                functions: Mapping[str, Callable[..., Any]] | None = None,
                **grants: Any) -> DecoratedFunctionTool[..., str]:
    """A strands tool ``run_python(code: str) -> str`` whose code runs in Pynox.

    Permissions come from ``profile`` and ``grants`` (allow_read, allow_write, allow_network, env,
    timeout, memory, max_output, max_file_size, package_dirs), never from the model; ``functions`` are
    host functions the code may call through ``pynox_host``. ``pool=None`` uses the default pool,
    started on the first call (never at import or here).

    ``session=True`` keeps one Pynox session for this tool, so variables survive between calls and
    between the agent's turns; it ends when the pool closes. Pass a :class:`pynox.Session` instead to
    decide when it ends (``with pool.session(...) as s: Agent(tools=[python_tool(session=s)])``).
    A failure of the code, and a refusal by Pynox, reach the model as the tool's text.
    """
    return tool_for(CodeTool(pool, profile=profile, session=session, functions=functions, **grants))
