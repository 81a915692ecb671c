"""Frames: length-prefixed JSON over a connected unix stream socket, one 4-byte big-endian length each.

Between the pool server and a template, descriptors travel with a frame as ``SCM_RIGHTS`` attached to its 4-byte
header, so they arrive with the first byte of the frame. A job is one :class:`Fork` frame; its descriptors
are the job's own (stdout, stderr, report, payload, claim, metadata, then the host channel and the
session's control channel when it has them), then one per granted path. Every child a template forks has a
serial number: it is announced once (:class:`Started` for a job, :class:`Prepared` for a child confined
ahead of its job) and ends once (:class:`Ended`). A template is trusted code, but a template that broke
(killed, out of memory) can still send a short or oversized frame: every read is bounded and a bad frame is
an ``EOFError`` or ``ValueError``, which makes the server replace the template.

A job's private channels carry the same frames: host-function calls (job <->
pool), session steps (pool -> session child) and the hand-over of a job to a
prepared child (pool -> child). The job end is handed to the
child as a descriptor; the child cannot open a socket of its own to reach
anything. Everything the pool reads from a child is bounded: a header
announcing more than the limit is a protocol violation, not an allocation
(:class:`FrameBuffer`).
"""

from __future__ import annotations

import array
import socket
import struct

import msgspec

from .spec import MAX_GRANTS, Confinement

__all__ = [
    "HEADER", "REPORT_HEAD", "STEP_REPORT", "Adopt", "Discard", "Ended", "Fork", "FrameBuffer", "FrameTooLarge",
    "HandOver", "Init", "NotForked", "Prepare", "Prepared", "Ready", "Reaped", "Spawn", "Spawned", "Started",
    "TemplateFailed", "init_decoder", "pack", "recv_alone", "recv_exact", "recv_frame", "recv_raw", "send_frame",
    "template_decoder",
]

HEADER = struct.Struct("!I")
# On a session's report pipe (wire.descriptors.STEP), kept for its life: display frames (a HEADER, then the frame),
# then this in a HEADER's place, then REPORT_HEAD (the step's serial, the report's length) and the report; then the
# next step's. No display frame is that long. A session's first step writes its report the same way on the same
# pipe (its frames have their own channel, that step only).
STEP_REPORT = 0xFFFFFFFF
REPORT_HEAD = struct.Struct("!II")
MAX_FRAME = 64 << 20  # code and script are bounded by the 1 MiB request line far below this
_MAX_FDS = MAX_GRANTS + 10  # a job's own descriptors (at most nine), then one per grant
_ANCILLARY = socket.CMSG_SPACE(_MAX_FDS * 4)  # room for as many descriptors (C ints), asked once


class Init(msgspec.Struct, tag=True):
    preload: list[str]
    package_dirs: list[str]
    # What the runtime's libraries need in every job (matplotlib's backend and config: server/figures.py):
    # variables in every job's environment, and directories every job may read.
    job_env: dict[str, str] = {}
    data_dirs: list[str] = []
    # The highest Landlock ABI to use (config.landlock_abi_cap); None: the kernel's.
    landlock_abi: int | None = None
    # A zygote: it forks templates (Spawn), never a job's child (see server/session_templates.py).
    zygote: bool = False
    # Children confine in one native call (True), through the Python steps (False), or natively when the
    # extension loads (None): config.native_from_environment.
    native: bool | None = None
    # How many children to keep confined ahead of the next job ([pool] prepared_children; see
    # server/prepared.py): 0, none.
    prepared: int = 1


class Ready(msgspec.Struct, tag=True):
    python: str
    pid: int
    preloaded: list[str]
    landlock_abi: int  # the ABI jobs are confined with: the kernel's, or the operator's cap below it
    read_paths: list[str]
    seccomp_unknown: list[str]
    landlock_abi_kernel: int = 0
    memory_floor: int = 0  # bytes: the least memory limit a job of this template starts under
    native: bool = False  # its children confine in one native call (policy/native.py)


class TemplateFailed(msgspec.Struct, tag=True):
    message: str
    # "kernel": this kernel cannot confine jobs (fail closed); "warmup": preload or self-check failed.
    kind: str = "warmup"


class Fork(msgspec.Struct, tag=True):
    """Server -> template: fork a child for this job (its descriptors attached, then its grants). ``job``
    numbers the server's jobs on this template; a child prepared from this job's grants carries it."""

    job: int
    confinement: Confinement


class Prepare(msgspec.Struct, tag=True):
    """Server -> a session's template before its session exists, with one descriptor per granted path: confine a
    child ahead with this confinement (a session's), as if for job ``job``; its Prepared frame follows. The
    confinement is one a session was given before (one tool, one profile), never anything a job said."""

    job: int
    confinement: Confinement


class Discard(msgspec.Struct, tag=True):
    """Server -> template: the prepared child ``serial`` will get no job; kill it, prepare no other from it."""

    serial: int


class Adopt(msgspec.Struct, tag=True):
    """Server -> a session's template, with a socket of the copy's own: process ``pid``, a session fork's copy
    orphaned to this template (its subreaper), is its child from now on; it is announced (Started) and
    reported ended (Ended) on that socket, and killed when that socket closes."""

    pid: int


class Started(msgspec.Struct, tag=True):
    """Template -> server, with the child's pidfd: the job's child is forked. ``rules``: the generation of the
    template's runtime rules it was forked under (see Prepared)."""

    serial: int
    pid: int
    rules: int = 0


class Prepared(msgspec.Struct, tag=True):
    """Template -> server, with the child's pidfd and the server's end of its control socket: a child was
    forked and is confining itself ahead of its job, with the confinement and grants of job ``job``. ``rules``:
    the generation of the template's runtime rules it holds (how many times the template reopened one whose path
    named another file: policy.RuntimeRules); the server gives up a child prepared under rules no job of its
    was forked under (server/templates.py, Template._rules_seen)."""

    serial: int
    pid: int
    job: int
    rules: int = 0


