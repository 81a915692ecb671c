"""The template started ahead for the next new session, as the server sees it: explicit states, checked moves.

::

    DORMANT ──first take──▶ STARTING ──started──▶ READY
                              ▲  │                  │
                              │  │ failed           │
                              │  ▼                  │
                              │ FAILED              │
                              └───────take──────────┘

    every state ──close──▶ CLOSED

``DORMANT``: no session has asked for a template yet, and none is started
ahead: a pool that never has a session starts no spare. The first take starts
the thread that keeps one ready (its caller starts a template of its own
meanwhile). ``STARTING``: that thread is starting one; a take now gets none,
and its caller starts its own. ``READY``: one waits, and the next take gets
it; the thread then starts the next. ``FAILED``: starting one failed; from
then sessions start their own, and the thread only waits for the pool's end
(a template dies with the thread that started it). ``CLOSED``: the pool is
closing; the template waiting is closed, and one the thread finishes starting
now is closed at once. A take in ``STARTING``, ``FAILED`` or ``CLOSED`` moves
nothing. Any other move is a bug in the server, refused as a :class:`PoolError`.

The table keeps the decisions, under one condition shared by the thread of
the session that takes, the thread that starts, and the pool's close;
``sessions._SpareTemplate`` starts, checks and closes the templates.
"""

from __future__ import annotations

import enum
import threading
from typing import Generic, TypeVar

from ..errors import PoolError

__all__ = ["SpareLife", "SpareState"]

Spare = TypeVar("Spare")


class SpareState(enum.Enum):
    DORMANT = "dormant"
    STARTING = "starting"
    READY = "ready"
    FAILED = "failed"
    CLOSED = "closed"


_MOVES: dict[SpareState, frozenset[SpareState]] = {
    SpareState.DORMANT: frozenset({SpareState.STARTING, SpareState.CLOSED}),
    SpareState.STARTING: frozenset({SpareState.READY, SpareState.FAILED, SpareState.CLOSED}),
    SpareState.READY: frozenset({SpareState.STARTING, SpareState.CLOSED}),
    SpareState.FAILED: frozenset({SpareState.CLOSED}),
    SpareState.CLOSED: frozenset(),
}


class SpareLife(Generic[Spare]):
    """The spare's state, and the spare itself while it is ``READY``."""

    def __init__(self) -> None:
        self._state = SpareState.DORMANT
        self._spare: Spare | None = None
        self._changed = threading.Condition()

    @property
    def state(self) -> SpareState:
        with self._changed:
            return self._state

    def _move(self, state: SpareState) -> None:
        if state not in _MOVES[self._state]:
            raise PoolError(f"the pool lost track of its spare template ({self._state.value} -> {state.value})")
        self._state = state
        self._changed.notify_all()

    def take(self) -> tuple[Spare | None, bool]:
        """A session wants a template: the one waiting, if any (READY -> STARTING: the next is started); and
        whether this is the first take (DORMANT -> STARTING), whose caller starts the thread that keeps one
        ready."""
        with self._changed:
            if self._state is SpareState.DORMANT:
                self._move(SpareState.STARTING)
                return None, True
            if self._state is SpareState.READY:
                spare, self._spare = self._spare, None
                self._move(SpareState.STARTING)
                return spare, False
            return None, False

    def wanted(self) -> bool:
        """On the starting thread: wait while one is ready; True once the next is wanted (STARTING), False
        once the pool is closing."""
        with self._changed:
            while self._state is SpareState.READY:
                self._changed.wait()
            return self._state is SpareState.STARTING

    def started(self, spare: Spare) -> bool:
        """STARTING -> READY with ``spare``; False if the pool closed while it started (its starter closes it)."""
        with self._changed:
            if self._state is SpareState.CLOSED:
                return False
            self._move(SpareState.READY)
            self._spare = spare
            return True

    def failed(self) -> None:
        """STARTING -> FAILED: sessions start their own from now (unless the pool is closing anyway)."""
        with self._changed:
            if self._state is not SpareState.CLOSED:
                self._move(SpareState.FAILED)

    def close(self) -> Spare | None:
        """Any state -> CLOSED: the spare that was waiting, if any, for the caller to close."""
        with self._changed:
            spare, self._spare = self._spare, None
            if self._state is not SpareState.CLOSED:
                self._move(SpareState.CLOSED)
            return spare

    def wait_closed(self) -> None:
        """On the starting thread, which must outlive the templates it started (sessions hold them)."""
        with self._changed:
            while self._state is not SpareState.CLOSED:
                self._changed.wait()
