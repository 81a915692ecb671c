"""The steward's phases, directly (no pool, no job): its table of moves, each refusal, and that it closes all it holds.

A listener here is the read end of a pipe, sent over a socket pair as a child sends its seccomp listener:
the phases only move it, poll it and close it.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator

import pytest

from pynox.errors import PoolWorkerError
from pynox.server.steward import StewardLife, StewardPhase

pytestmark = pytest.mark.pure

_P = StewardPhase


class _Job:
    """The child's side: the socket it sends its listener on, the pipe that stands for it, a write grant."""

    def __init__(self) -> None:
        self.pool_end, self.child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener, self.hang_up = os.pipe()
        self.grant = os.open("/", os.O_PATH | os.O_CLOEXEC)
        self.life = StewardLife(self.pool_end, [self.grant], os.getuid(), os.getgid())

    def send_listener(self) -> None:
        socket.send_fds(self.child_end, [b"L"], [self.listener])
        os.close(self.listener)  # the pool holds its own copy now
        self.child_end.close()

    def close(self) -> None:
        self.life.close()
        self.child_end.close()
        if _is_open(self.hang_up):
            os.close(self.hang_up)


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


@pytest.fixture
def job() -> Iterator[_Job]:
    job = _Job()
    yield job
    job.close()


def _to(job: _Job, phase: StewardPhase) -> None:
    if phase is _P.UNSENT:
        job.child_end.close()  # the child failed before it sent its listener
        job.life.take_listener()
    if phase in (_P.ARRIVED, _P.SERVING, _P.GONE):
        job.send_listener()
        job.life.take_listener()
    if phase in (_P.SERVING, _P.GONE):
        job.life.serve()
    if phase is _P.GONE:
        os.close(job.hang_up)  # the job's tasks are gone
        assert job.life.answer() is False
    if phase is _P.CLOSED:
        job.life.close()
    assert job.life.phase is phase


def test_awaiting_arrived_serving_gone_closed(job: _Job) -> None:
    assert job.life.phase is _P.AWAITING and job.life.sock is not None
    job.send_listener()
    job.life.take_listener()
    assert job.life.phase is _P.ARRIVED and job.life.sock is None
    steward = job.life.serve()
    assert job.life.phase is _P.SERVING
    assert job.life.answer() is True  # no call pending, the job is still there
    assert job.life.phase is _P.SERVING
    os.close(job.hang_up)
    assert job.life.answer() is False
    assert job.life.phase is _P.GONE
    job.life.close()
    assert job.life.phase is _P.CLOSED
    assert not _is_open(steward.listener) and not _is_open(job.grant)  # nothing of the job's is held
    job.life.close()  # closing twice is one close
    assert job.life.phase is _P.CLOSED


def test_no_listener_when_the_child_fails_before_it_sends_one(job: _Job) -> None:
    _to(job, _P.UNSENT)
    job.life.close()
    assert job.life.phase is _P.CLOSED and not _is_open(job.grant)


@pytest.mark.parametrize("phase", [_P.AWAITING, _P.ARRIVED, _P.UNSENT, _P.SERVING, _P.GONE])
def test_every_phase_closes_everything_it_holds(job: _Job, phase: StewardPhase) -> None:
    _to(job, phase)
    sock = job.pool_end
    job.life.close()
    assert job.life.phase is _P.CLOSED
    assert sock.fileno() == -1 and not _is_open(job.grant)


# What each call needs, and in which phases it is a move of the table.
_CALLS = {"take_listener": {_P.AWAITING}, "serve": {_P.ARRIVED}, "answer": {_P.SERVING}}


@pytest.mark.parametrize(("phase", "call"), [(phase, call) for call, legal in _CALLS.items()
                                              for phase in StewardPhase if phase not in legal])
def test_a_move_off_the_table_is_refused(job: _Job, phase: StewardPhase, call: str) -> None:
    _to(job, phase)
    with pytest.raises(PoolWorkerError, match=f"lost track of its job's delegated calls \\({phase.value} -> "):
        getattr(job.life, call)()
    assert job.life.phase is phase  # a refused move changes nothing
