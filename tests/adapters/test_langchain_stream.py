"""pynox-langchain's output as it happens, on LangGraph's own machinery: in a graph streamed with
``stream_mode="custom"``, the tool's output reaches the stream writer as the protocol's events while the
code runs; and a displayed image is an image content block. The agent is LangGraph's, the model LangChain's
fake chat model (``scripted_langgraph``), the tool runs on a real pool."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.messages import HumanMessage, ToolMessage

from pynox import Pool
from pynox_langchain import python_tool

from .scripted import code_calls
from .scripted_langgraph import ScriptedChatModel, agent_graph, tool_calls

pytestmark = pytest.mark.timeout(90)


def _stream(pool: Pool, code: str, mode: Any) -> list[Any]:
    model = ScriptedChatModel(responses=tool_calls(code_calls(code)))
    graph = agent_graph(model, [python_tool(pool)])
    return list(graph.stream({"messages": [HumanMessage("Use the Python tool.")]}, stream_mode=mode))


def test_a_graph_streaming_custom_events_gets_the_output_as_it_happens(pool: Pool) -> None:
    chunks = _stream(pool, "print('one')\ndisplay({'two': 2})\nprint('three')", ["custom", "updates"])
    custom = [chunk for mode, chunk in chunks if mode == "custom"]
    assert custom == [{"event": "stream", "name": "stdout", "text": "one\n"},
                      {"event": "display_data", "data": {"text/plain": "{'two': 2}"}, "metadata": {}},
                      {"event": "stream", "name": "stdout", "text": "three\n"}]
    first_tool_update = next(i for i, (mode, chunk) in enumerate(chunks) if mode == "updates" and "tools" in chunk)
    assert all(i < first_tool_update for i, (mode, _) in enumerate(chunks) if mode == "custom"), \
        "every event came before the tool's message"


def test_a_displayed_image_is_an_image_block(pool: Pool) -> None:
    code = ("import zlib, struct\n"
            "def chunk(kind, data): return struct.pack('!I', len(data)) + kind + data + "
            "struct.pack('!I', zlib.crc32(kind + data))\n"
            "png = b'\\x89PNG\\r\\n\\x1a\\n' + chunk(b'IHDR', struct.pack('!IIBBBBB', 1, 1, 8, 0, 0, 0, 0)) + "
            "chunk(b'IDAT', zlib.compress(b'\\x00\\x80')) + chunk(b'IEND', b'')\n"
            "from pynox_display import Image\ndisplay(Image(png))")
    message = python_tool(pool).invoke({"type": "tool_call", "name": "run_python", "id": "c1", "args": {"code": code}})
    assert isinstance(message, ToolMessage) and message.status == "success", message.content
    text, image = message.content
    assert text["text"].startswith("[image/png ")
    assert image["type"] == "image" and image["mime_type"] == "image/png" and image["base64"].startswith("iVBOR")
