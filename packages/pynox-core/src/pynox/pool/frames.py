"""Frames between the pool server and a template: length-prefixed JSON over a unix stream socket.

Descriptors travel with a frame as ``SCM_RIGHTS`` attached to its 4-byte
header, so they arrive with the first byte of the frame. A job is one
:class:`~pynox.job.Confinement` frame; its descriptors are the job's own
(stdout, stderr, report, payload, claim, then the host channel and the
session's control channel when it has them), then one per granted path. A template is trusted
code, but a template that broke (killed, out of memory) can still send a short
or oversized frame: every read is bounded and a bad frame is an ``EOFError``
or ``ValueError``, which makes the server replace the template.
"""

from __future__ import annotations

import array
import socket
import struct

import msgspec

from ..job import MAX_GRANTS, Confinement

__all__ = [
    "Ended", "Init", "Ready", "Started", "TemplateFailed",
    "confinement_decoder", "init_decoder", "recv_frame", "recv_raw", "send_frame",
]

_HEADER = struct.Struct("!I")
MAX_FRAME = 64 << 20  # code and script are bounded by the 1 MiB request line far below this
_MAX_FDS = MAX_GRANTS + 8  # a job's own descriptors, then one per grant


class Init(msgspec.Struct, tag=True):
    preload: list[str]
    package_dirs: list[str]


class Ready(msgspec.Struct, tag=True):
    python: str
    pid: int
    preloaded: list[str]
    landlock_abi: int
    read_paths: list[str]
    seccomp_unknown: list[str]


class TemplateFailed(msgspec.Struct, tag=True):
    message: str
    # "kernel": this kernel cannot confine jobs (fail closed); "warmup": preload or self-check failed.
    kind: str = "warmup"


class Started(msgspec.Struct, tag=True):
    pid: int


class Ended(msgspec.Struct, tag=True):
    status: int
    cpu_us: int
    max_rss_kb: int


_decoder = msgspec.json.Decoder(Init | Ready | TemplateFailed | Started | Ended)
init_decoder = msgspec.json.Decoder(Init)
confinement_decoder = msgspec.json.Decoder(Confinement)


def send_frame(sock: socket.socket, message: msgspec.Struct, fds: list[int] | tuple[int, ...] = ()) -> None:
    payload = msgspec.json.encode(message)
    header = _HEADER.pack(len(payload))
    ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
    sent = sock.sendmsg([header, payload], ancillary)
    if sent < len(header) + len(payload):
        sock.sendall((header + payload)[sent:])


def _recv_exact(sock: socket.socket, size: int) -> bytes:
    chunks: list[bytes] = []
    while size:
        chunk = sock.recv(min(size, 1 << 20))
        if not chunk:
            raise EOFError("the other side closed the template socket")
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def recv_raw(sock: socket.socket) -> tuple[bytes, list[int]]:
    fds = array.array("i")
    try:
        header, ancillary, _flags, _addr = sock.recvmsg(_HEADER.size, socket.CMSG_SPACE(_MAX_FDS * fds.itemsize))
    except ConnectionResetError:
        # The other side closed with our last frame unread (a job answered before it was reaped): an end.
        raise EOFError("the other side closed the template socket") from None
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[: len(data) - (len(data) % fds.itemsize)])
    if not header:
        raise EOFError("the other side closed the template socket")
    if len(header) < _HEADER.size:
        header += _recv_exact(sock, _HEADER.size - len(header))
    (size,) = _HEADER.unpack(header)
    if size > MAX_FRAME:
        raise ValueError(f"template frame of {size} bytes exceeds {MAX_FRAME}")
    return _recv_exact(sock, size), list(fds)


def recv_frame(sock: socket.socket) -> tuple[Init | Ready | TemplateFailed | Started | Ended, list[int]]:
    payload, fds = recv_raw(sock)
    return _decoder.decode(payload), fds
