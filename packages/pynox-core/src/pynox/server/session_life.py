"""The life of a server session, as its thread sees it: explicit states, checked moves.

::

    OPENING ──step──▶ RUNNING ──answered──▶ IDLE ──step──▶ RUNNING
       │                 │                   │
       │                 │ ended             │ its child died while idle,
       │                 ▼                   │ or a step could not start
       └──────────────▶ ENDED ◀──────────────┘
       │                 │                   │
       │ close           │ queued steps      │ close (the client's, the idle
       │                 │ refused           │ timer's, or the pool's shutdown)
       └──────────────▶ CLOSED ◀─────────────┘

``OPENING``: the session exists, its process does not yet: its first step
takes a template (the spare one, or one started now) and is cancelled, if a
cancel lands now, before anything runs. ``RUNNING``: a step runs in the
session's process. ``IDLE``: between steps, the process is stopped (it runs
no code of its own). ``ENDED``: the process ended with a step (a timeout, a
crash, ``exit()``, a cancel past its interrupt's grace), or died while it waited, or a step could not
start it (the pool's shutdown, a grant changed, no template); the steps still
queued are refused. ``CLOSED``: the process is stopped, every queued request
answered, the thread is done. Any other move is a bug in the server, refused
as a :class:`PoolError`.

Apart from that life, its *intake* closes once (:meth:`SessionLife.stop_taking`):
from then on no step is queued on it. The client's close, the idle timer and
the pool's shutdown close it and queue a close behind the steps accepted so
far, which still run; a session that ended closes it as it is forgotten. A
session that ended or closed is forgotten by name: the next request under that
name opens a new session, with the grants that request brings (a reopen), and
is told why the pool ended the one before (see ended.py). An interrupted step
(see interrupts.py) is a step like another: RUNNING, then IDLE.

The session's thread moves the states; a cancel (the thread reading requests)
and the idle reaper read them, so moves and reads go through one lock.
"""

from __future__ import annotations

import enum
import threading

from ..errors import PoolError

__all__ = ["SessionLife", "SessionState"]


class SessionState(enum.Enum):
    __hash__ = object.__hash__  # by identity, as lifecycle.ChildState's (a C slot, not a Python call)
    OPENING = "opening"
    RUNNING = "running"
    IDLE = "idle"
    ENDED = "ended"
    CLOSED = "closed"


_MOVES: dict[SessionState, frozenset[SessionState]] = {
    SessionState.OPENING: frozenset({SessionState.RUNNING, SessionState.ENDED, SessionState.CLOSED}),
    SessionState.RUNNING: frozenset({SessionState.IDLE, SessionState.ENDED}),
    SessionState.IDLE: frozenset({SessionState.RUNNING, SessionState.ENDED, SessionState.CLOSED}),
    SessionState.ENDED: frozenset({SessionState.CLOSED}),
    SessionState.CLOSED: frozenset(),
}


class SessionLife:
    """One session's state, and whether its intake is closed."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._lock = threading.Lock()
        self._state = SessionState.OPENING
        self._closing = False

    @property
    def state(self) -> SessionState:
        with self._lock:
            return self._state

    @property
    def closing(self) -> bool:
        """No step is queued on it any more (a close is on its way, or it ended)."""
        with self._lock:
            return self._closing

    def stop_taking(self) -> bool:
        """Close the intake: True if this call closed it (the caller then queues the close), False if it
        was closed already."""
        with self._lock:
            closed_now, self._closing = not self._closing, True
            return closed_now

    def running(self) -> None:
        """OPENING or IDLE -> RUNNING: a step goes to the session's process."""
        self._move(SessionState.RUNNING)

    def step_done(self) -> None:
        """RUNNING -> IDLE: the step's result leaves, the session goes on."""
        self._move(SessionState.IDLE)

    def ended(self) -> None:
        """-> ENDED: the process ended (or was never started); queued steps are refused."""
        self._move(SessionState.ENDED)

    def closed(self) -> None:
        """-> CLOSED: the process is stopped and every queued request answered."""
        self._move(SessionState.CLOSED)

    @property
    def has_process(self) -> bool:
        """A process was started and not yet found ended: the idle reaper may look whether it died."""
        return self.state in (SessionState.RUNNING, SessionState.IDLE)

    def _move(self, state: SessionState) -> None:
        with self._lock:
            if state not in _MOVES[self._state]:
                raise PoolError(f"the pool lost track of session {self.name!r} "
                                f"({self._state.value} -> {state.value})")
            self._state = state
