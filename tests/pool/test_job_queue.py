"""The workers' job queue, directly: a worker that also reads its template's socket is woken by a job at once,
by its socket when that is readable first, and never misses a job queued around the moment it starts to listen."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from pynox.server.serve import _Jobs


@pytest.fixture
def bell() -> Iterator[int]:
    fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
    yield fd
    os.close(fd)


@pytest.fixture
def socket_end() -> Iterator[tuple[int, int]]:
    """A pipe standing for a template's socket: (read end, write end)."""
    read, write = os.pipe2(os.O_CLOEXEC)
    yield read, write
    os.close(read)
    os.close(write)


def _waiting(jobs: _Jobs, bell: int, fd: int, timeout: float) -> tuple[threading.Thread, dict[str, Any]]:
    seen: dict[str, Any] = {}

    def wait() -> None:
        began = time.monotonic()
        seen["answer"] = jobs.get_or_readable(bell, fd, timeout)
        seen["took"] = time.monotonic() - began

    thread = threading.Thread(target=wait)
    thread.start()
    deadline = time.monotonic() + 5
    while not jobs._listening and time.monotonic() < deadline:  # listening: only a put's bell wakes it now
        time.sleep(0.001)
    assert jobs._listening == [bell]
    return thread, seen


def test_a_job_queued_while_a_worker_listens_wakes_it_at_once(bell: int, socket_end: tuple[int, int]) -> None:
    jobs = _Jobs()
    thread, seen = _waiting(jobs, bell, socket_end[0], timeout=30)
    job: Any = object()
    jobs.put(job)
    thread.join(5)
    assert not thread.is_alive()
    assert seen["answer"] == (True, job)
    assert seen["took"] < 5  # the bell, not the 30 s timeout
    assert jobs._listening == []
    with pytest.raises(BlockingIOError):  # silent for its next wait
        os.eventfd_read(bell)


def test_a_readable_socket_wakes_the_worker_without_a_job(bell: int, socket_end: tuple[int, int]) -> None:
    jobs = _Jobs()
    thread, seen = _waiting(jobs, bell, socket_end[0], timeout=30)
    os.write(socket_end[1], b"x")  # a Prepared frame arrived
    thread.join(5)
    assert not thread.is_alive()
    assert seen["answer"] == (False, None)
    assert jobs._listening == []
    jobs.put(None)  # nobody listens: the queue keeps it, and no bell rings
    with pytest.raises(BlockingIOError):
        os.eventfd_read(bell)
    assert jobs.get() is None


def test_a_job_queued_before_the_worker_listens_is_taken_without_waiting(bell: int,
                                                                         socket_end: tuple[int, int]) -> None:
    jobs = _Jobs()
    job: Any = object()
    jobs.put(job)
    began = time.monotonic()
    assert jobs.get_or_readable(bell, socket_end[0], 30) == (True, job)
    assert time.monotonic() - began < 5


def test_nothing_within_the_timeout(bell: int, socket_end: tuple[int, int]) -> None:
    jobs = _Jobs()
    assert jobs.get_or_readable(bell, socket_end[0], 0.01) == (False, None)
    assert jobs._listening == []


def test_each_job_rings_one_listening_worker(socket_end: tuple[int, int]) -> None:
    """Two workers listen, two jobs come: each is woken and each takes one."""
    jobs = _Jobs()
    bells = [os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC) for _ in range(2)]
    try:
        answers: list[tuple[bool, object]] = []
        threads = [threading.Thread(target=lambda b=b: answers.append(jobs.get_or_readable(b, socket_end[0], 30)))
                   for b in bells]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 5
        while len(jobs._listening) < 2 and time.monotonic() < deadline:
            time.sleep(0.001)
        first: Any = object()
        second: Any = object()
        jobs.put(first)
        jobs.put(second)
        for thread in threads:
            thread.join(5)
            assert not thread.is_alive()
        assert sorted(answers, key=lambda answer: answer[1] is second) == [(True, first), (True, second)]
    finally:
        for fd in bells:
            os.close(fd)
