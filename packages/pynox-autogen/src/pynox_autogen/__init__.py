"""Pynox for AutoGen: a ``CodeExecutor`` whose Python code blocks run kernel-confined, in one session.

    from autogen_agentchat.agents import CodeExecutorAgent
    from pynox_autogen import PynoxCodeExecutor

    async with PynoxCodeExecutor(allow_read=["data"], timeout="30s") as executor:
        agent = CodeExecutorAgent("executor", code_executor=executor)

Importing this module starts nothing: the pool starts on the first block.
"""

from __future__ import annotations

from ._executor import PynoxCodeExecutor, PynoxCodeExecutorConfig, PynoxCodeResult

__all__ = ["PynoxCodeExecutor", "PynoxCodeExecutorConfig", "PynoxCodeResult"]
