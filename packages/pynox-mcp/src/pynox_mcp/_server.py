"""The MCP server: one tool, ``run_python``, on a Pynox pool, built on the MCP SDK's low-level ``Server``.

* The grants are the operator's (the server's command line, or a pynox.toml profile under its ceiling):
  the tool's input schema holds ``code`` and, with sessions on, the model's one choice about state
  (``restart``); nothing in it widens what the code may touch.
* A failed run is a tool error (``isError: true``) whose text has the error type, the failing line and
  the hint; stdout, stderr, the final value and what was displayed are text; figures and displayed PNG or
  JPEG images are image content; displayed HTML and SVG are embedded resources (``pynox://output/N``).
* Output as it happens: a call whose client gave a progress token gets a progress notification for each
  chunk of output and each display output, its text as the message, before the call's result.
* Calls run concurrently, as the SDK dispatches them, up to the pool's workers. With sessions on, the
  connection has one Python process, so its calls run one at a time, in order.
* State belongs to the connection: a stdio server serves one client, and its session (and pool) end
  when that client disconnects. Over streamable HTTP the server is stateless: every call is fresh.
* With ``--scratch``, the session works in a scratch directory the pool owns: each regular file there is
  a resource (``pynox://scratch/PATH``, with its MIME type and size; text as text, the rest as a blob), and
  the ``upload_file`` tool puts a file in. Files over ``--max-resource-size`` are listed, not read.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import quote, unquote

import mcp_types as types
from mcp.server import Server
from mcp.shared.exceptions import MCPError

from pynox import CodeTool, FileInfo, Output, OutputEvent, PynoxError, Result, StreamText, __version__, format_size

__all__ = ["RunPython", "build_server"]

TOOL_NAME = "run_python"
UPLOAD_NAME = "upload_file"
SCRATCH_URI = "pynox://scratch/"
# Shown as text when they decode as UTF-8; every other type is a base64 blob.
_TEXT_TYPES = ("application/json", "application/xml", "application/javascript", "application/x-python",
               "image/svg+xml")
# A progress notification's message: at most this many characters of the output it reports.
_PROGRESS_TEXT = 4096
Progress = Callable[[float, str], Awaitable[None]]
_log = logging.getLogger(__name__)


class RunPython:
    """The ``run_python`` tool of one connection: its MCP description, and the runs of its calls."""

    def __init__(self, runner: CodeTool, *, max_resource_size: int = 10 << 20) -> None:
        self._runner = runner
        self.max_resource_size = max_resource_size
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

    async def call(self, arguments: dict[str, Any] | None, progress: Progress | None = None) -> types.CallToolResult:
        """One call; ``progress``: the client gave a progress token, and each output event is reported to it."""
        arguments = arguments or {}
        problem = self._bad_arguments(arguments)
        if problem:
            return _error(problem)
        try:
            if self.sessions:
                async with self._session_turn:
                    if arguments.get("restart"):
                        await self._runner.aclose()
                    result = await self._run(arguments["code"], progress)
            else:
                result = await self._run(arguments["code"], progress)
        except PynoxError as exc:  # a refusal or a broken pool: the model reads it as the call's error
            return _error(f"{type(exc).__name__}: {exc}")
        return call_result(result)

    async def _run(self, code: str, progress: Progress | None) -> Result:
        if progress is None:
            return await self._runner.arun(code)
        # Notifications go out one at a time, in the order of the events, and all before the result.
        events: asyncio.Queue[OutputEvent | None] = asyncio.Queue()

        async def send() -> None:
            count = 0
            while (event := await events.get()) is not None:
                count += 1
                try:
                    await progress(count, _progress_message(event))
                except Exception:  # the client went away: the call's own answer finds out
                    _log.debug("a progress notification could not be sent", exc_info=True)

        sender = asyncio.ensure_future(send())
        try:
            return await self._runner.arun(code, on_output=events.put_nowait)
        finally:
            events.put_nowait(None)
            with contextlib.suppress(asyncio.CancelledError):
                await sender

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

    # -- the session's scratch directory: resources, and upload_file --------------------------------------
    @property
    def files(self) -> bool:
        """Whether the session's scratch directory is served (``--scratch``)."""
        return self.sessions and self._runner.grants.scratch

    def upload_definition(self) -> types.Tool:
        return types.Tool(
            name=UPLOAD_NAME,
            description="Put a file in the working directory of run_python's session (its scratch directory), "
                        "for the next code to read by its relative path. Give text, or base64 for binary "
                        f"content; at most {format_size(self.max_resource_size)}. The session's files are "
                        f"also resources ({SCRATCH_URI}PATH).",
            input_schema={"type": "object", "additionalProperties": False, "required": ["path"],
                          "properties": {"path": {"type": "string", "description": "a relative path, e.g. data/in.csv"},
                                         "text": {"type": "string", "description": "the content, as text (UTF-8)"},
                                         "base64": {"type": "string", "description": "the content, base64"}}},
            annotations=types.ToolAnnotations(title="Upload a file to the Pynox session", read_only_hint=False,
                                              destructive_hint=True, idempotent_hint=True, open_world_hint=False))

    async def upload(self, arguments: dict[str, Any] | None) -> types.CallToolResult:
        arguments = arguments or {}
        path, text, encoded = arguments.get("path"), arguments.get("text"), arguments.get("base64")
        unknown = sorted(set(arguments) - {"path", "text", "base64"})
        if unknown or not isinstance(path, str) or (text is None) == (encoded is None) \
                or not isinstance(text if text is not None else encoded, str):
            return _error("Error: upload_file takes a path and exactly one of text and base64, each a string.")
        try:
            data = text.encode() if text is not None else base64.b64decode(str(encoded), validate=True)
        except (binascii.Error, ValueError):
            return _error("Error: base64 is not valid base64.")
        if len(data) > self.max_resource_size:
            return _error(f"Error: the file is {format_size(len(data))}, over this server's "
                          f"{format_size(self.max_resource_size)}.")
        try:
            async with self._session_turn:  # between the session's calls, never during one
                found = await self._runner.aupload(path, data)
        except PynoxError as exc:
            return _error(f"{type(exc).__name__}: {exc}")
        return types.CallToolResult(content=[
            types.TextContent(text=f"Uploaded {found.path} ({found.size} bytes, {found.mime})."),
            types.ResourceLink(name=found.path, uri=_uri(found.path), mime_type=found.mime, size=found.size)])

    async def resources(self) -> list[types.Resource]:
        if not self.files:
            return []
        async with self._session_turn:
            found = await self._runner.afiles()
        return [_resource(file) for file in found]

    async def read(self, uri: str) -> types.ReadResourceResult:
        if not self.files or not uri.startswith(SCRATCH_URI):
            raise MCPError(types.INVALID_PARAMS, f"no resource {uri!r}: this server's are {SCRATCH_URI}PATH")
        path = unquote(uri.removeprefix(SCRATCH_URI))
        async with self._session_turn:
            listed = {file.path: file for file in await self._runner.afiles()}
            file = listed.get(path)
            if file is None:
                raise MCPError(types.INVALID_PARAMS, f"no file {path!r} in the session's scratch directory")
            if file.size > self.max_resource_size:
                raise MCPError(types.INVALID_PARAMS, f"{path} is {format_size(file.size)}, over this server's "
                                                     f"{format_size(self.max_resource_size)} (--max-resource-size)")
            try:
                data = await self._runner.adownload(path)
            except PynoxError as exc:
                raise MCPError(types.INVALID_PARAMS, f"{type(exc).__name__}: {exc}") from None
        contents: types.TextResourceContents | types.BlobResourceContents
        text = _as_text(data, file.mime)
        if text is not None:
            contents = types.TextResourceContents(uri=uri, mime_type=file.mime, text=text)
        else:
            contents = types.BlobResourceContents(uri=uri, mime_type=file.mime, blob=base64.b64encode(data).decode())
        return types.ReadResourceResult(contents=[contents], ttl_ms=0)


