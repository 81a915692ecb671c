"""How a pool ends: one state machine for EOF, stop signals, the drain deadline and escalation.

::

    SERVING ──EOF──▶ FINISHING ──signal──▶ DRAINING ──signal / deadline──▶ STOPPING
       └──────────────signal────────────────▲

- **FINISHING**: the client closed our stdin. Every accepted job runs to its end, under its own deadline:
  the client asked for this and still reads the results.
- **DRAINING**: a stop signal (SIGTERM or SIGINT, however it was delivered). New requests are refused as
  shutting down; every accepted job runs to its end, until the drain deadline.
- **STOPPING**: the deadline passed or a second signal came. Running jobs are killed (``CancelledError``),
  queued ones are refused as shutting down; each still gets its one answer.

The moves are a table, each checked; the actions of a move (arm the deadline, escalate) are the server's,
called once per entry into a state, outside the lock.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Callable

from ..units import format_duration

__all__ = ["Shutdown", "Stage"]


class Stage(enum.Enum):
    SERVING = "serving"
    FINISHING = "finishing"
    DRAINING = "draining"
    STOPPING = "stopping"


class _Event(enum.Enum):
    EOF = "eof"
    SIGNAL = "signal"
    DEADLINE = "deadline"


_MOVES: dict[tuple[Stage, _Event], Stage] = {
    (Stage.SERVING, _Event.EOF): Stage.FINISHING,
    (Stage.SERVING, _Event.SIGNAL): Stage.DRAINING,
    (Stage.FINISHING, _Event.SIGNAL): Stage.DRAINING,
    (Stage.FINISHING, _Event.EOF): Stage.FINISHING,
    (Stage.DRAINING, _Event.EOF): Stage.DRAINING,
    (Stage.DRAINING, _Event.SIGNAL): Stage.STOPPING,
    (Stage.DRAINING, _Event.DEADLINE): Stage.STOPPING,
    (Stage.STOPPING, _Event.EOF): Stage.STOPPING,
    (Stage.STOPPING, _Event.SIGNAL): Stage.STOPPING,
    (Stage.STOPPING, _Event.DEADLINE): Stage.STOPPING,
}


class Shutdown:
    """The pool's stage, moved by :meth:`input_ended`, :meth:`signalled` and the drain deadline.

    ``on_drain`` runs once, on the first move out of SERVING (the server stops its workers after the jobs
    accepted so far); ``on_stop(reason)`` runs once, on entering STOPPING."""

    def __init__(self, drain_timeout: float, *, on_drain: Callable[[], None],
                 on_stop: Callable[[str], None]) -> None:
        self.drain_timeout = drain_timeout
        self._on_drain, self._on_stop = on_drain, on_stop
        self._lock = threading.Lock()
        self._stage = Stage.SERVING
        self._signal = ""  # the name of the first stop signal
        self._timer: threading.Timer | None = None

    @property
    def stage(self) -> Stage:
        return self._stage

    def refusing(self) -> bool:
        """New requests are refused: a stop signal came."""
        return self._stage in (Stage.DRAINING, Stage.STOPPING)

    def why(self) -> str:
        """Why a request is refused, in a sentence a client can show."""
        return f"the pool is shutting down ({self._signal}); this request was not run"

    def input_ended(self) -> None:
        self._move(_Event.EOF)

    def signalled(self, name: str) -> None:
        self._move(_Event.SIGNAL, name)

    def _deadline(self) -> None:
        self._move(_Event.DEADLINE)

    def _move(self, event: _Event, name: str = "") -> None:
        with self._lock:
            before = self._stage
            after = self._stage = _MOVES[before, event]
            if event is _Event.SIGNAL and not self._signal:
                self._signal = name
            if after is Stage.DRAINING and before is not Stage.DRAINING:
                self._timer = threading.Timer(self.drain_timeout, self._deadline)
                self._timer.daemon = True
                self._timer.name = "pynox-drain-deadline"
                self._timer.start()
        if before is Stage.SERVING:
            self._on_drain()
        if after is Stage.STOPPING and before is not Stage.STOPPING:
            if event is _Event.DEADLINE:
                reason = (f"the pool was shutting down ({self._signal}) and its drain deadline of "
                          f"{format_duration(self.drain_timeout)} passed")
            else:
                reason = f"the pool was shutting down ({self._signal}) and a second {name} stopped the drain"
            self._on_stop(reason)

    def cancel_deadline(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
