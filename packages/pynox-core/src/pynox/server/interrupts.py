"""A cancel of a session step interrupts it first, as a notebook's interrupt does; it kills only past a grace.

::

    WAITING ──sent──▶ SENT ──interrupt──▶ INTERRUPTED ──grace over──▶ KILLED
       │                │                     │                        │
       │ interrupt      │ over                │ over                   │ over
       ▼                ▼                     ▼                        ▼
    NOT_RUN           OVER                  OVER                     OVER

``WAITING``: the step is the session's, its frame not yet sent to the process.
A cancel now means it never runs (``NOT_RUN``): it is answered as cancelled
before it ran, and the session lives on. ``SENT``: the process has the step.
A cancel sends the interrupt signal (wire/signals.py: not SIGINT, which a
supervisor sends the whole pool) through the child's pidfd (:meth:`ChildLife.signal`):
the job raises ``KeyboardInterrupt`` in the step's code (job/interrupts.py),
and the step ends as an exception ends it, its session alive. ``INTERRUPTED``:
the signal is sent again every :data:`RESEND` seconds, for the process drops
one that comes before the step's code runs (it has the step and is still
placing its descriptors or filing its source: long, under load) and takes one
per step. If the step is not over within the grace (its code caught the
interrupt, or sits in native code), its process is killed, once, through the
pidfd, and the session ends with the step (``KILLED``). ``OVER``: the
session's thread has the step's outcome; nothing here signals the process any
more. (One sent as the step ended waits in the stopped process and comes as it
is continued for its next step, before that step's code runs: dropped.)

The grace never extends a step's deadline: the deadline kill (templates.py)
runs on its own clock. A thread per interrupt resends and kills; the session's
thread ends its life (:meth:`StepInterrupt.over`), under one lock with the
kill, so the session's thread knows for sure whether its process was killed.
Any other move is a bug in the server, refused as a :class:`PoolError`.
"""

from __future__ import annotations

import enum
import threading
import time

from ..errors import PoolError
from ..wire.signals import INTERRUPT_SIGNAL
from .lifecycle import ChildLife

__all__ = ["RESEND", "InterruptState", "StepInterrupt"]

# Seconds between two interrupt signals to a step not over yet. Sent once, an interrupt that came as the process
# took the step was lost (dropped before the code ran), and the step ran on to its kill, its session ended.
RESEND = 0.05


class InterruptState(enum.Enum):
    __hash__ = object.__hash__  # by identity, as lifecycle.ChildState's (a C slot, not a Python call)
    WAITING = "waiting"
    NOT_RUN = "not run"
    SENT = "sent"
    INTERRUPTED = "interrupted"
    KILLED = "killed"
    OVER = "over"


_MOVES: dict[InterruptState, frozenset[InterruptState]] = {
    InterruptState.WAITING: frozenset({InterruptState.SENT, InterruptState.NOT_RUN}),
    InterruptState.NOT_RUN: frozenset(),
    InterruptState.SENT: frozenset({InterruptState.INTERRUPTED, InterruptState.OVER}),
    InterruptState.INTERRUPTED: frozenset({InterruptState.KILLED, InterruptState.OVER}),
    InterruptState.KILLED: frozenset({InterruptState.OVER}),
    InterruptState.OVER: frozenset(),
}


class StepInterrupt:
    """One session step's interrupt: whether it was interrupted, and whether its process was killed for it."""

    def __init__(self, grace: float) -> None:
        self._grace = grace
        # The session's child's life, once the step is sent (see sent): none before, when a cancel only stops it
        # from being sent (a life made for every step, twice with the Step's default, cost the step path).
        self._child: ChildLife | None = None
        self._lock = threading.Lock()
        self._state = InterruptState.WAITING
        self._over = threading.Event()  # the step is over: the resending thread stops
        self.was_interrupted = False  # the interrupt signal was sent while the step ran
        self.killed = False  # its process was killed, the grace over
        self.before_its_process = False  # killed as its process arrived: a first step that had none yet

    @property
    def state(self) -> InterruptState:
        with self._lock:
            return self._state

    def _move(self, state: InterruptState) -> None:
        if state not in _MOVES[self._state]:
            raise PoolError(f"the pool lost track of a step's interrupt ({self._state.value} -> {state.value})")
        self._state = state

    def sent(self, child: ChildLife) -> bool:
        """WAITING -> SENT, the step goes to the process ``child`` is the life of, now; False (NOT_RUN) if a
        cancel came first: it must not be sent."""
        with self._lock:
            if self._state is InterruptState.NOT_RUN:
                return False
            self._move(InterruptState.SENT)
            self._child = child
            return True

    def interrupt(self) -> bool:
        """The client's cancel, from the intake thread: True if the step was stopped (never to run, or
        interrupted now), False if it is over or already interrupted."""
        with self._lock:
            if self._state is InterruptState.WAITING:
                self._move(InterruptState.NOT_RUN)
                return True
            if self._state is not InterruptState.SENT:
                return False
            self._move(InterruptState.INTERRUPTED)
            assert self._child is not None  # set as it moved to SENT
            if self._child.pidfd is None:
                # A first step whose process is on its way cannot be interrupted yet: the cancel is kept by
                # its child's life, which kills the process as it arrives (or never sends the job).
                self._move(InterruptState.KILLED)
                self.killed = self.before_its_process = True
                self._child.cancel()
                return True
            self.was_interrupted = True
            self._child.signal(INTERRUPT_SIGNAL)
            threading.Thread(target=self._resend, args=(time.monotonic() + self._grace,), daemon=True,
                             name="step-interrupt").start()
            return True

    def _resend(self, grace_over: float) -> None:
        """Send the interrupt again until the step is over; past the grace, kill its process."""
        while not self._over.wait(max(min(RESEND, grace_over - time.monotonic()), 0.0)):
            with self._lock:
                if self._state is not InterruptState.INTERRUPTED:
                    return  # the step ended within its grace
                assert self._child is not None  # INTERRUPTED came from SENT
                if time.monotonic() < grace_over:
                    self._child.signal(INTERRUPT_SIGNAL)
                    continue
                self._move(InterruptState.KILLED)
                self.killed = True
                self._child.kill()
                return

    def over(self) -> None:
        """The session's thread has the step's outcome: no signal of this interrupt reaches the process
        from now on. Read :attr:`killed` after it."""
        with self._lock:
            if self._state in (InterruptState.WAITING, InterruptState.NOT_RUN, InterruptState.OVER):
                return  # it never reached the process, or was over already
            self._move(InterruptState.OVER)
        self._over.set()

    @property
    def not_run(self) -> bool:
        with self._lock:
            return self._state is InterruptState.NOT_RUN
