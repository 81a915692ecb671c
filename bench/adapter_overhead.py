"""What the MCP server and the LangChain tool add to a Pynox run: ``print(1)`` through each, beside the pool.

* ``pool``: ``Pool.arun("print(1)")`` in this process, the floor both adapters stand on;
* ``mcp``: ``call_tool("run_python")`` through the MCP SDK's client over stdio to ``pynox-mcp`` (its own
  pool of the same size), each call awaited before the next;
* ``langchain``: ``python_tool(pool).ainvoke(tool_call)``, which builds the ``ToolMessage`` too.

Rounds interleave the three, so all see the same machine load. Reports p50 and p99 in milliseconds.

    python bench/adapter_overhead.py [--runs 200] [--json FILE]
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from typing import Any

from mcp.client import Client
from mcp.client.stdio import StdioServerParameters
from timed_calls import main, summary  # type: ignore[import-not-found]  # run from bench/

import pynox
from pynox_langchain import python_tool


async def measure(runs: int) -> dict[str, Any]:
    server = StdioServerParameters(command=os.path.join(os.path.dirname(sys.executable), "pynox-mcp"),
                                   args=["--workers", "1"])
    times: dict[str, list[float]] = {"pool": [], "mcp": [], "langchain": []}
    with pynox.Pool(workers=1) as pool:
        tool = python_tool(pool)
        call = {"type": "tool_call", "id": "call", "name": "run_python", "args": {"code": "print(1)"}}
        async with Client(server) as client:
            for _ in range(10):  # warm both pools' templates
                await pool.arun("print(1)")
                await client.call_tool("run_python", {"code": "print(1)"})
            for _ in range(runs):
                started = time.perf_counter()
                await pool.arun("print(1)")
                times["pool"].append(time.perf_counter() - started)
                started = time.perf_counter()
                result = await client.call_tool("run_python", {"code": "print(1)"})
                times["mcp"].append(time.perf_counter() - started)
                assert not result.is_error
                started = time.perf_counter()
                message = await tool.ainvoke(call)
                times["langchain"].append(time.perf_counter() - started)
                assert message.status == "success"
    return {"runs": runs, "cpus": os.cpu_count(), **{name: summary(values) for name, values in times.items()}}


if __name__ == "__main__":
    main(__doc__, lambda runs: asyncio.run(measure(runs)))
