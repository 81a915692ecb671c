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
import sys

import msgspec

from .spec import Payload

__all__ = ["CLAIMED", "claim", "decode_payload", "encode_payload", "new_claim", "new_payload", "read_payload",
           "take_back", "write_payload"]

CLAIMED = (1).to_bytes(8, sys.byteorder)  # what a read of the claim gives its one taker

_decoder = msgspec.json.Decoder(Payload)


def write_payload(fd: int, payload: Payload) -> None:
    """Write ``payload`` into ``fd``, an empty memfd (:func:`new_payload`), its offset left at the start; the
    caller sends it and closes it."""
    data, offset = encode_payload(payload), 0
    while offset < len(data):  # pwrite: the offset, shared with the child's copy, stays at 0
        offset += os.pwrite(fd, memoryview(data)[offset:], offset)


def new_payload() -> int:
    """An empty memfd for a job's payload."""
    return os.memfd_create("pynox-payload", os.MFD_CLOEXEC)


def encode_payload(payload: Payload) -> bytes:
    return msgspec.json.encode(payload)


def decode_payload(data: bytes) -> Payload:
    """``data`` as a payload (what :func:`read_payload` read; a prepared child's warm-up decodes one of its own)."""
    return _decoder.decode(data)


def new_claim() -> int:
    """The job's claim: a non-blocking eventfd counting 1, which the server sends with the job and keeps.
    The child takes it (a read of 8 bytes, which resets the count) as the last step before the code runs;
    if the template dies, the server takes it back if it is still there. Exactly one of them gets it (the
    kernel resets the count under its lock; a read of 0 fails with EAGAIN), so a job the server retries
    never began, and one the server takes back at its end never ran (its setup failed). An eventfd, not a
    pipe holding a byte: one system call to make where a pipe took three (pipe2, write, close of its write
    end), and a lighter object to make and free, on every job's path. Unlike a pipe's read end, an eventfd
    can be written back by whoever holds it: the child closes its copy as it claims, before any of the job's
    code runs (job/setup._read_job; tests/sandbox/test_child_setup checks the job finds it closed)."""
    return os.eventfd(1, os.EFD_CLOEXEC | os.EFD_NONBLOCK)


def claim(fd: int) -> bool:
    """In the child: take the job; False if the server took it back."""
    try:
        return os.read(fd, 8) == CLAIMED
    except BlockingIOError:
        return False


def take_back(fd: int) -> bool:
    """In the server: take the job back; True if no child had claimed it."""
    return claim(fd)


def read_payload(fd: int) -> Payload:
    """Read ``fd`` to its end and close it (in the confined child)."""
    chunks = []
    try:
        # 64 KiB at a time: a read of 1 MiB allocated 1 MiB (an mmap), then shrank it (mremap) and unmapped
        # it, and its final read the same again: five system calls of every job's critical path.
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
    finally:
        os.close(fd)
    return decode_payload(b"".join(chunks))
