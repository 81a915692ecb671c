"""The prepared children's table of moves, directly: which child takes a job, which are given up, whose end is
passed over, and what the server refuses as a template's error."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator

import pytest

from pynox.errors import PoolWorkerError
from pynox.server.prepared import KEYS_KEPT, Key, PreparedChildren, PreparedState

pytestmark = pytest.mark.pure

A: Key = (b"confinement a", ((1, 2),))
B: Key = (b"confinement b", ((1, 3),))


@pytest.fixture
def peers() -> Iterator[list[socket.socket]]:
    """Both ends of the control sockets handed to the table, the child's first: EOF on the child's end means
    its child would exit. The server's end of a child handed a job is the job's, not the table's, to close."""
    ends: list[socket.socket] = []
    yield ends
    for end in ends:
        end.close()


def _arrive(children: PreparedChildren, serial: int, job: int, peers: list[socket.socket]) -> list[int]:
    ours, theirs = socket.socketpair()
    peers += [theirs, ours]
    pidfd = os.open("/dev/null", os.O_RDONLY)  # stands in for the pidfd: the table only closes it
    return [child.serial for child in children.arrived(serial, job, 1000 + serial, pidfd, ours)]


def _closed(sock: socket.socket) -> bool:
    return sock.fileno() == -1


def test_a_child_prepared_from_a_job_takes_the_next_job_of_the_same_key(peers: list[socket.socket]) -> None:
    children = PreparedChildren()
    job = children.job(A)
    children.announced(1)
    assert children.due == 1
    assert _arrive(children, serial=7, job=job, peers=peers) == []
    assert children.due == 0
    child, discard = children.take(A)
    assert child is not None and child.serial == 7 and discard == []
    assert child.state is PreparedState.HANDED and children.waiting == []
    assert not _closed(child.control)  # it is the job's child now: the server keeps its control socket
    assert children.take(A) == (None, [])  # one child, one job


def test_a_job_of_another_key_gives_the_waiting_child_up(peers: list[socket.socket]) -> None:
    children = PreparedChildren()
    _arrive(children, serial=7, job=children.job(A), peers=peers)
    child, (discard,) = children.take(B)
    assert child is None and discard.serial == 7
    # Its control socket stays open until its end: EOF would end it before its template kills it for the
    # Discard, and the template would take it for one that ended after a job and prepare another.
    assert discard.state is PreparedState.RELEASED and not _closed(discard.control)
    assert children.ended(7) is True  # its end is expected, and passed over
    assert discard.state is PreparedState.GONE and _closed(discard.control)
    assert children.ended(7) is False  # once


def test_a_newer_child_replaces_the_waiting_one_beyond_the_limit(peers: list[socket.socket]) -> None:
    children = PreparedChildren(limit=1)
    first, second = children.job(A), children.job(A)
    _arrive(children, serial=7, job=first, peers=peers)
    assert _arrive(children, serial=8, job=second, peers=peers) == [7]
    child, _ = children.take(A)
    assert child is not None and child.serial == 8


def test_a_child_whose_job_was_forgotten_waits_for_none(peers: list[socket.socket]) -> None:
    children = PreparedChildren()
    old = children.job(A)
    for _ in range(KEYS_KEPT):
        children.job(A)
    assert _arrive(children, serial=7, job=old, peers=peers) == [7]
    assert children.waiting == [] and children.take(A) == (None, [])
    unkeyed = children.job(None)  # a job whose working directory was gone: nothing is prepared for it
    assert _arrive(children, serial=9, job=unkeyed, peers=peers) == [9]


def test_a_child_that_died_while_it_waited_is_forgotten(peers: list[socket.socket]) -> None:
    children = PreparedChildren()
    _arrive(children, serial=7, job=children.job(A), peers=peers)
    (waiting,) = children.waiting
    assert children.ended(7) is True
    assert children.waiting == [] and waiting.state is PreparedState.GONE and _closed(waiting.control)
    assert children.take(A) == (None, [])


def test_a_child_handed_a_job_it_could_not_take_is_given_up(peers: list[socket.socket]) -> None:
    children = PreparedChildren()
    _arrive(children, serial=7, job=children.job(A), peers=peers)
    child, _ = children.take(A)
    assert child is not None
    children.release(child)  # dying, or the hand-over failed: the job goes to a fork instead
    assert child.state is PreparedState.RELEASED and not _closed(child.control)
    assert children.ended(7) is True and _closed(child.control)


def test_an_end_of_a_child_nobody_knows_is_not_passed_over(peers: list[socket.socket]) -> None:
    children = PreparedChildren()
    assert children.ended(3) is False  # the template's error: the caller refuses the frame
    _arrive(children, serial=7, job=children.job(A), peers=peers)
    child, _ = children.take(A)
    assert child is not None
    assert children.ended(7) is False  # handed a job: its end is the job's child's, not the table's


def test_moves_off_the_table_are_refused(peers: list[socket.socket]) -> None:
    children = PreparedChildren()
    _arrive(children, serial=7, job=children.job(A), peers=peers)
    (waiting,) = children.waiting
    children.ended(7)
    with pytest.raises(PoolWorkerError, match="gone -> released"):
        children.release(waiting)  # a child already reaped cannot be given up
    with pytest.raises(PoolWorkerError, match="gone -> handed"):
        waiting.move(PreparedState.HANDED)