def _uri(path: str) -> str:
    return SCRATCH_URI + quote(path)


def _resource(file: FileInfo) -> types.Resource:
    return types.Resource(name=file.path, uri=_uri(file.path), mime_type=file.mime, size=file.size)


def _as_text(data: bytes, mime: str) -> str | None:
    if not (mime.startswith("text/") or mime in _TEXT_TYPES):
        return None
    try:
        return data.decode()
    except UnicodeDecodeError:
        return None


def _progress_message(event: OutputEvent) -> str:
    text = event.text if isinstance(event, StreamText) else event.summary
    return text if len(text) <= _PROGRESS_TEXT else text[:_PROGRESS_TEXT] + "..."


def call_result(result: Result) -> types.CallToolResult:
    """The MCP result of one run: its text, then each image it showed (displayed or drawn) in order, then what
    it displayed as HTML or SVG, as embedded resources; an error if the run failed."""
    content: list[types.ContentBlock] = [types.TextContent(text=result.text)]
    content += [types.ImageContent(data=base64.b64encode(data).decode(), mime_type=mime)
                for data, mime in result.displayed_images]
    for index, output in enumerate(result.outputs):
        content += _resources(output, index)
    return types.CallToolResult(content=content, is_error=not result.ok)


def _resources(output: Output, index: int) -> list[types.ContentBlock]:
    """One output's HTML and SVG as embedded resources (its text is in the result's text already)."""
    blocks: list[types.ContentBlock] = []
    for mime, text in (("text/html", output.html), ("image/svg+xml", output.svg)):
        if text is not None:
            blocks.append(types.EmbeddedResource(resource=types.TextResourceContents(
                uri=f"pynox://output/{index}", mime_type=mime, text=text)))
    return blocks


