"""The pool's two pipes: request lines in (bounded, interruptible by signals) and result lines out.

Input is read with ``os.read`` under ``select`` together with a wake-up
descriptor, so the end of a drain stops intake between lines, never inside a
half-handled request. A line longer than the limit is
discarded as it streams past, never buffered whole.
"""

from __future__ import annotations

import os
import select
import stat
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import BinaryIO

from ..protocol import MAX_LINE, RequestId, reply_call_id, request_id_from_head

__all__ = ["LineReader", "Output", "TooLong", "too_long", "watch_for_client_death"]

_CHUNK = 1 << 16


_HEAD = 256  # bytes of an over-long line kept, so that the pool can still say which request or call it was


@dataclass(frozen=True)
class TooLong:
    size: int
    head: bytes = b""


def too_long(line: TooLong, fail_call: Callable[[int, str], bool]) -> tuple[RequestId, str]:
    """The refusal of a line discarded for its length: the id it answers to, and why. A host's reply whose call
    is pending fails that call (``fail_call``: False when none is) and the refusal names the call; any other
    line is refused under the request id its first bytes show, if they show one."""
    call_id = reply_call_id(line.head)
    if call_id is not None and fail_call(
            call_id, f"the host's reply of {line.size} bytes exceeds the pool's 1 MiB line limit"):
        return None, (f"reply to call {call_id}: line of {line.size} bytes exceeds the 1 MiB limit; the job's call "
                      "fails with HostError")
    return request_id_from_head(line.head), f"line of {line.size} bytes exceeds the 1 MiB limit; it was discarded"


class LineReader:
    """Lines of ``fd`` until EOF or until ``stopping()`` is true (checked when ``wakeup_fd`` is written);
    then :meth:`rest` gives the complete lines already written, so that they can be answered too."""

    def __init__(self, fd: int, wakeup_fd: int, stopping: Callable[[], bool],
                 holding: Callable[[int], None] | None = None) -> None:
        """``holding``: told, after each read, how many bytes of an unfinished line the reader now holds."""
        self._fd = fd
        self._holding = holding
        self._wakeup = wakeup_fd
        self._stopping = stopping
        self._buffer = bytearray()
        self._discarding = 0  # bytes of an over-long line skipped so far
        self._head = b""  # its first bytes
        self._eof = False
        self.read_ns = 0  # when the chunk holding the line last yielded was read: that line's arrival

    def __iter__(self) -> Iterator[bytes | TooLong]:
        # poll, not select: a connection's descriptor may be numbered past select's 1024 (server/waiting.py).
        poller = select.poll()
        poller.register(self._fd, select.POLLIN)
        poller.register(self._wakeup, select.POLLIN)
        while not self._stopping():
            ready = [fd for fd, _ in poller.poll()]
            if self._wakeup in ready:
                os.read(self._wakeup, 512)
                continue
            chunk = os.read(self._fd, _CHUNK)
            self.read_ns = time.monotonic_ns()
            if not chunk:
                self._eof = True
                break
            yield from self._lines(chunk)
            if self._holding is not None:
                self._holding(len(self._buffer))
        if self._stopping():
            return
        yield from self._last()

    def rest(self) -> Iterator[bytes | TooLong]:
        """After a stop: the lines already in the buffer and in the pipe, without waiting for more. A last
        line without its newline is left: its writer may not have finished it."""
        if self._eof:
            return
        os.set_blocking(self._fd, False)
        try:
            yield from self._lines(b"")
            while True:
                try:
                    chunk = os.read(self._fd, _CHUNK)
                except BlockingIOError:
                    return
                if not chunk:
                    yield from self._last()
                    return
                yield from self._lines(chunk)
        finally:
            os.set_blocking(self._fd, True)

    def _lines(self, chunk: bytes) -> Iterator[bytes | TooLong]:
        buffer = self._buffer
        buffer += chunk
        while True:
            newline = buffer.find(b"\n")
            if newline < 0:
                if len(buffer) > MAX_LINE:
                    if not self._discarding:
                        self._head = bytes(buffer[:_HEAD])
                    self._discarding += len(buffer)
                    buffer.clear()
                return
            line = bytes(buffer[:newline])
            del buffer[: newline + 1]
            if self._discarding:
                yield TooLong(self._discarding + len(line), self._head)
                self._discarding = 0
            elif len(line) > MAX_LINE:
                yield TooLong(len(line), line[:_HEAD])
            elif line.strip():
                yield line

    def _last(self) -> Iterator[bytes | TooLong]:
        """At EOF: a last line without its newline still counts."""
        buffer = self._buffer
        if self._discarding:
            yield TooLong(self._discarding + len(buffer), self._head)
        elif buffer.strip():
            yield bytes(buffer) if len(buffer) <= MAX_LINE else TooLong(len(buffer), bytes(buffer[:_HEAD]))
        self._discarding = 0
        buffer.clear()


class Output:
    """Result lines to stdout, one writer at a time. A blocked pipe blocks the writer: that is backpressure."""

    def __init__(self, stream: BinaryIO) -> None:
        self._stream = stream
        self._lock = threading.Lock()

    def write(self, line: bytes) -> None:
        with self._lock:
            self._stream.write(line)
            self._stream.flush()


def watch_for_client_death(fd: int, on_death: Callable[[], None]) -> None:
    """When the reader of our stdout pipe is gone, call ``on_death`` (the client died; nobody will read us)."""
    mode = os.fstat(fd).st_mode
    if not (stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)):
        return  # a file or a terminal: there is no reader to lose

    def watch() -> None:
        poller = select.poll()
        poller.register(fd, 0)  # POLLERR and POLLHUP are always reported
        while True:
            for _, event in poller.poll():
                if event & (select.POLLERR | select.POLLHUP | select.POLLNVAL):
                    on_death()
                    return

    threading.Thread(target=watch, name="pynox-client-watch", daemon=True).start()


def stdio() -> tuple[int, BinaryIO]:
    return sys.stdin.fileno(), sys.stdout.buffer
