"""Pynox for strands-agents: a ``run_python`` tool and a ``Sandbox`` whose code runs kernel-confined.

    from strands import Agent
    from strands.vended_tools import python_repl
    from pynox_strands import PynoxSandbox, python_tool

    agent = Agent(model=model, tools=[python_tool(allow_read=["data"], timeout="10s")])
    agent = Agent(model=model, sandbox=PynoxSandbox(allow_write=["out"]))      # vends run_python
    agent = Agent(model=model, sandbox=PynoxSandbox(vend_tool=False), tools=[python_repl])

Importing this module starts nothing: the pool starts on the first call.
"""

from __future__ import annotations

from ._sandbox import PynoxSandbox, UnsupportedOperation
from ._tool import python_tool

__all__ = ["PynoxSandbox", "UnsupportedOperation", "python_tool"]
