"""pynox-mcp's files, through the MCP SDK's own client starting the real server: with ``--session --scratch``,
the session's scratch directory is MCP resources (listed with MIME types and sizes, read as text or blob,
bounded by ``--max-resource-size``), and ``upload_file`` puts a file in for the next call."""

from __future__ import annotations

import base64
import subprocess
from typing import Any

import mcp_types as types
import pytest
from mcp.client import Client
from mcp.shared.exceptions import MCPError

from .test_mcp import SERVER, run, text_of, with_client

pytestmark = pytest.mark.timeout(120)

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256))


async def _read(client: Client, uri: str) -> types.TextResourceContents | types.BlobResourceContents:
    [contents] = (await client.read_resource(uri, cache_mode="bypass")).contents
    return contents


async def _refused(client: Client, uri: str) -> str:
    with pytest.raises(MCPError) as caught:
        await client.read_resource(uri, cache_mode="bypass")
    return str(caught.value)


def test_the_sessions_files_are_resources_and_upload_file_puts_one_in(earlier_pools: frozenset[int]) -> None:
    async def body(client: Client) -> dict[str, Any]:
        seen: dict[str, Any] = {"before": (await client.list_resources(cache_mode="bypass")).resources}
        tools = {tool.name for tool in (await client.list_tools()).tools}
        seen["tools"] = tools
        templates = (await client.list_resource_templates(cache_mode="bypass")).resource_templates
        seen["template"] = templates[0].uri_template
        wrote = await run(client, "open('out.csv', 'w').write('a,b\\n1,2\\n')\n"
                                  f"open('chart.png', 'wb').write({PNG!r})\n"
                                  "import os\nos.symlink('/etc/shadow', 'shadow')\n"
                                  "open('big.txt', 'w').write('x' * 5000)")
        assert not wrote.is_error, text_of(wrote)
        listed = (await client.list_resources(cache_mode="bypass")).resources
        seen["listed"] = sorted((r.name, r.uri, r.mime_type, r.size) for r in listed)
        seen["csv"] = await _read(client, "pynox://scratch/out.csv")
        seen["png"] = await _read(client, "pynox://scratch/chart.png")
        seen["big"] = await _refused(client, "pynox://scratch/big.txt")
        seen["shadow"] = await _refused(client, "pynox://scratch/shadow")
        seen["up"] = await _refused(client, "pynox://scratch/../../etc/passwd")
        uploaded = await client.call_tool("upload_file", {"path": "in/notes.txt", "text": "from the client"})
        seen["uploaded"] = uploaded
        binary = await client.call_tool("upload_file", {"path": "in/data.bin",
                                                        "base64": base64.b64encode(b"\x00\x01\x02").decode()})
        assert not binary.is_error, text_of(binary)
        seen["read_back"] = await run(client, "print(open('in/notes.txt').read(), open('in/data.bin', 'rb').read())")
        seen["too_big"] = await client.call_tool("upload_file", {"path": "huge.txt", "text": "y" * 5000})
        seen["bad"] = await client.call_tool("upload_file", {"path": "../out.txt", "text": "x"})
        return seen

    seen = with_client(["--session", "--scratch", "--max-resource-size", "4k"], body)
    assert seen["before"] == [] and seen["tools"] == {"run_python", "upload_file"}
    assert seen["template"] == "pynox://scratch/{path}"
    assert seen["listed"] == [("big.txt", "pynox://scratch/big.txt", "text/plain", 5000),
                              ("chart.png", "pynox://scratch/chart.png", "image/png", len(PNG)),
                              ("out.csv", "pynox://scratch/out.csv", "text/csv", 8)]  # the symlink is not there
    csv, png = seen["csv"], seen["png"]
    assert isinstance(csv, types.TextResourceContents) and csv.text == "a,b\n1,2\n" and csv.mime_type == "text/csv"
    assert isinstance(png, types.BlobResourceContents) and base64.b64decode(png.blob) == PNG
    assert "big.txt is 5000 bytes, over this server's 4k (--max-resource-size)" in seen["big"]
    assert "no file 'shadow'" in seen["shadow"] and "no file" in seen["up"]
    uploaded = seen["uploaded"]
    assert not uploaded.is_error and text_of(uploaded).startswith("Uploaded in/notes.txt (15 bytes, text/plain)")
    links = [block for block in uploaded.content if isinstance(block, types.ResourceLink)]
    assert [link.uri for link in links] == ["pynox://scratch/in/notes.txt"]
    assert text_of(seen["read_back"]) == "from the client b'\\x00\\x01\\x02'"
    assert seen["too_big"].is_error and "over this server's" in text_of(seen["too_big"])
    assert seen["bad"].is_error and "goes up" in text_of(seen["bad"])


def test_without_scratch_there_are_no_resources(earlier_pools: frozenset[int]) -> None:
    async def body(client: Client) -> tuple[set[str], str]:
        tools = {tool.name for tool in (await client.list_tools()).tools}
        with pytest.raises(MCPError) as caught:
            await client.list_resources(cache_mode="bypass")
        return tools, str(caught.value)

    tools, error = with_client(["--session"], body)
    assert tools == {"run_python"} and "not found" in error.lower()


def test_scratch_needs_a_session() -> None:
    done = subprocess.run([SERVER, "--scratch"], capture_output=True, text=True, timeout=30, check=False,
                          stdin=subprocess.PIPE)
    assert done.returncode == 2 and "--scratch needs --session" in done.stderr
