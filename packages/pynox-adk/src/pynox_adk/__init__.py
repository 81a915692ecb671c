"""Pynox for Google ADK: a ``BaseCodeExecutor`` whose code runs kernel-confined.

    from google.adk.agents import LlmAgent
    from pynox_adk import PynoxCodeExecutor

    agent = LlmAgent(name="analyst", model=model,
                     code_executor=PynoxCodeExecutor(stateful=True, allow_read=["data"], timeout="30s"))

Importing this module starts nothing: the pool starts on the first code block.
"""

from __future__ import annotations

from ._executor import PynoxCodeExecutor, execution_result

__all__ = ["PynoxCodeExecutor", "execution_result"]
