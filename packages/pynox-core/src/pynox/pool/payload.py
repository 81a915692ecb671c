"""A job's payload, from the server straight to its confined child, past the template unread.

The server writes the payload into a memfd and sends the descriptor
with the job's confinement; the template hands the descriptor to the child
without reading it, and the child reads it only once it is confined. So code,
arguments and environment never enter the template's memory, which every
later child inherits, and a child prepared ahead never holds anything of the
job before it.
"""

from __future__ import annotations

import os

import msgspec

from ..job import Payload

__all__ = ["read_payload", "write_payload", "write_payload_to"]

_decoder = msgspec.json.Decoder(Payload)


def write_payload(payload: Payload) -> int:
    """A descriptor holding ``payload``, its offset at the start; the caller sends it and closes it."""
    fd = os.memfd_create("pynox-payload", os.MFD_CLOEXEC)
    try:
        data, offset = msgspec.json.encode(payload), 0
        while offset < len(data):  # pwrite: the offset, shared with the child's copy, stays at 0
            offset += os.pwrite(fd, memoryview(data)[offset:], offset)
    except BaseException:
        os.close(fd)
        raise
    return fd


def write_payload_to(fd: int, payload: Payload) -> None:
    """Write ``payload`` on a pipe (the child's warm-up: the same read, without a memfd)."""
    view = memoryview(msgspec.json.encode(payload))
    while view:
        view = view[os.write(fd, view):]


def read_payload(fd: int) -> Payload:
    """Read ``fd`` to its end and close it (in the confined child)."""
    chunks = []
    try:
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
    finally:
        os.close(fd)
    return _decoder.decode(b"".join(chunks))
