"""Frames on a job's private channels: length-prefixed JSON over a connected unix socket.

Two channels use it: host-function calls (job <-> pool) and session steps
(pool -> session child). The job end is handed to the child as a descriptor;
the child cannot open a socket of its own to reach anything. Everything read
from a child is bounded: a frame header announcing more than ``limit`` bytes
is a protocol violation, not an allocation.
"""

from __future__ import annotations

import struct

__all__ = ["HEADER", "FrameBuffer", "FrameTooLarge", "pack"]

HEADER = struct.Struct("!I")


class FrameTooLarge(ValueError):
    pass


def pack(payload: bytes) -> bytes:
    return HEADER.pack(len(payload)) + payload


class FrameBuffer:
    """Reassembles frames from chunks as they arrive (the reader never blocks on a partial frame)."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._buffer = bytearray()

    def feed(self, chunk: bytes) -> list[bytes]:
        self._buffer += chunk
        frames: list[bytes] = []
        while len(self._buffer) >= HEADER.size:
            (size,) = HEADER.unpack_from(self._buffer)
            if size > self._limit:
                raise FrameTooLarge(f"a frame of {size} bytes exceeds the {self._limit}-byte limit")
            if len(self._buffer) < HEADER.size + size:
                break
            frames.append(bytes(self._buffer[HEADER.size : HEADER.size + size]))
            del self._buffer[: HEADER.size + size]
        return frames
