"""What the OpenAI Agents SDK tool, the AutoGen executor and the ADK executor add to a Pynox run: ``print(1)``
through each, beside the pool call it stands on. Runs in ``.venv-separate`` (requirements-separate.txt).

* ``pool``: ``Pool.arun("print(1)")``, the floor of the OpenAI tool, called as the SDK's Runner calls a tool
  (``openai_agents``: ``tool.on_invoke_tool(ToolContext, '{"code": ...}')``: argument parsing, the SDK's
  failure wrapper, our tool);
* ``session``: ``Session.arun("print(1)")`` in a session, the floor of AutoGen's stateful executor
  (``autogen``: ``execute_code_blocks([CodeBlock("print(1)", "python")], CancellationToken())``);
* ``pool_thread``: ``Pool.run`` in a worker thread, the floor of ADK's executor, which ADK calls in a worker
  thread (``adk``: ``execute_code(context, CodeExecutionInput("print(1)"))`` through ``asyncio.to_thread``).

Rounds interleave all six, so all see the same machine load. Reports p50 and p99 in milliseconds.

    .venv-separate/bin/python bench/separate_adapter_overhead.py [--runs 200] [--json FILE]
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

from agents.tool_context import ToolContext
from autogen_core import CancellationToken
from autogen_core.code_executor import CodeBlock
from google.adk.code_executors.code_execution_utils import CodeExecutionInput
from timed_calls import main, summary  # type: ignore[import-not-found]  # run from bench/

import pynox
from pynox_adk import PynoxCodeExecutor as AdkExecutor
from pynox_autogen import PynoxCodeExecutor as AutogenExecutor
from pynox_openai_agents import python_tool

CODE = "print(1)"


async def measure(runs: int) -> dict[str, Any]:
    with pynox.Pool(workers=1) as pool:
        tool = python_tool(pool)
        arguments = json.dumps({"code": CODE})
        adk = AdkExecutor(pool)
        async with AutogenExecutor(pool) as autogen:
            with pool.session() as session:

                async def openai_agents() -> None:
                    context = ToolContext(context=None, tool_name="run_python", tool_call_id="call",
                                          tool_arguments=arguments)
                    assert (await tool.on_invoke_tool(context, arguments)).strip() == "1"

                async def autogen_call() -> None:
                    assert (await autogen.execute_code_blocks([CodeBlock(CODE, "python")],
                                                              CancellationToken())).output.strip() == "1"

                async def adk_call() -> None:
                    result = await asyncio.to_thread(adk.execute_code, None, CodeExecutionInput(code=CODE))  # type: ignore[arg-type]
                    assert result.stdout == "1\n"

                calls: dict[str, Callable[[], Awaitable[Any]]] = {
                    "pool": lambda: pool.arun(CODE), "openai_agents": openai_agents,
                    "session": lambda: session.arun(CODE), "autogen": autogen_call,
                    "pool_thread": lambda: asyncio.to_thread(pool.run, CODE), "adk": adk_call,
                }
                times: dict[str, list[float]] = {name: [] for name in calls}
                for _ in range(10):  # warm the templates and both sessions
                    for call in calls.values():
                        await call()
                for _ in range(runs):
                    for name, call in calls.items():
                        started = time.perf_counter()
                        await call()
                        times[name].append(time.perf_counter() - started)
    return {"runs": runs, "cpus": os.cpu_count(), "load": os.getloadavg(),
            **{name: summary(values) for name, values in times.items()}}


if __name__ == "__main__":
    main(__doc__, lambda runs: asyncio.run(measure(runs)))
