"""The one place the pool reads a job's display channel: frames decoded, checked and bounded.

The job writes one frame per rich output (job/display.py): a 4-byte big-endian length, then JSON
``{"output_type", "data", "metadata"}``. It is written after confinement, by code the job controls: hostile
input, like its report. So here, as the frames stream past:

* a frame longer than the job's ``max_output`` is skipped as it arrives, never buffered whole;
* what is not JSON of an output's shape, a MIME type that is not one, a value of the wrong kind, an image
  that is not a PNG or JPEG whose pixels fit (re-encoded as the figures are, see figures.py) is left out;
* the outputs together are at most ``max_output`` bytes of JSON, and at most :data:`MAX_OUTPUTS` of them.

Whatever is left out says so in its place (a ``text/plain`` note), so the model knows something was shown.
Nothing here is a verdict: outputs are the job's word about its own output, nothing more.
"""

from __future__ import annotations

import base64
import re
from typing import Any, Literal

import msgspec

from ..protocol import Output
from ..wire.frames import HEADER
from .figures import MAX_PIXELS, pixels_only

__all__ = ["MAX_OUTPUTS", "DisplayReader"]

MAX_OUTPUTS = 1000  # outputs in one result; past it one note counts the rest
_MAX_MIME_TYPES = 32  # MIME types in one bundle
_MIME = re.compile(r"[A-Za-z0-9][\w.+-]{0,126}/[A-Za-z0-9][\w.+-]{0,126}")
_NOTE_ROOM = 4096  # a frame may be this much over the limit (its own note, its metadata)


class _Frame(msgspec.Struct, forbid_unknown_fields=True):
    output_type: Literal["display_data", "execute_result"]
    data: dict[str, Any]
    metadata: dict[str, Any] = {}
    # A streaming job's: the bytes it had written to stdout and stderr when it displayed this (see
    # streaming.py, which places the output between them; nothing else reads it).
    at: tuple[int, int] | None = None


# An output as it came, and where it falls in the text (None: not said).
Shown = tuple[Output, tuple[int, int] | None]


_decoder = msgspec.json.Decoder(_Frame)


def _note(text: str) -> Output:
    return Output(output_type="display_data", data={"text/plain": f"[{text}]"}, metadata={})


class DisplayReader:
    """Reads one job's (or one session step's) display channel, chunk by chunk, as the pool's loop reads it.

    ``limit``: bytes of outputs in all (the job's max_output); ``return_value``: the request asked for its
    trailing value, so one ``execute_result`` is taken (any other is not the job's to send)."""

    def __init__(self, limit: int, *, return_value: bool) -> None:
        self.limit = limit
        self.return_value = return_value
        self.outputs: list[Output] = []
        self._kept = 0  # bytes of the outputs taken
        self._buffer = bytearray()
        self._skip = 0  # bytes of an over-long frame still to pass by
        self._dropped = 0  # outputs past MAX_OUTPUTS
        self._results = 0

    def feed(self, chunk: bytes) -> list[Shown]:
        """The outputs complete with this chunk, as they will be in the result (notes included)."""
        new: list[Shown] = []
        view = memoryview(chunk)
        while view:
            if self._skip:
                passed = min(self._skip, len(view))
                self._skip -= passed
                view = view[passed:]
                continue
            self._buffer += view
            view = memoryview(b"")
            while len(self._buffer) >= HEADER.size:
                (size,) = HEADER.unpack_from(self._buffer)
                if size > self.limit + _NOTE_ROOM:
                    self._add(new, _note(f"a display output of {size} bytes was left out: over the output limit "
                                         f"of {self.limit} bytes"))
                    rest = bytes(self._buffer[HEADER.size:])
                    self._buffer.clear()
                    self._skip = size
                    view = memoryview(rest)
                    break
                if len(self._buffer) < HEADER.size + size:
                    break
                body = bytes(self._buffer[HEADER.size:HEADER.size + size])
                del self._buffer[:HEADER.size + size]
                output, at = self._output(body)
                if output is not None:
                    self._add(new, output, at)
        return new

    def finish(self) -> list[Shown]:
        """The channel closed: what is left (a frame cut short, outputs counted past the cap), as notes."""
        new: list[Shown] = []
        if self._buffer or self._skip:
            self._buffer.clear()
            self._skip = 0
            self._add(new, _note("a display output was cut short: the code ended while writing it"))
        if self._dropped:
            self.outputs.append(_note(f"{self._dropped} more display outputs left out: over {MAX_OUTPUTS} in one "
                                      "result"))
            new.append((self.outputs[-1], None))
        return new

    def _add(self, new: list[Shown], output: Output, at: tuple[int, int] | None = None) -> None:
        if len(self.outputs) >= MAX_OUTPUTS:
            self._dropped += 1
            return
        self.outputs.append(output)
        new.append((output, at))

    def _output(self, body: bytes) -> tuple[Output | None, tuple[int, int] | None]:
        try:
            frame = _decoder.decode(body)
        except (msgspec.DecodeError, RecursionError):
            return _note("a display output the pool could not read was left out"), None
        if frame.output_type == "execute_result":
            self._results += 1
            if not self.return_value or self._results > 1:
                return None, None  # not asked for, or not the job's own: the code has one trailing value
        if self._kept + len(body) > self.limit:
            return _note(f"a display output of {len(body)} bytes ({_kinds(frame.data)}) was left out: the outputs "
                         f"together were over the output limit of {self.limit} bytes"), frame.at
        data, left_out = _checked(frame.data)
        if not data:
            return _note(f"a display output was left out: {left_out or 'it had no data'}"), frame.at
        self._kept += len(body)
        return Output(output_type=frame.output_type, data=data, metadata=frame.metadata,
                      execution_count=None if frame.output_type == "execute_result" else msgspec.UNSET), frame.at


