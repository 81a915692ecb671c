"""Pynox for the OpenAI Agents SDK: a ``run_python`` function tool whose code runs kernel-confined.

    from agents import Agent, Runner
    from pynox_openai_agents import python_tool

    agent = Agent(name="analyst", tools=[python_tool(allow_read=["data"], timeout="10s")])
    result = await Runner.run(agent, "What is in data/sales.csv?")

Importing this module starts nothing: the pool starts on the first call.
"""

from __future__ import annotations

from ._tool import CodeFailed, PynoxFunctionTool, python_tool, tool_output

__all__ = ["CodeFailed", "PynoxFunctionTool", "python_tool", "tool_output"]
