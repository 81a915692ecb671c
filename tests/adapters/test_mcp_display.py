"""pynox-mcp's rich display and output as it happens, through the MCP SDK's own client starting the real
``pynox-mcp``: a call with a progress token gets a progress notification per output event, in order,
before its result; a displayed PNG is an image and displayed HTML an embedded resource."""

from __future__ import annotations

import base64
import sys
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp.client import Client
from mcp.client.stdio import StdioServerParameters

pytestmark = pytest.mark.timeout(120)

SERVER = str(Path(sys.executable).with_name("pynox-mcp"))
_PNG = b"\x89PNG\r\n\x1a\n"
# A 1x1 grey PNG, drawn by hand in the job (no library needed).
_MAKE_PNG = ("import zlib, struct\n"
             "def chunk(kind, data): return struct.pack('!I', len(data)) + kind + data + "
             "struct.pack('!I', zlib.crc32(kind + data))\n"
             "png = b'\\x89PNG\\r\\n\\x1a\\n' + chunk(b'IHDR', struct.pack('!IIBBBBB', 1, 1, 8, 0, 0, 0, 0)) + "
             "chunk(b'IDAT', zlib.compress(b'\\x00\\x80')) + chunk(b'IEND', b'')\n")


def _call(code: str, *, with_progress: bool) -> tuple[types.CallToolResult, list[tuple[float, str | None]]]:
    progress: list[tuple[float, str | None]] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append((value, message))

    async def main() -> Any:
        async with Client(StdioServerParameters(command=SERVER, args=[]), read_timeout_seconds=60) as client:
            return await client.call_tool("run_python", {"code": code},
                                          progress_callback=on_progress if with_progress else None)

    return anyio.run(main), progress


def test_a_call_with_a_progress_token_hears_each_output_as_it_comes() -> None:
    result, progress = _call("print('one')\ndisplay({'two': 2})\nprint('three')", with_progress=True)
    assert not result.is_error
    assert progress == [(1.0, "one\n"), (2.0, "{'two': 2}"), (3.0, "three\n")]


def test_a_call_without_a_token_gets_no_progress() -> None:
    result, progress = _call("print('quiet')", with_progress=False)
    assert not result.is_error and progress == []


def test_a_displayed_png_is_an_image_and_displayed_html_a_resource() -> None:
    code = _MAKE_PNG + ("from pynox_display import HTML, Image\ndisplay(HTML('<table><tr><td>1</td></tr></table>'))\n"
                        "display(Image(png))\nprint('done')")
    result, _ = _call(code, with_progress=False)
    assert not result.is_error
    text, image, html = result.content
    assert isinstance(text, types.TextContent) and text.text.startswith("done\n[text/html")
    assert isinstance(html, types.EmbeddedResource) and isinstance(html.resource, types.TextResourceContents)
    assert html.resource.mime_type == "text/html" and html.resource.text == "<table><tr><td>1</td></tr></table>"
    assert isinstance(image, types.ImageContent) and image.mime_type == "image/png"
    assert base64.b64decode(image.data).startswith(_PNG)
