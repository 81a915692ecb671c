"""Output as it happens: the events a request with ``stream`` gets before its result.

The pool's loop for the job (templates.collect) hands each kept chunk of stdout and stderr (what counts
against max_output, and no more) and each display output here. Text is coalesced: sent when 4 KiB wait or
50 ms after the first of them, whichever comes first (the loop wakes for that, see :meth:`Streamer.due`);
a display output sends what waits before it, then itself. The pool reads stdout, stderr and the display
channel as three pipes, so a fast job's text written after a display output may come in the same read as
the text before it: a streaming job's display frame says how many bytes of each stream it had written
(``at``), and text read past that waits until after the output.

Events go out on a thread of the streamer's own, started with its first event: a client that reads slowly
holds up that thread, never the loop that enforces the job's deadline. :meth:`Streamer.finish` waits for
it, after the job is over and before its result is written, so every event precedes its result. A job
that does not stream has no streamer and pays nothing.
"""

from __future__ import annotations

import codecs
import collections
import threading
import time
from collections.abc import Callable
from typing import Literal

import msgspec

from ..protocol import DisplayEvent, Output, RequestId, StreamEvent, encode

__all__ = ["COALESCE_BYTES", "COALESCE_NS", "Streamer"]

COALESCE_BYTES = 4096
COALESCE_NS = 50_000_000

StreamName = Literal["stdout", "stderr"]
_NAMES: tuple[StreamName, StreamName] = ("stdout", "stderr")


class Streamer:
    """The events of one request (a job, or one session step), in order."""

    def __init__(self, request_id: RequestId, session: str | None, write: Callable[[bytes], None]) -> None:
        self._id = request_id
        self._session: str | msgspec.UnsetType = session if session is not None else msgspec.UNSET
        self._write = write
        self._decoders = {name: codecs.getincrementaldecoder("utf-8")("replace") for name in _NAMES}
        self._text: list[tuple[StreamName, bytearray]] = []  # waiting to be sent, coalesced per stream
        self._read = dict.fromkeys(_NAMES, 0)  # bytes of each stream read so far
        self._waiting = 0  # bytes waiting
        self._since: int | None = None  # monotonic ns of the first waiting chunk
        self._lines: collections.deque[bytes] = collections.deque()
        self._ready = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False

    # -- on the loop's thread --------------------------------------------------------------------------
    def text(self, name: StreamName, chunk: bytes) -> None:
        self._read[name] += len(chunk)
        self._wait(name, chunk)
        if self._waiting >= COALESCE_BYTES:
            self.flush()

    def _wait(self, name: StreamName, chunk: bytes) -> None:
        if self._text and self._text[-1][0] == name:
            self._text[-1][1].extend(chunk)
        else:
            self._text.append((name, bytearray(chunk)))
        self._waiting += len(chunk)
        if self._since is None:
            self._since = time.monotonic_ns()

    def display(self, output: Output, at: tuple[int, int] | None = None) -> None:
        """Send ``output`` after the text written before it (``at``: bytes of stdout and stderr, as the job
        counted them), holding back what waits of the text written after it."""
        later: list[tuple[StreamName, bytes]] = []
        if at is not None:
            for name, written in zip(_NAMES, at, strict=True):
                later += self._hold_back(name, self._read[name] - max(written, 0))
        self.flush()
        self._send(encode(DisplayEvent(id=self._id, data=output.data, metadata=output.metadata,
                                       session=self._session)))
        for name, chunk in later:
            self._wait(name, chunk)

    def _hold_back(self, name: StreamName, excess: int) -> list[tuple[StreamName, bytes]]:
        """The last ``excess`` waiting bytes of stream ``name``, taken out of what waits."""
        held: list[tuple[StreamName, bytes]] = []
        for index in range(len(self._text) - 1, -1, -1):
            if excess <= 0:
                break
            kind, data = self._text[index]
            if kind != name:
                continue
            taken = min(excess, len(data))
            held.insert(0, (name, bytes(data[len(data) - taken:])))
            del data[len(data) - taken:]
            self._waiting -= taken
            excess -= taken
        self._text = [(kind, data) for kind, data in self._text if data]
        return held

    def due(self) -> int | None:
        """When (monotonic ns) the waiting text is to be sent; None if none waits."""
        return None if self._since is None else self._since + COALESCE_NS

    def tick(self, now: int) -> None:
        if self._since is not None and now >= self._since + COALESCE_NS:
            self.flush()

    def flush(self) -> None:
        for name, data in self._text:
            text = self._decoders[name].decode(bytes(data))
            if text:
                self._send(encode(StreamEvent(id=self._id, name=name, text=text, session=self._session)))
        self._text.clear()
        self._waiting, self._since = 0, None

    def finish(self) -> None:
        """The job is over: send what waits (a character cut short included), then wait until every event
        is written. Called before the result is written."""
        self.flush()
        for name, decoder in self._decoders.items():
            rest = decoder.decode(b"", final=True)
            if rest:  # a character cut short at the end
                self._send(encode(StreamEvent(id=self._id, name=name, text=rest, session=self._session)))
        with self._ready:
            self._closed = True
            self._ready.notify()
        if self._thread is not None:
            self._thread.join()

    # -- the writer ------------------------------------------------------------------------------------
    def _send(self, line: bytes) -> None:
        with self._ready:
            self._lines.append(line)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="pynox-stream", daemon=True)
                self._thread.start()
            self._ready.notify()

    def _run(self) -> None:
        while True:
            with self._ready:
                while not self._lines and not self._closed:
                    self._ready.wait()
                if not self._lines:
                    return
                line = self._lines.popleft()
            try:
                self._write(line)
            except Exception:  # the client is gone: the result's own write finds out
                return
