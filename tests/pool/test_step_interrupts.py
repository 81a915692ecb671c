"""A session step's interrupt, directly (no pool): its table of moves, the grace, and the kill it may end in."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from pynox.errors import PoolError
from pynox.server.ended import EndedSessions
from pynox.server.interrupts import InterruptState, StepInterrupt
from pynox.server.lifecycle import ChildLife, ChildState
from pynox.wire.signals import INTERRUPT_SIGNAL

pytestmark = pytest.mark.timeout(30)

# Says each interrupt signal on stdout, and ignores it otherwise: only a kill ends it.
_COUNTS = ("import signal, sys, time\n"
           f"signal.signal({int(INTERRUPT_SIGNAL)}, lambda *_: (sys.stdout.write('int\\n'), sys.stdout.flush()))\n"
           "print('ready', flush=True)\n"
           "while True:\n    time.sleep(1)\n")


def _child() -> tuple[subprocess.Popen[str], ChildLife]:
    process = subprocess.Popen([sys.executable, "-c", _COUNTS], stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None and process.stdout.readline() == "ready\n"
    life = ChildLife()
    life.take()
    assert life.sent()
    life.started(os.pidfd_open(process.pid), process.pid)
    assert life.state is ChildState.RUNNING
    return process, life


def _end(process: subprocess.Popen[str], life: ChildLife) -> None:
    if process.poll() is None:
        process.kill()
    process.wait()
    assert process.stdout is not None
    process.stdout.close()
    life.abandon()


@pytest.mark.pure
def test_a_cancel_before_the_step_is_sent_means_it_never_runs() -> None:
    interrupt = StepInterrupt(1.0)
    assert interrupt.interrupt() is True
    assert interrupt.state is InterruptState.NOT_RUN and interrupt.not_run
    assert interrupt.sent(ChildLife()) is False
    interrupt.over()  # nothing reached a process: nothing changes
    assert interrupt.state is InterruptState.NOT_RUN and not interrupt.killed


@pytest.mark.pure
def test_a_step_over_before_any_cancel_is_not_interrupted() -> None:
    interrupt = StepInterrupt(1.0)
    assert interrupt.sent(ChildLife())
    interrupt.over()
    assert interrupt.interrupt() is False
    assert interrupt.state is InterruptState.OVER and not interrupt.was_interrupted


@pytest.mark.pure
def test_moves_outside_the_table_are_refused() -> None:
    interrupt = StepInterrupt(1.0)
    with pytest.raises(PoolError, match="lost track"):
        interrupt._move(InterruptState.KILLED)


def test_an_interrupt_sends_its_signal_and_the_step_ending_within_its_grace_is_not_killed() -> None:
    process, life = _child()
    try:
        interrupt = StepInterrupt(0.3)
        assert interrupt.sent(life)
        assert interrupt.interrupt() is True and interrupt.interrupt() is False  # once
        assert process.stdout is not None and process.stdout.readline() == "int\n"
        interrupt.over()  # the step ended within its grace
        time.sleep(0.6)
        assert process.poll() is None and not interrupt.killed
    finally:
        _end(process, life)


def test_an_interrupt_is_sent_again_until_the_step_is_over_and_never_after() -> None:
    """A process drops an interrupt that comes before its step's code runs (job/interrupts.py): sent once, it was
    lost, and the step ran on to its kill. It is sent again until the step is over; after, never."""
    process, life = _child()
    try:
        interrupt = StepInterrupt(10.0)
        assert interrupt.sent(life) and interrupt.interrupt() is True
        assert process.stdout is not None
        assert [process.stdout.readline() for _ in range(3)] == ["int\n"] * 3
        interrupt.over()
        time.sleep(0.5)  # room for any that would still come: at most the one sent as it ended
        process.kill()
        process.wait()
        assert process.stdout.read().count("int\n") <= 1
        assert not interrupt.killed
    finally:
        _end(process, life)


def test_past_its_grace_the_process_is_killed_once() -> None:
    process, life = _child()
    try:
        interrupt = StepInterrupt(0.3)
        assert interrupt.sent(life)
        started = time.monotonic()
        assert interrupt.interrupt() is True
        assert process.wait(timeout=10) == -signal.SIGKILL
        assert time.monotonic() - started >= 0.3
        assert interrupt.killed and interrupt.state is InterruptState.KILLED
        interrupt.over()
        assert interrupt.state is InterruptState.OVER
    finally:
        _end(process, life)


@pytest.mark.pure
def test_ended_sessions_are_remembered_bounded_and_taken_once() -> None:
    ended = EndedSessions(size=2, keep_for=60)
    ended.remember("a", "step 1 timed out")
    ended.remember("b", "step 2 timed out")
    ended.remember("c", "step 3 timed out")  # "a" goes: the oldest
    assert ended.why("a") is None and ended.why("b") == "step 2 timed out"
    assert ended.take("b") == "step 2 timed out" and ended.take("b") is None
    soon = EndedSessions(keep_for=0.05)
    soon.remember("a", "why")
    time.sleep(0.1)
    assert soon.why("a") is None
