"""Images from a job are hostile input (issue 30, finding 7): a PNG of one pixel whose zTXt chunks inflate to
1 MB each made the smolagents executor hold 845 MiB for 14 of them. The pool re-encodes every image a job
reports down to the chunks that define its pixels, and the smolagents reader reads no text chunk, so no
consumer inflates more than the pixels. Measured from the host: the RSS of the executor's process.
"""

from __future__ import annotations

import io
import struct
import zlib

import pytest

import pynox
from pynox_smolagents import PynoxExecutor
from pynox_smolagents._values import images_from_png
from tests.harness import procfs
from tests.harness.fixtures import shared_pool

pytestmark = pytest.mark.timeout(120)

CHUNKS = 64  # PIL keeps at most 64 MiB of text per image: this many chunks of 1 MiB reach it
IMAGES = 4


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def inflating_png() -> bytes:
    """One pixel, and ``CHUNKS`` zTXt chunks of 1 MiB each as PIL inflates them (1 KiB each as sent)."""
    text = zlib.compress(b"\0" * (1 << 20), 9)
    header = _chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 0, 0, 0, 0))
    ztxt = b"".join(_chunk(b"zTXt", f"k{n}".encode() + b"\0\0" + text) for n in range(CHUNKS))
    pixels = _chunk(b"IDAT", zlib.compress(b"\0\0"))
    return b"\x89PNG\r\n\x1a\n" + header + ztxt + pixels + _chunk(b"IEND", b"")


def rss_mib() -> float:
    return procfs.status_number("self", "VmRSS") / 1024


pool = shared_pool(workers=1)


def test_the_control_pil_inflates_the_text_of_such_a_png() -> None:
    from PIL import Image

    before = rss_mib()
    image = Image.open(io.BytesIO(inflating_png()))
    image.load()
    assert rss_mib() - before > 32, "the forged PNG no longer inflates in PIL: the attack below proves nothing"
    assert len(image.text) == CHUNKS
    del image


def test_forged_figures_reach_the_executor_as_their_pixels_only(pool: pynox.Pool) -> None:
    forged = inflating_png()
    code = ("import sys\nimport matplotlib.pyplot\nfrom pynox.job import figures\n"
            f"figures._shown.extend([{forged!r}] * {IMAGES})\nprint('forged')")
    executor = PynoxExecutor(pool, max_output="8MB")
    before = rss_mib()
    try:
        executor(code)
        held = executor.step_images
        grown = rss_mib() - before
    finally:
        executor.cleanup()
    assert grown < 32, f"the executor's process grew by {grown:.0f} MiB for {IMAGES} one-pixel images"
    assert len(held) == IMAGES and held[0].size == (1, 1)  # the pixels are kept...
    assert not held[0].text  # ...and the text chunks are not


def test_the_pool_keeps_only_the_chunks_of_the_pixels(pool: pynox.Pool) -> None:
    forged = inflating_png()
    result = pool.run("import sys\nimport matplotlib.pyplot\n"
                      "from pynox.job import figures\nfigures._shown.append(" + repr(forged) + ")",
                      max_output="8MB")
    assert len(result.images) == 1
    kept = result.images[0]
    assert len(kept) < 200 and b"zTXt" not in kept and kept.startswith(b"\x89PNG")


def test_the_smolagents_reader_reads_no_text_chunk() -> None:
    before = rss_mib()
    images = images_from_png([inflating_png()] * 2)
    assert rss_mib() - before < 32 and images[0].size == (1, 1) and not images[0].text



def _declared(width: int, height: int) -> bytes:
    """A PNG whose header declares ``width`` x ``height`` pixels (its few bytes of pixel data are no matter)."""
    header = _chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
    return b"\x89PNG\r\n\x1a\n" + header + _chunk(b"IDAT", zlib.compress(b"\0\0")) + _chunk(b"IEND", b"")


def test_a_png_that_declares_more_pixels_than_a_figure_has_is_dropped_by_the_pool(pool: pynox.Pool) -> None:
    # 16k x 16k zeros deflate a thousandfold: a gigabyte for whoever decodes them (an adversarial review).
    # The control: a PNG of matplotlib's size comes through, after it.
    forged = [_declared(16384, 16384), _declared(640, 480)]
    result = pool.run("import sys\nimport matplotlib.pyplot\n"
                      "from pynox.job import figures\nfigures._shown.extend(" + repr(forged) + ")", max_output="8MB")
    assert len(result.images) == 1 and b"\x00\x00\x02\x80\x00\x00\x01\xe0" in result.images[0], result.images


def test_a_displayed_png_is_a_step_image_too(pool: pynox.Pool) -> None:
    """What a step displays (``display(Image(...))``) reaches the model as smolagents shows a step's images."""
    png = b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", struct.pack(">IIBBBBB", 2, 1, 8, 0, 0, 0, 0)) + \
        _chunk(b"IDAT", zlib.compress(b"\0\0\0")) + _chunk(b"IEND", b"")
    executor = PynoxExecutor(pool)
    try:
        executor(f"from pynox_display import Image\ndisplay(Image({png!r}))\nprint('shown')")
        held = executor.step_images
    finally:
        executor.cleanup()
    assert len(held) == 1 and held[0].size == (2, 1)
