"""A session step's interrupt: the pool's signal raises ``KeyboardInterrupt`` in the step's code, as a notebook's does.

The pool sends :data:`~pynox.wire.signals.INTERRUPT_SIGNAL` through the child's
pidfd when a client cancels a running session step (server/interrupts.py). The
child takes it as ``KeyboardInterrupt``
only while the step's code runs (:func:`allow` to :func:`forbid`), at most once
per step: arriving between steps, or while the child writes its report or waits
for the next step, it would end the session's loop itself, so it is dropped
there (the pool kills the process once its grace is over). Code that catches it
or installs its own handler keeps running, until the pool's kill.

The template ignores the signal (and SIGINT, whose stop is the server's
business: see wire/signals.py), and a blocked mask survives fork and exec: a
session's child installs this handler and unblocks the signal in its setup
(setup.py). A job that is not a session is killed on a cancel, as before: it
keeps the template's ignored signal.
"""

from __future__ import annotations

import signal
from types import FrameType

from ..wire.signals import INTERRUPT_SIGNAL

__all__ = ["allow", "forbid", "take_interrupts"]

_allowed = False


def _interrupt(signum: int, frame: FrameType | None) -> None:
    global _allowed
    if _allowed:
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
