"""Pynox for pydantic-ai: a ``run_python`` toolset whose code runs in a kernel-confined process.

    from pydantic_ai import Agent
    from pynox_pydantic_ai import PynoxCapability, PynoxToolset

    agent = Agent(model, toolsets=[PynoxToolset(allow_read=["data"], timeout="10s")])
    agent = Agent(model, capabilities=[PynoxCapability(PynoxToolset(session=True))])
    agent = Agent(model, tools=[get_weather], capabilities=[PynoxCodeMode(timeout="10s")])

Importing this module starts nothing: the pool starts on the first call.
"""

from __future__ import annotations

from ._code_mode import PynoxCodeMode
from ._toolset import PynoxCapability, PynoxToolset

__all__ = ["PynoxCapability", "PynoxCodeMode", "PynoxToolset"]
