"""Rich display and output as it happens, through the Python API: ``Result.outputs`` as typed outputs, the
``on_output`` callback of ``run``, ``arun`` and a session's steps, and the ``stream`` iterators."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from pynox import Output, OutputEvent, Pool, Result, StreamText
from tests.harness.fixtures import shared_pool

pytestmark = pytest.mark.timeout(180)

_PNG = b"\x89PNG\r\n\x1a\n"


pool = shared_pool(workers=2)


def test_outputs_are_typed_and_the_model_reads_them_compactly(pool: Pool) -> None:
    code = ("from pynox_display import HTML, Image, JSON\nimport base64, zlib, struct\n"
            "def chunk(kind, data): return struct.pack('!I', len(data)) + kind + data + "
            "struct.pack('!I', zlib.crc32(kind + data))\n"
            "png = b'\\x89PNG\\r\\n\\x1a\\n' + chunk(b'IHDR', struct.pack('!IIBBBBB', 1, 1, 8, 0, 0, 0, 0)) + "
            "chunk(b'IDAT', zlib.compress(b'\\x00\\x00')) + chunk(b'IEND', b'')\n"
            "display(HTML('<b>bold</b>'))\ndisplay(Image(png))\ndisplay(JSON({'k': 1}))\nprint('printed')\n6 * 7")
    result = pool.run(code)
    assert result.ok, result.text
    html, image, data, value = result.outputs
    assert isinstance(html, Output) and html.output_type == "display_data" and html.html == "<b>bold</b>"
    assert image.png is not None and image.png.startswith(_PNG)
    assert data.json == {"k": 1}
    assert value.output_type == "execute_result" and value.text == "42" and value.execution_count is None
    lines = result.text.splitlines()
    assert lines[0] == "printed" and lines[-1] == "Out: 42"
    assert lines[1].startswith("[text/html") and lines[2].startswith("[image/png ") and lines[3] == '{"k": 1}'


def test_on_output_gets_each_event_in_order_before_the_result(pool: Pool, tmp_path: Path) -> None:
    go = tmp_path / "go"
    seen: list[OutputEvent] = []
    first_seen = threading.Event()

    def on_output(event: OutputEvent) -> None:
        seen.append(event)
        if isinstance(event, StreamText) and event.text == "one\n":
            first_seen.set()
            go.touch()  # the code waits for this: the event came while it ran

    code = (f"import os, time\nprint('one')\nfor _ in range(3000):\n    if os.path.exists({str(go)!r}): break\n"
            f"    time.sleep(0.01)\ndisplay('two')\nprint('three', os.path.exists({str(go)!r}))")
    result = pool.run(code, on_output=on_output, allow_read=[str(tmp_path)])
    assert first_seen.is_set() and result.stdout == "one\nthree True\n"
    assert seen[0] == StreamText("stdout", "one\n")
    assert isinstance(seen[1], Output) and seen[1].text == "'two'"
    assert seen[2] == StreamText("stdout", "three True\n")


def test_arun_calls_on_output_on_its_loop(pool: Pool) -> None:
    async def main() -> tuple[list[OutputEvent], Result, set[int]]:
        threads: set[int] = set()
        seen: list[OutputEvent] = []

        def on_output(event: OutputEvent) -> None:
            threads.add(threading.get_ident())
            seen.append(event)

        result = await pool.arun("import sys\nprint('a')\nprint('b', file=sys.stderr)", on_output=on_output)
        return seen, result, threads

    seen, result, threads = asyncio.run(main())
    assert result.ok and seen == [StreamText("stdout", "a\n"), StreamText("stderr", "b\n")]
    assert threads == {threading.get_ident()}, "called on the caller's event loop"


def test_stream_yields_events_then_the_result(pool: Pool) -> None:
    async def main() -> list[object]:
        return [item async for item in pool.stream("print('x')\ndisplay('shown')\n1")]

    items = asyncio.run(main())
    assert items[0] == StreamText("stdout", "x\n")
    assert isinstance(items[1], Output) and items[1].text == "'shown'"
    assert isinstance(items[-1], Result) and items[-1].return_value == "1" and len(items) == 3


def test_session_steps_stream_and_count(pool: Pool) -> None:
    async def main() -> tuple[Result, list[object], Result]:
        session = pool.session()
        try:
            seen: list[OutputEvent] = []
            first = await session.arun("x = 20\nprint('set')", on_output=seen.append)
            assert seen == [StreamText("stdout", "set\n")]
            items = [item async for item in session.stream("print(x)\nx * 2")]
            third = session.run("display(x)", on_output=seen.append)
            return first, items, third
        finally:
            await session.aclose()

    first, items, third = asyncio.run(main())
    assert first.execution_count == 1
    assert items[0] == StreamText("stdout", "20\n")
    last = items[-1]
    assert isinstance(last, Result) and last.execution_count == 2
    assert last.outputs[0].output_type == "execute_result" and last.outputs[0].execution_count == 2
    assert third.execution_count == 3 and third.outputs[0].text == "20"
