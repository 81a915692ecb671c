"""Pieces of the server's per-job path, directly (no pool), each with its control: the claim (exactly one side
gets it), a hung-up pipe read to its end in one turn (in packet mode too), and the dying look at a handed child's
status."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import time

import pytest

from pynox.server.capture import Capture
from pynox.server.outcome import Gathering
from pynox.server.templates import _dying_by_status
from pynox.server.usage import StatusKept
from pynox.wire.payload import claim, new_claim, take_back

_F_SETPIPE_SZ = 1031


def _claimed_in_child(fd: int) -> bool:
    """Whether another process, handed the claim as a job's child is, takes it."""
    code = f"from pynox.wire.payload import claim; print(claim({fd}))"
    done = subprocess.run([sys.executable, "-c", code], pass_fds=[fd], capture_output=True, text=True, timeout=60,
                          check=True)
    return done.stdout.strip() == "True"


def test_the_claim_goes_to_exactly_one_side() -> None:
    # Control: a claim nobody took is the server's to take back, once.
    fd = new_claim()
    try:
        assert take_back(fd) is True
        assert take_back(fd) is False
        assert _claimed_in_child(fd) is False  # taken back: the child never gets it
    finally:
        os.close(fd)
    fd = new_claim()
    try:
        assert _claimed_in_child(fd) is True
        assert take_back(fd) is False  # the child took it: the job began, the server cannot take it back
        assert claim(fd) is False
    finally:
        os.close(fd)


@pytest.mark.parametrize("size", [0, 10, 65535, 65536, 65537, 200_000])
def test_a_hung_up_pipe_is_read_to_its_end_in_one_turn(size: int) -> None:
    reads: list[int] = []
    try:
        for _ in range(4):
            reads += os.pipe2(os.O_CLOEXEC)
        stdout, writer = reads[0], reads[1]
        fcntl.fcntl(writer, _F_SETPIPE_SZ, 1 << 20)
        data = bytes(i % 251 for i in range(size))
        assert os.write(writer, data) == size
        os.close(writer)
        reads.remove(writer)
        os.set_blocking(stdout, False)
        outcome = Gathering()
        capture = Capture([reads[0], reads[1], reads[3], reads[5]], outcome, 1 << 20)
        assert capture.read(stdout, hung_up=True) is False  # its end, seen in the same turn
        assert bytes(outcome.stdout) == data and outcome.stdout_bytes == size
        assert capture.open == 2
    finally:
        for fd in reads:
            os.close(fd)


def test_a_hung_up_pipe_in_packet_mode_is_read_whole() -> None:
    """A job may put its end of a pipe in packet mode (O_DIRECT): each read then returns one write, so a short
    read is not the pipe's end (the control: three writes, each shorter than a read)."""
    stdout, writer = os.pipe2(os.O_CLOEXEC)
    others = [fd for _ in range(3) for fd in os.pipe2(os.O_CLOEXEC)]
    try:
        fcntl.fcntl(writer, fcntl.F_SETFL, os.O_DIRECT)
        for part in (b"one\n", b"two\n", b"three\n"):
            os.write(writer, part)
        os.close(writer)
        writer = -1
        os.set_blocking(stdout, False)
        assert os.read(stdout, 1 << 16) == b"one\n"  # the control: packets, one a read
        outcome = Gathering()
        capture = Capture([stdout, others[0], others[2], others[4]], outcome, 1 << 20)
        assert capture.read(stdout, hung_up=True) is False
        assert bytes(outcome.stdout) == b"two\nthree\n"
    finally:
        for fd in [stdout, *others, *([writer] if writer >= 0 else [])]:
            os.close(fd)


def test_a_pipe_still_written_is_not_taken_for_ended() -> None:
    """The control: without a hang-up, a short read is not an end (the writer may write on)."""
    stdout, writer = os.pipe2(os.O_CLOEXEC)
    others = [fd for _ in range(3) for fd in os.pipe2(os.O_CLOEXEC)]
    try:
        os.set_blocking(stdout, False)
        os.write(writer, b"1\n")
        outcome = Gathering()
        capture = Capture([stdout, others[0], others[2], others[4]], outcome, 1 << 20)
        assert capture.read(stdout) is True
        os.write(writer, b"2\n")
        assert capture.read(stdout) is True
        assert bytes(outcome.stdout) == b"1\n2\n" and capture.open == 3
    finally:
        for fd in [stdout, writer, *others]:
            os.close(fd)


def test_a_killed_child_reads_dying_and_a_live_one_does_not() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    kept = StatusKept()
    try:
        assert _dying_by_status(kept.text(child.pid)) is False  # the control: alive, its memory its own
        os.kill(child.pid, signal.SIGKILL)
        end = time.monotonic() + 30
        while not _dying_by_status(kept.text(child.pid)):  # the same descriptor, read again
            assert time.monotonic() < end, "a killed child never read as dying"
            time.sleep(0.001)
        child.wait(timeout=30)
        assert kept.text(child.pid) is None and _dying_by_status(None)  # reaped: gone
    finally:
        kept.close()
        if child.poll() is None:
            child.kill()
            child.wait()
