"""Pynox for smolagents: a ``run_python`` tool, and a ``CodeAgent`` whose code runs in Pynox.

    from smolagents import ToolCallingAgent
    from pynox_smolagents import PynoxCodeAgent, python_tool

    agent = ToolCallingAgent(tools=[python_tool(allow_read=["data"])], model=model)
    agent = PynoxCodeAgent(tools=[...], model=model, executor_kwargs={"allow_read": ["data"], "timeout": "60s"})

``CodeAgent(..., executor=PynoxExecutor(...))`` runs the same way; ``PynoxCodeAgent`` also states the sandbox's
rules in its prompt, shows figures to the model, and saves and loads with its grants.

Nothing starts at import: the pool starts on the first call (Pynox's default pool unless one is given).
"""

from __future__ import annotations

from ._agent import PynoxCodeAgent, save_with_its_executor
from ._executor import PynoxExecutor
from ._tool import PynoxTool, python_tool

__all__ = ["PynoxCodeAgent", "PynoxExecutor", "PynoxTool", "python_tool"]

# No saved CodeAgent with a PynoxExecutor may reload with smolagents' unconfined local executor.
save_with_its_executor()
