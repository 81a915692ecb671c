"""A session step's interrupt: the pool's signal raises ``KeyboardInterrupt`` in the step's code, as a notebook's does.

The pool sends :data:`~pynox.wire.signals.INTERRUPT_SIGNAL` through the child's
pidfd when a client cancels a running session step (server/interrupts.py). The
child takes it as ``KeyboardInterrupt``
only while the step's code runs (:func:`allow` to :func:`forbid`), at most once
per step: arriving between steps, or while the child writes its report or waits
for the next step, it would end the session's loop itself, so it is dropped
there. The pool sends it again until the step is over (server/interrupts.py):
one that came as the child took its step, before the code ran, is taken once
the code runs; the pool kills the process once its grace is over. Code that catches it
or installs its own handler keeps running, until the pool's kill.

The template ignores the signal (and SIGINT, whose stop is the server's
business: see wire/signals.py), and a blocked mask survives fork and exec: a
session's child installs this handler and unblocks the signal in its setup
(setup.py). A job that is not a session is killed on a cancel, as before: it
keeps the template's ignored signal.
"""

from __future__ import annotations

import _thread
import signal
from types import FrameType

from ..wire.signals import INTERRUPT_SIGNAL

__all__ = ["allow", "forbid", "hold", "release", "take_interrupts"]

_allowed = False
# The thread writing a display frame (job/display.py): an interrupt that comes meanwhile in it waits until the
# frame is whole (pending), so that a frame is never cut short on the pipe it shares with its step's report.
_holder: int | None = None
_pending = False


def _interrupt(signum: int, frame: FrameType | None) -> None:
    global _allowed, _pending
    if _allowed:
        if _holder == _thread.get_ident():  # the handler runs in the main thread: only its own frame holds it
            _pending = True
            return
        _allowed = False  # once: the handling of this one is not interrupted in turn
        raise KeyboardInterrupt


def take_interrupts() -> None:
    signal.signal(INTERRUPT_SIGNAL, _interrupt)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {INTERRUPT_SIGNAL})


def allow() -> None:
    """The step's code runs from now on: an interrupt raises KeyboardInterrupt in it."""
    global _allowed
    _allowed = True


def forbid() -> None:
    global _allowed
    _allowed = False


def hold() -> None:
    """A display frame is being written by this thread (one at a time: under display's lock)."""
    global _holder
    _holder = _thread.get_ident()


def release() -> bool:
    """The frame is whole: True if an interrupt came meanwhile (the caller raises it, once)."""
    global _holder, _pending, _allowed
    _holder = None
    if not _pending:
        return False
    _pending = False
    if not _allowed:
        return False
    _allowed = False
    return True
