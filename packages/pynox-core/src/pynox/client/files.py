"""Files in and out of a session's scratch directory, as the client sees them: ``FileInfo`` and the transfers.

A session made with ``scratch=True`` works in a directory the pool owns (see docs/sandbox-contract.md).
:class:`pynox.Session` puts files there and takes them out with the protocol's ``upload``, ``download``
and ``files`` requests; a file larger than one protocol line travels in pieces of ``FILE_CHUNK`` bytes,
each at its offset. A plain run with ``scratch=True`` gets its files back with its result
(:attr:`pynox.Result.files`).
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import PoolError, RequestError
from ..protocol import (
    FILE_CHUNK,
    Answer,
    Download,
    Downloaded,
    FilesListed,
    Request,
    ScratchFile,
    SessionResult,
    Upload,
    Uploaded,
)

__all__ = ["FileInfo", "download", "listing", "upload"]


@dataclass(frozen=True)
class FileInfo:
    """A regular file of a scratch directory: its path there, size in bytes, mtime (seconds since the epoch)
    and MIME type guessed from its name. ``data``: its content, in a plain run's :attr:`Result.files` (None
    there for a file left out because the files together were over the run's max_output)."""

    path: str
    size: int
    mtime: float
    mime: str
    data: bytes | None = None

    @classmethod
    def from_wire(cls, wire: ScratchFile) -> FileInfo:
        data = base64.b64decode(wire.data) if isinstance(wire.data, str) else None
        return cls(path=wire.path, size=wire.size, mtime=wire.mtime, mime=wire.mime, data=data)


# Sends one file request of the session and returns the pool's answer (a refusal raises RequestError).
Send = Callable[[Request], Answer]


def answered(reply: Answer, kind: type[Any]) -> Any:
    """The pool's answer as ``kind``; RequestError with the pool's words for a refusal."""
    if isinstance(reply, kind):
        return reply
    if isinstance(reply, SessionResult) and reply.refused:
        raise RequestError(reply.error.message if reply.error else "the pool refused the request")
    raise PoolError(f"the pool answered a file request with {type(reply).__name__}")


def upload(send: Send, path: str, data: bytes) -> FileInfo:
    """Put ``data`` at ``path`` in the scratch directory, in pieces that each fit one protocol line."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise TypeError(f"upload takes bytes, got {type(data).__name__}")
    view = memoryview(data).cast("B")
    offset = 0
    while True:
        piece = bytes(view[offset:offset + FILE_CHUNK])
        reply = answered(send(Request(upload=Upload(path=path, data=base64.b64encode(piece).decode(),
                                                    offset=offset))), Uploaded)
        offset += len(piece)
        if offset >= len(view):
            return FileInfo.from_wire(reply.uploaded)


def download(send: Send, path: str) -> bytes:
    """The content of ``path`` in the scratch directory, piece by piece."""
    pieces: list[bytes] = []
    offset, first = 0, None
    while True:
        chunk = answered(send(Request(download=Download(path=path, offset=offset))), Downloaded).downloaded
        if first is None:
            first = (chunk.size, chunk.mtime)
        elif (chunk.size, chunk.mtime) != first:
            raise RequestError(f"download: {path} changed while it was downloaded; download it again")
        data = base64.b64decode(chunk.data)
        pieces.append(data)
        offset += len(data)
        if chunk.eof or not data:
            return b"".join(pieces)


def listing(send: Send) -> list[FileInfo]:
    """Every regular file of the scratch directory."""
    reply = answered(send(Request(files=True)), FilesListed)
    return [FileInfo.from_wire(found) for found in reply.files]
