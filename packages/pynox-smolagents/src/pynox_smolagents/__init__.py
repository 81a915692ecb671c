"""Pynox for smolagents: a ``run_python`` tool, and an executor that runs a ``CodeAgent``'s code in Pynox.

    from smolagents import CodeAgent, ToolCallingAgent
    from pynox_smolagents import PynoxExecutor, python_tool

    agent = ToolCallingAgent(tools=[python_tool(allow_read=["data"])], model=model)
    agent = CodeAgent(tools=[...], model=model, executor=PynoxExecutor(allow_read=["data"], timeout="60s"))

Nothing starts at import: the pool starts on the first call (Pynox's default pool unless one is given).
"""

from __future__ import annotations

from ._executor import PynoxExecutor
from ._tool import PynoxTool, python_tool

__all__ = ["PynoxExecutor", "PynoxTool", "python_tool"]
