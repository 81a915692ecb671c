"""pynox-pydantic-ai's rich display, with pydantic-ai's own ``FunctionModel``: an image the code displays
reaches the model as ``BinaryContent`` of its type, after the text that names it."""

from __future__ import annotations

import pytest
from pydantic_ai import Agent, BinaryContent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from pynox import Pool
from pynox_pydantic_ai import PynoxToolset
from tests.harness.fixtures import shared_pool

pytestmark = pytest.mark.timeout(90)

_CODE = ("import zlib, struct\n"
         "def chunk(kind, data): return struct.pack('!I', len(data)) + kind + data + "
         "struct.pack('!I', zlib.crc32(kind + data))\n"
         "png = b'\\x89PNG\\r\\n\\x1a\\n' + chunk(b'IHDR', struct.pack('!IIBBBBB', 1, 1, 8, 0, 0, 0, 0)) + "
         "chunk(b'IDAT', zlib.compress(b'\\x00\\x80')) + chunk(b'IEND', b'')\n"
         "from pynox_display import Image\nprint('made')\ndisplay(Image(png))")


pool = shared_pool(workers=1)


def test_a_displayed_image_reaches_the_model_as_binary_content(pool: Pool) -> None:
    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if any(isinstance(part, ToolReturnPart) for message in messages for part in message.parts):
            return ModelResponse(parts=[TextPart("done")])
        return ModelResponse(parts=[ToolCallPart("run_python", {"code": _CODE})])

    result = Agent(FunctionModel(respond), toolsets=[PynoxToolset(pool)]).run_sync("go")
    [part] = [part for message in result.all_messages() for part in message.parts if isinstance(part, ToolReturnPart)]
    text, image = part.content
    assert text.startswith("made\n[image/png ")
    assert isinstance(image, BinaryContent) and image.media_type == "image/png"
    assert image.data.startswith(b"\x89PNG\r\n\x1a\n")