def _kinds(data: dict[str, Any]) -> str:
    return ", ".join(sorted(str(mime)[:64] for mime in list(data)[:8]))


def _checked(data: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The bundle's entries a reader may take, and what was left out and why."""
    kept: dict[str, Any] = {}
    problems: list[str] = []
    for mime, value in list(data.items())[:_MAX_MIME_TYPES]:
        if not _MIME.fullmatch(mime):
            problems.append("a key that is not a MIME type")
            continue
        json_type = mime == "application/json" or mime.endswith("+json")
        if not json_type and not isinstance(value, str):
            problems.append(f"{mime} not a string")
            continue
        if mime == "image/png" or mime == "image/jpeg":
            try:
                value = _image(mime, value)
            except ValueError as exc:
                problems.append(f"{mime}: {exc}")
                continue
        elif mime.startswith("image/") and mime != "image/svg+xml":
            problems.append(f"{mime}: only PNG, JPEG and SVG images are passed on")
            continue
        kept[mime] = value
    if kept and "text/plain" not in kept:
        kept["text/plain"] = f"<{_kinds(kept)}>"
    if problems and kept:
        kept["text/plain"] += f" [left out: {'; '.join(problems[:4])}]"
    return kept, "; ".join(problems[:4])


def _image(mime: str, value: str) -> str:
    """A PNG re-encoded to its pixel chunks, a JPEG checked for its size; base64 both ways."""
    try:
        raw = base64.b64decode(value, validate=True)
    except (ValueError, TypeError):
        raise ValueError("not base64") from None
    if mime == "image/png":
        return base64.b64encode(pixels_only(raw)).decode("ascii")
    width, height = _jpeg_size(raw)
    if width * height > MAX_PIXELS:
        raise ValueError(f"{width} x {height} pixels is more than {MAX_PIXELS} pixels")
    return value


_SOF = frozenset({0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF})


def _jpeg_size(raw: bytes) -> tuple[int, int]:
    """A JPEG's width and height, from its frame header (a reader decodes that many pixels)."""
    if not raw.startswith(b"\xff\xd8"):
        raise ValueError("not a JPEG")
    at = 2
    while at + 4 <= len(raw):
        if raw[at] != 0xFF:
            raise ValueError("not a JPEG")
        marker = raw[at + 1]
        if marker == 0xFF:
            at += 1
            continue
        length = int.from_bytes(raw[at + 2:at + 4], "big")
        if marker in _SOF:
            if at + 9 > len(raw):
                break
            return int.from_bytes(raw[at + 7:at + 9], "big"), int.from_bytes(raw[at + 5:at + 7], "big")
        if marker in (0xD9, 0xDA) or length < 2:
            break
        at += 2 + length
    raise ValueError("a JPEG needs a frame header before its data")
