"""The MCP server: one tool, ``run_python``, on a Pynox pool, built on the MCP SDK's low-level ``Server``.

* The grants are the operator's (the server's command line, or a pynox.toml profile under its ceiling):
  the tool's input schema holds ``code`` and, with sessions on, the model's one choice about state
  (``restart``); nothing in it widens what the code may touch.
* A failed run is a tool error (``isError: true``) whose text has the error type, the failing line and
  the hint; figures the code drew are ``image/png`` content; stdout, stderr and the final value are text.
* Calls run concurrently, as the SDK dispatches them, up to the pool's workers. With sessions on, the
  connection has one Python process, so its calls run one at a time, in order.
* State belongs to the connection: a stdio server serves one client, and its session (and pool) end
  when that client disconnects. Over streamable HTTP the server is stateless: every call is fresh.
"""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import mcp_types as types
from mcp.server import Server

from pynox import CodeTool, PynoxError, Result, __version__

__all__ = ["RunPython", "build_server"]

TOOL_NAME = "run_python"


class RunPython:
    """The ``run_python`` tool of one connection: its MCP description, and the runs of its calls."""

    def __init__(self, runner: CodeTool) -> None:
        self._runner = runner
        # A session is one process: its steps are sent one at a time, in the order the calls came.
        self._session_turn = asyncio.Lock()

    @property
    def sessions(self) -> bool:
        return self._runner.uses_session

    def definition(self) -> types.Tool:
        description = self._runner.description
        usage = description.usage
        properties: dict[str, Any] = {"code": {"type": "string", "description": description.code}}
        if self.sessions:
            usage += (" The state belongs to this MCP connection: other clients have their own, and it ends when "
                      "this client disconnects. Calls run one at a time, in order. To start over with no "
                      "variables, call with restart: true.")
            properties["restart"] = {"type": "boolean", "default": False,
                                     "description": "End the session first: run this code in a fresh process "
                                                    "with no variables from earlier calls."}
        else:
            usage += " Calls run at the same time, up to the server's workers."
        text = f"{description.summary}\n\n{usage}\n\n{description.rules}"
        grants = self._runner.grants
        return types.Tool(
            name=TOOL_NAME, description=text,
            input_schema={"type": "object", "properties": properties, "required": ["code"],
                          "additionalProperties": False},
            annotations=types.ToolAnnotations(
                title="Run Python (Pynox sandbox)", read_only_hint=not grants.write,
                destructive_hint=bool(grants.write), idempotent_hint=False,
                open_world_hint=grants.network or bool(grants.hosts)),
        )

    async def call(self, arguments: dict[str, Any] | None) -> types.CallToolResult:
        arguments = arguments or {}
        problem = self._bad_arguments(arguments)
        if problem:
            return _error(problem)
        try:
            if self.sessions:
                async with self._session_turn:
                    if arguments.get("restart"):
                        await self._runner.aclose()
                    result = await self._runner.arun(arguments["code"])
            else:
                result = await self._runner.arun(arguments["code"])
        except PynoxError as exc:  # a refusal or a broken pool: the model reads it as the call's error
            return _error(f"{type(exc).__name__}: {exc}")
        return call_result(result)

    def _bad_arguments(self, arguments: dict[str, Any]) -> str | None:
        allowed = {"code", "restart"} if self.sessions else {"code"}
        unknown = sorted(set(arguments) - allowed)
        if unknown:
            return (f"Error: run_python takes only {', '.join(sorted(allowed))}; not {', '.join(unknown)} "
                    "(permissions are set by the server's operator, not per call).")
        if not isinstance(arguments.get("code"), str):
            got = type(arguments["code"]).__name__ if "code" in arguments else "nothing"
            return f"Error: code must be a string of Python source, got {got}."
        if not isinstance(arguments.get("restart", False), bool):
            return "Error: restart must be true or false."
        return None

    async def close(self) -> None:
        await self._runner.aclose()


def call_result(result: Result) -> types.CallToolResult:
    """The MCP result of one run: its text, then each figure as a PNG image; an error if the run failed."""
    content: list[types.ContentBlock] = [types.TextContent(text=result.text)]
    content += [types.ImageContent(data=base64.b64encode(image).decode(), mime_type="image/png")
                for image in result.images]
    return types.CallToolResult(content=content, is_error=not result.ok)


def _error(text: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(text=text)], is_error=True)


def build_server(tool: RunPython) -> Server[Any]:
    """The low-level MCP server that lists ``tool`` and routes its calls to it."""

    async def list_tools(ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[tool.definition()])

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        if params.name != TOOL_NAME:
            return _error(f"Error: no tool named {params.name!r}; this server has {TOOL_NAME} only.")
        return await tool.call(params.arguments)

    return Server("pynox", version=__version__, title="Pynox",
                  instructions="run_python runs Python in a fresh, kernel-confined process; its description "
                               "says what the code may read and write, and its limits.",
                  on_list_tools=list_tools, on_call_tool=call_tool)