class Ended(msgspec.Struct, tag=True):
    """Template -> server: child ``serial`` was reaped. ``prepares``: how many children for the latest job's
    confinement and grants are being forked now (their Prepared frames follow)."""

    serial: int
    status: int
    cpu_us: int
    max_rss_kb: int
    prepares: int = 0


class Unprepared(msgspec.Struct, tag=True):
    """Template -> server: ``count`` of the children an Ended frame announced could not be forked (the template's
    pids cgroup full at that moment, say a job's threads, or no memory): no Prepared frame comes for them, and
    the next job is forked for itself if none waits."""

    count: int


class NotForked(msgspec.Struct, tag=True):
    """Template -> server, in place of Started: the job's child could not be forked (``reason``, the fork's error:
    EAGAIN when the template's pids cgroup or the user's RLIMIT_NPROC is full, ENOMEM). Nothing of job ``job`` ran,
    its descriptors are closed, and the template serves on."""

    job: int
    reason: str


class Spawn(msgspec.Struct, tag=True):
    """Server -> zygote, with the server's other end of a new socket: fork a template that serves on it."""


class Spawned(msgspec.Struct, tag=True):
    """Zygote -> server, with the new template's pidfd: it waits for its Init on the socket it was given."""

    pid: int


class Reaped(msgspec.Struct, tag=True):
    """Zygote -> server: the template ``pid`` it forked was reaped, as :class:`Ended` reports a template's child:
    its wait status and usage, which only its parent (the zygote) can read."""

    pid: int
    status: int
    cpu_us: int
    max_rss_kb: int


class HandOver(msgspec.Struct, tag=True):
    """Server -> prepared child, on its control socket: your job's own descriptors are attached."""


_decoder = msgspec.json.Decoder(Init | Ready | TemplateFailed | Started | Prepared | Ended | Unprepared | NotForked
                                 | Spawned | Reaped)
init_decoder = msgspec.json.Decoder(Init)
template_decoder = msgspec.json.Decoder(Fork | Discard | Spawn | Prepare | Adopt)


def send_frame(sock: socket.socket, message: msgspec.Struct, fds: list[int] | tuple[int, ...] = ()) -> None:
    payload = msgspec.json.encode(message)
    header = HEADER.pack(len(payload))
    ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
    sent = sock.sendmsg([header, payload], ancillary)
    if sent < len(header) + len(payload):
        sock.sendall((header + payload)[sent:])


def recv_exact(sock: socket.socket, size: int, *, closed: str = "the other side closed the template socket") -> bytes:
    """Exactly ``size`` bytes; ``EOFError(closed)`` if the other side closes first."""
    chunk = sock.recv(min(size, 1 << 20)) if size else b""
    if len(chunk) == size:  # most often all at once (a frame's payload after its header): nothing to join
        return chunk
    chunks: list[bytes] = []
    while True:
        if not chunk:
            raise EOFError(closed)
        chunks.append(chunk)
        size -= len(chunk)
        if not size:
            return b"".join(chunks)
        chunk = sock.recv(min(size, 1 << 20))


def pack(payload: bytes) -> bytes:
    return HEADER.pack(len(payload)) + payload


class FrameTooLarge(ValueError):
    pass


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


def _received(ancillary: list[tuple[int, int, bytes]]) -> list[int]:
    """The descriptors a ``recvmsg`` received (``SCM_RIGHTS``; a truncated last one dropped)."""
    if not ancillary:  # most frames carry none (a template's Ended): no array made to read nothing
        return []
    fds = array.array("i")
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[: len(data) - (len(data) % fds.itemsize)])
    return list(fds)


def recv_raw(sock: socket.socket, at_once: int = 0) -> tuple[bytes, list[int]]:
    """One frame and the descriptors sent with it. ``at_once``: payload bytes asked for in the same ``recvmsg`` as the
    header, for a socket whose other side sends no second frame before this one is answered (:func:`recv_alone`);
    more than the frame there is a broken protocol (``ValueError``)."""
    try:
        data, ancillary, _flags, _addr = sock.recvmsg(HEADER.size + at_once, _ANCILLARY)
    except ConnectionResetError:
        # The other side closed with our last frame unread (a job answered before it was reaped): an end.
        raise EOFError("the other side closed the template socket") from None
    fds = _received(ancillary)
    if not data:
        raise EOFError("the other side closed the template socket")
    if len(data) < HEADER.size:
        data += recv_exact(sock, HEADER.size - len(data))
    (size,) = HEADER.unpack_from(data)
    if size > MAX_FRAME:
        raise ValueError(f"template frame of {size} bytes exceeds {MAX_FRAME}")
    payload = data[HEADER.size:]
    if len(payload) > size:
        raise ValueError("more than one frame where one was sent")
    if len(payload) < size:
        payload += recv_exact(sock, size - len(payload))
    return payload, fds


def recv_alone(sock: socket.socket, at_once: int = 1 << 16) -> tuple[bytes, list[int]]:
    """:func:`recv_raw` where the other side sends one frame and sends no other until it is answered (a session's
    control channel, one step at a time): header, descriptors and up to ``at_once`` bytes of payload in one
    ``recvmsg``, where recv_raw asks twice."""
    return recv_raw(sock, at_once)


def recv_frame(sock: socket.socket) -> tuple[Init | Ready | TemplateFailed | Started | Prepared | Ended | Unprepared
                                             | NotForked | Spawned,
                                             list[int]]:
    payload, fds = recv_raw(sock)
    return _decoder.decode(payload), fds
