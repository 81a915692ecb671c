"""Every way an adapter gives a framework's agent Pynox's ``run_python``: the conformance suite runs each.

A case builds the agent's keyword arguments from a pool and Pynox options
(``session``, ``functions``, grants) and drives a scripted agent through a
list of tool calls. Adding an adapter means adding its cases here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import strands

from pynox import Pool
from pynox_langchain import python_tool as langchain_tool
from pynox_pydantic_ai import PynoxCapability, PynoxToolset
from pynox_strands import PynoxSandbox, python_tool

from .scripted import Call, Transcript, run_pydantic_ai, run_strands
from .scripted_langgraph import run_langgraph


@dataclass(frozen=True)
class Case:
    id: str
    build: Callable[..., dict[str, Any]]
    """(pool, **options) -> the agent's keyword arguments."""
    drive: Callable[[dict[str, Any], list[Call]], Transcript]
    session_ends_with_run: bool
    """Whether ``session=True`` ends with the agent's run (else it lasts until the pool closes)."""

    def run(self, pool: Pool, calls: list[Call], **options: Any) -> Transcript:
        return self.drive(self.build(pool, **options), calls)


CASES = [
    Case("pydantic-ai/PynoxToolset", lambda pool, **o: {"toolsets": [PynoxToolset(pool, **o)]}, run_pydantic_ai,
         session_ends_with_run=True),
    Case("pydantic-ai/PynoxCapability",
         lambda pool, **o: {"capabilities": [PynoxCapability(PynoxToolset(pool, **o))]}, run_pydantic_ai,
         session_ends_with_run=True),
    # The spec's line: the core's plain function in Agent(tools=[...]).
    Case("pydantic-ai/pynox.tool", lambda pool, **o: {"tools": [pool.tool(**o)]}, run_pydantic_ai,
         session_ends_with_run=False),
    Case("strands/python_tool", lambda pool, **o: {"tools": [python_tool(pool, **o)]}, run_strands,
         session_ends_with_run=False),
    Case("strands/PynoxSandbox", lambda pool, **o: {"sandbox": PynoxSandbox(pool, **o)}, run_strands,
         session_ends_with_run=False),
    # The spec's line: strands.tool(pynox.tool(...)).
    Case("strands/tool(pynox.tool)", lambda pool, **o: {"tools": [strands.tool(pool.tool(**o))]}, run_strands,
         session_ends_with_run=False),
    Case("langgraph/python_tool", lambda pool, **o: {"tools": [langchain_tool(pool, **o)]}, run_langgraph,
         session_ends_with_run=False),
]
