"""Output as it happens: the events a request with ``stream`` gets before its result.

The pool's loop for the job (templates.collect) hands each kept chunk of stdout and stderr (what counts
against max_output, and no more) and each display output here. Text is coalesced: sent when 4 KiB wait or
50 ms after the first of them, whichever comes first (the loop wakes for that, see :meth:`Streamer.due`);
a display output sends what waits before it, then itself, so the order is the order the pool read them in.

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


class Streamer:
    """The events of one request (a job, or one session step), in order."""

    def __init__(self, request_id: RequestId, session: str | None, write: Callable[[bytes], None]) -> None:
        self._id = request_id
        self._session: str | msgspec.UnsetType = session if session is not None else msgspec.UNSET
        self._write = write
        self._decoders = {name: codecs.getincrementaldecoder("utf-8")("replace") for name in ("stdout", "stderr")}
        self._text: list[tuple[StreamName, str]] = []  # waiting to be sent, coalesced per stream
        self._waiting = 0  # characters waiting
        self._since: int | None = None  # monotonic ns of the first waiting chunk
        self._lines: collections.deque[bytes] = collections.deque()
        self._ready = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False

    # -- on the loop's thread --------------------------------------------------------------------------
    def text(self, name: StreamName, chunk: bytes) -> None:
        decoded = self._decoders[name].decode(chunk)
        if not decoded:
            return
        if self._text and self._text[-1][0] == name:
            self._text[-1] = (name, self._text[-1][1] + decoded)
        else:
            self._text.append((name, decoded))
        self._waiting += len(decoded)
        if self._since is None:
            self._since = time.monotonic_ns()
        if self._waiting >= COALESCE_BYTES:
            self.flush()

    def display(self, output: Output) -> None:
        self.flush()
        self._send(encode(DisplayEvent(id=self._id, data=output.data, metadata=output.metadata,
                                       session=self._session)))

    def due(self) -> int | None:
        """When (monotonic ns) the waiting text is to be sent; None if none waits."""
        return None if self._since is None else self._since + COALESCE_NS

    def tick(self, now: int) -> None:
        if self._since is not None and now >= self._since + COALESCE_NS:
            self.flush()

    def flush(self) -> None:
        for name, text in self._text:
            self._send(encode(StreamEvent(id=self._id, name=name, text=text, session=self._session)))
        self._text.clear()
        self._waiting, self._since = 0, None

    def finish(self) -> None:
        """The job is over: send what waits (a character cut short included), then wait until every event
        is written. Called before the result is written."""
        for name, decoder in self._decoders.items():
            rest = decoder.decode(b"", final=True)
            if rest:
                self._text.append((name, rest))  # type: ignore[arg-type]
        self.flush()
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
