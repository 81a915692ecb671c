"""wire.frames.recv_alone: a session's step frame in one recvmsg, where recv_raw asks twice (header, then payload).

Its descriptors, a payload larger than one read takes, the other side's end, and more than one frame where the
protocol sends one (the pool's own bug: the session's process ends rather than take half of the next).
"""

from __future__ import annotations

import array
import os
import socket

import pytest

from pynox.wire.frames import HEADER, recv_alone


def _send(sock: socket.socket, payload: bytes, fds: list[int] | None = None) -> None:
    ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
    sock.sendmsg([HEADER.pack(len(payload)) + payload], ancillary)


def test_a_frame_with_its_descriptors_in_one_read() -> None:
    ours, theirs = socket.socketpair()
    read, write = os.pipe()
    try:
        _send(theirs, b'{"code": "x += 1"}', [read, write])
        payload, fds = recv_alone(ours)
        assert payload == b'{"code": "x += 1"}' and len(fds) == 2
        os.write(fds[1], b"through")
        assert os.read(read, 16) == b"through", "the descriptors received are the ones sent"
        for fd in fds:
            os.close(fd)
    finally:
        for fd in (read, write):
            os.close(fd)
        ours.close()
        theirs.close()


def test_a_frame_larger_than_one_read_is_read_whole() -> None:
    ours, theirs = socket.socketpair()
    payload = bytes(range(256)) * 40  # 10 KiB, beyond at_once
    try:
        _send(theirs, payload)
        assert recv_alone(ours, at_once=1000) == (payload, [])
        _send(theirs, b"")
        assert recv_alone(ours) == (b"", []), "an empty payload is a frame too"
    finally:
        ours.close()
        theirs.close()


def test_the_other_side_closed_is_eof() -> None:
    ours, theirs = socket.socketpair()
    theirs.close()
    with pytest.raises(EOFError):
        recv_alone(ours)
    ours.close()


def test_more_than_one_frame_is_a_broken_protocol() -> None:
    ours, theirs = socket.socketpair()
    try:
        theirs.sendall(HEADER.pack(2) + b"ab" + HEADER.pack(2) + b"cd")
        with pytest.raises(ValueError, match="more than one frame"):
            recv_alone(ours)
    finally:
        ours.close()
        theirs.close()