def _error(text: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(text=text)], is_error=True)


def _progress(ctx: Any) -> Progress | None:
    """How to report progress on this call, if its client gave a progress token (the SDK's own notification,
    related to the call's request so that streamable HTTP sends it on the call's stream)."""
    meta = getattr(ctx, "meta", None)
    token = meta.get("progress_token") if isinstance(meta, dict) else getattr(meta, "progress_token", None)
    session = getattr(ctx, "session", None)
    if token is None or session is None:
        return None
    related = getattr(ctx, "request_id", None)

    async def report(count: float, message: str) -> None:
        await session.send_progress_notification(token, count, message=message,
                                                 related_request_id=str(related) if related is not None else None)

    return report


def build_server(tool: RunPython) -> Server[Any]:
    """The low-level MCP server that lists ``tool`` and routes its calls to it."""

    async def list_tools(ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[tool.definition(), *([tool.upload_definition()] if tool.files else [])])

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        if params.name == UPLOAD_NAME and tool.files:
            return await tool.upload(params.arguments)
        if params.name != TOOL_NAME:
            names = f"{TOOL_NAME} and {UPLOAD_NAME}" if tool.files else f"{TOOL_NAME} only"
            return _error(f"Error: no tool named {params.name!r}; this server has {names}.")
        return await tool.call(params.arguments, _progress(ctx))

    async def list_resources(ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListResourcesResult:
        # Files come and go with every call: a client must not serve this list from its cache.
        return types.ListResourcesResult(resources=await tool.resources(), ttl_ms=0)

    async def list_templates(ctx: Any,
                             params: types.PaginatedRequestParams | None) -> types.ListResourceTemplatesResult:
        templates = [types.ResourceTemplate(name="scratch", uri_template=SCRATCH_URI + "{path}",
                                            description="A file of run_python's session's working directory")]
        return types.ListResourceTemplatesResult(resource_templates=templates if tool.files else [], ttl_ms=0)

    async def read_resource(ctx: Any, params: types.ReadResourceRequestParams) -> types.ReadResourceResult:
        return await tool.read(params.uri)

    return Server("pynox", version=__version__, title="Pynox",
                  instructions="run_python runs Python in a fresh, kernel-confined process; its description "
                               "says what the code may read and write, and its limits.",
                  on_list_tools=list_tools, on_call_tool=call_tool,
                  on_list_resources=list_resources if tool.files else None,
                  on_list_resource_templates=list_templates if tool.files else None,
                  on_read_resource=read_resource if tool.files else None)
