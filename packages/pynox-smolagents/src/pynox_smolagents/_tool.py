"""``python_tool()``: Pynox's ``run_python`` as a smolagents ``Tool`` (for ``ToolCallingAgent``, or any agent).

The tool is the core's :class:`pynox.CodeTool`: its description (what the code
may touch, written for the model) becomes the smolagents description, its
``code`` argument the only input, and its text result the observation. A
failure of the model's code is that text, never an exception, so the agent
reads it and tries again.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from smolagents import Tool

import pynox

__all__ = ["PynoxTool", "python_tool"]

_CODE_INPUT = "Python source code to run, as a complete script."


class PynoxTool(Tool):
    """``run_python(code) -> str`` on a Pynox pool, as a smolagents tool. Build it with :func:`python_tool`."""

    name = "run_python"
    description = "Run Python code in an isolated sandbox and return what it prints."
    # smolagents declares its tools' schema as class attributes; each instance sets its own in __init__.
    inputs = {"code": {"type": "string", "description": _CODE_INPUT}}  # noqa: RUF012
    output_type = "string"

    def __init__(self, code_tool: pynox.CodeTool | Callable[[str], str]) -> None:
        # A run_python made by pynox.tool() or Pool.tool() carries the tool object it runs over.
        code_tool = getattr(code_tool, "code_tool", code_tool)
        if not isinstance(code_tool, pynox.CodeTool):
            raise TypeError("PynoxTool takes a pynox.CodeTool, or a run_python made by pynox.tool() or Pool.tool(); "
                            f"got {type(code_tool).__name__}")
        self.code_tool = code_tool
        # Per instance: the description states this tool's own grants (what @tool takes from a docstring:
        # everything before its Args section).
        parts = code_tool.description
        self.description = f"{parts.summary}\n\n{parts.body}"
        self.inputs = {"code": {"type": "string", "description": parts.code}}
        super().__init__()
        self.is_initialized = True  # nothing to set up: the pool starts on the first call

    def forward(self, code: str) -> str:
        return self.code_tool.text(code)


def python_tool(pool: pynox.Pool | None = None, *, profile: str | None = None, session: bool = False,
                functions: Mapping[str, Callable[..., Any]] | None = None, **grants: Any) -> PynoxTool:
    """A smolagents tool named ``run_python`` that runs the model's code on ``pool`` (default: Pynox's default
    pool, started on the first call).

    Permissions come from ``profile`` and ``grants`` (allow_read, allow_write, allow_network, timeout, memory,
    ...), fixed here; ``session=True`` keeps variables between calls; ``functions`` are host functions the code
    imports from ``pynox_host``. A bad grant raises here, before any agent runs.
    """
    return PynoxTool(pynox.CodeTool(pool, profile=profile, session=session, functions=functions, **grants))
