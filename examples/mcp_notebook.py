"""A notebook-style agent over MCP: one session across turns, an error, and the recovery.

The model is SCRIPTED (fixed tool calls, chosen after reading each result as a model would): no model
service is reachable here. The rest is real: the MCP SDK's client starts ``pynox-mcp --session`` over
stdio, as Claude Desktop or Cursor would, and every call goes through the protocol. The failed call
comes back with ``isError: true``; the variables of the earlier calls survive it, so the next call
fixes the mistake without reloading anything.

    python examples/mcp_notebook.py
"""

from __future__ import annotations

import os
import sys
import tempfile

import anyio
import mcp_types as types
from mcp.client import Client
from mcp.client.stdio import StdioServerParameters

READINGS = "sensor,celsius\nattic,31.5\ncellar,12.0\nkitchen,21.0\n"
QUESTION = "What is the mean temperature in data/readings.csv, in Fahrenheit?"

# The scripted model's turns: code, then what it makes of the answer.
TURNS = [
    ("rows = [line.split(',') for line in open('data/readings.csv').read().split()[1:]]\nlen(rows)",
     "Three readings are loaded. Now the mean."),
    ("mean_c = sum(float(r[2]) for r in rows) / len(rows)",
     "An IndexError: each row has two fields, not three. The rows are still loaded; fix the index."),
    ("mean_c = sum(float(r[1]) for r in rows) / len(rows)\nprint(f'{mean_c:.2f} C = {mean_c * 9 / 5 + 32:.2f} F')",
     "The mean is 21.50 C, which is 70.70 F."),
]


def server() -> StdioServerParameters:
    command = os.path.join(os.path.dirname(sys.executable), "pynox-mcp")  # installed with pynox-mcp
    return StdioServerParameters(command=command, args=["--session", "--allow-read", "data", "--timeout", "10s"],
                                 cwd=os.getcwd())


async def main() -> None:
    print(f"user: {QUESTION}")
    async with Client(server()) as client:
        tools = await client.list_tools()
        print(f"client: the server lists {[tool.name for tool in tools.tools]}, taking "
              f"{sorted(tools.tools[0].input_schema['properties'])}")
        for code, thought in TURNS:
            print("model (scripted) calls run_python:")
            print("\n".join(f"    {line}" for line in code.splitlines()))
            result = await client.call_tool("run_python", {"code": code})
            text = "\n".join(block.text for block in result.content if isinstance(block, types.TextContent))
            print(f"run_python [isError: {str(result.is_error).lower()}]:")
            print("\n".join(f"    {line}" for line in text.splitlines()))
            print(f"model (scripted): {thought}")


if __name__ == "__main__":
    with tempfile.TemporaryDirectory(prefix="pynox-notebook-") as work:
        os.chdir(work)
        os.makedirs("data")
        with open("data/readings.csv", "w") as csv:
            csv.write(READINGS)
        anyio.run(main)
        os.chdir("/")