def test_closing_ends_the_waiting_child(peers: list[socket.socket]) -> None:
    children = PreparedChildren(limit=2)
    job = children.job(A)
    _arrive(children, serial=7, job=job, peers=peers)
    _arrive(children, serial=8, job=job, peers=peers)
    children.release(children.waiting[1])  # given up, its end not reported yet (a template gone meanwhile)
    children.close()
    # EOF on each control socket: a waiting child exits on it, and so does one given up whose template is gone.
    assert peers[0].recv(1) == b"" and peers[2].recv(1) == b""
    assert children.waiting == [] and not children.released


# -- K children waiting at once ([pool] prepared_children) ------------------------------------------------------


def test_k_children_of_one_key_each_take_one_job(peers: list[socket.socket]) -> None:
    children = PreparedChildren(limit=3)
    job = children.job(A)
    children.announced(3)
    for serial in (7, 8, 9):
        assert _arrive(children, serial=serial, job=job, peers=peers) == []
    assert children.due == 0 and [child.serial for child in children.waiting] == [7, 8, 9]
    taken = []
    for _ in range(3):
        child, discard = children.take(A)
        assert child is not None and discard == [] and child.state is PreparedState.HANDED
        taken.append(child.serial)
    assert sorted(taken) == [7, 8, 9]  # each child one job, none twice
    assert children.take(A) == (None, [])  # the fourth is forked


def test_a_job_of_another_key_gives_every_waiting_child_up(peers: list[socket.socket]) -> None:
    children = PreparedChildren(limit=2)
    job = children.job(A)
    _arrive(children, serial=7, job=job, peers=peers)
    _arrive(children, serial=8, job=job, peers=peers)
    child, discard = children.take(B)
    assert child is None and sorted(given_up.serial for given_up in discard) == [7, 8]
    assert all(given_up.state is PreparedState.RELEASED and not _closed(given_up.control) for given_up in discard)
    assert children.waiting == []
    assert children.ended(8) is True and children.ended(7) is True  # both ends passed over, once each
    assert all(_closed(given_up.control) for given_up in discard)
    assert children.ended(7) is False


def test_a_match_is_taken_and_those_of_another_key_are_given_up(peers: list[socket.socket]) -> None:
    children = PreparedChildren(limit=2)
    old, new = children.job(A), children.job(B)
    _arrive(children, serial=7, job=old, peers=peers)
    # One of the latest job's key arrives: the older job's child is given up at once, the template
    # prepares for the latest only.
    assert _arrive(children, serial=8, job=new, peers=peers) == [7]
    assert _arrive(children, serial=9, job=new, peers=peers) == []
    child, discard = children.take(B)
    assert child is not None and child.serial == 8 and discard == []
    assert [other.serial for other in children.waiting] == [9]  # waits on for the next job of B


def test_no_more_than_the_limit_wait(peers: list[socket.socket]) -> None:
    children = PreparedChildren(limit=2)
    job = children.job(A)
    _arrive(children, serial=7, job=job, peers=peers)
    _arrive(children, serial=8, job=job, peers=peers)
    assert _arrive(children, serial=9, job=job, peers=peers) == [7]  # the oldest goes
    assert [other.serial for other in children.waiting] == [8, 9]
    none = PreparedChildren(limit=0)  # prepared_children = 0: a frame the template should not have sent
    assert _arrive(none, serial=3, job=none.job(A), peers=peers) == [3]
    assert none.waiting == []


def test_one_of_k_dying_while_it_waits_leaves_the_others_waiting(peers: list[socket.socket]) -> None:
    children = PreparedChildren(limit=2)
    job = children.job(A)
    children.announced(2)
    _arrive(children, serial=7, job=job, peers=peers)
    _arrive(children, serial=8, job=job, peers=peers)
    first, second = children.waiting
    assert children.ended(7) is True  # killed from outside while it waited
    assert first.state is PreparedState.GONE and _closed(first.control)
    assert children.waiting == [second] and not _closed(second.control)
    # The template replaces it (its end was not a given-up child's): the replacement waits beside the other.
    children.announced(1)
    assert _arrive(children, serial=9, job=job, peers=peers) == []
    child, _ = children.take(A)
    assert child is not None and child.serial == 8


def test_one_found_dying_when_its_job_came_is_released_and_the_next_takes_the_job(
        peers: list[socket.socket]) -> None:
    children = PreparedChildren(limit=2)
    job = children.job(A)
    _arrive(children, serial=7, job=job, peers=peers)
    _arrive(children, serial=8, job=job, peers=peers)
    dying, _ = children.take(A)
    assert dying is not None and dying.serial == 7
    children.release(dying)  # what Template does when /proc says it is dying
    child, discard = children.take(A)
    assert child is not None and child.serial == 8 and discard == []
    assert children.ended(7) is True  # its end is passed over
    assert children.ended(8) is False  # the job's child: its end is the job's


def test_due_counts_every_announced_child(peers: list[socket.socket]) -> None:
    children = PreparedChildren(limit=2)
    job = children.job(A)
    children.announced(2)
    _arrive(children, serial=7, job=job, peers=peers)
    assert children.due == 1  # the second comes in the time of another fork
    _arrive(children, serial=8, job=job, peers=peers)
    assert children.due == 0


def test_closing_ends_every_waiting_child(peers: list[socket.socket]) -> None:
    children = PreparedChildren(limit=2)
    job = children.job(A)
    _arrive(children, serial=7, job=job, peers=peers)
    _arrive(children, serial=8, job=job, peers=peers)
    children.close()
    assert peers[0].recv(1) == b"" and peers[2].recv(1) == b""  # each child's end reads EOF
    assert children.waiting == []
