"""Pynox for strands-agents: a ``run_python`` tool and a ``Sandbox`` whose code runs kernel-confined.

    from strands import Agent
    from pynox_strands import PynoxSandbox, python_tool

    agent = Agent(model=model, tools=[python_tool(allow_read=["data"], timeout="10s")])
    agent = Agent(model=model, sandbox=PynoxSandbox(allow_write=["out"]))      # vends run_python
    agent = Agent(model=model, sandbox=PynoxSandbox(allow_write=["out"], vend=["python_repl", "file_editor"]))

Importing this module starts nothing: the pool starts on the first call.
"""

from __future__ import annotations

from ._errors import DeniedPath, UnsupportedOperation
from ._sandbox import PynoxSandbox
from ._tool import PynoxSessionTools, python_tool

__all__ = ["DeniedPath", "PynoxSandbox", "PynoxSessionTools", "UnsupportedOperation", "python_tool"]
