"""A job's payload, from the server straight to its confined child, past the template unread.

The server writes the payload into a sealed memfd and sends the descriptor
with the job's confinement; the template hands the descriptor to the child
without reading it, and the child reads it only once it is confined. So code,
arguments and environment never enter the template's memory, which every
later child inherits, and a child prepared ahead never holds anything of the
job before it.
"""

from __future__ import annotations

import fcntl
import os

import msgspec

from ..job import Payload

__all__ = ["read_payload", "write_payload"]

_SEALS = fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE
_decoder = msgspec.json.Decoder(Payload)


def write_payload(payload: Payload) -> int:
    """A read-only descriptor holding ``payload``; the caller sends it and closes it."""
    data = msgspec.json.encode(payload)
    fd = os.memfd_create("pynox-payload", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)  # what the child reads is what the server wrote
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_payload(fd: int) -> Payload:
    """Read and close the payload descriptor (in the confined child)."""
    try:
        size = os.fstat(fd).st_size
        chunks, offset = [], 0
        while offset < size:
            chunk = os.pread(fd, size - offset, offset)
            if not chunk:
                break
            chunks.append(chunk)
            offset += len(chunk)
    finally:
        os.close(fd)
    return _decoder.decode(b"".join(chunks))
