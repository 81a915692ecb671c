"""Accepted requests on their way to their one result, by id: what ``{"cancel": ID}`` finds and ends.

::

    QUEUED ──start──▶ RUNNING ──kill──▶ KILLED
      │                  │    ▲           │
      │                  │    └─stop──┐   │
      │                  │ interrupt  │   │
      │                  ├──────▶ INTERRUPTED
      │ cancel, expire   │ answer     │   │
      │ (answered now)   ▼            │   │ answer (as cancelled)
      └─────answer────▶ ANSWERED ◀────┴───┘

``QUEUED``: accepted, waiting for its worker (or its session's thread).
Cancelling it answers it at once, as cancelled (``answer_cancelled``): its job
never starts, and the worker that takes it later finds it ``ANSWERED`` and
drops it; so does a queue deadline that passes first (``expire``, see
admission.py). ``RUNNING``: its worker took it; ``kill`` ends its process (the
template's :class:`~.lifecycle.ChildLife`, which keeps a cancel that lands
before the process exists). ``KILLED``: a cancel or the pool's shutdown killed
it, and says why; its worker answers it, as cancelled. ``ANSWERED``: its one
result left. A cancel of a flight killed, answered, or whose process had
already ended changes nothing (:attr:`Cancel.FINISHED`): the result it earned
stands. ``INTERRUPTED``: a session step's cancel, which interrupts first
(see :mod:`.interrupts`): its session's thread answers it, interrupted, or as
cancelled if its process was killed past the grace; the pool's shutdown still
kills it. Any other move is a bug in the server, refused as a :class:`PoolError`.

Exactly one result leaves: every move happens under the flight's lock, and
only the move into ``ANSWERED`` sends one, so whoever answers first (the
worker, or a cancel of a queued flight) is the one that does.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Callable

from ..errors import PoolError, RequestError, quoted
from ..protocol import RequestId

__all__ = ["CLIENT_CANCELLED", "Cancel", "Flight", "FlightState", "Flights"]

CLIENT_CANCELLED = "the client cancelled the job"


class Cancel(enum.Enum):
    QUEUED = "queued"  # the caller answers it now, as cancelled
    RUNNING = "running"  # its process was killed; its worker answers it, as cancelled
    INTERRUPTED = "interrupted"  # a session step: interrupted (killed past a grace); its session answers it
    FINISHED = "finished"  # too late: its result is already out, or about to be


class FlightState(enum.Enum):
    __hash__ = object.__hash__  # by identity, as lifecycle.ChildState's (a C slot, not a Python call)
    QUEUED = "queued"
    RUNNING = "running"
    INTERRUPTED = "interrupted"
    KILLED = "killed"
    ANSWERED = "answered"


_MOVES: dict[FlightState, frozenset[FlightState]] = {
    FlightState.QUEUED: frozenset({FlightState.RUNNING, FlightState.ANSWERED}),
    FlightState.RUNNING: frozenset({FlightState.KILLED, FlightState.INTERRUPTED, FlightState.ANSWERED}),
    FlightState.INTERRUPTED: frozenset({FlightState.KILLED, FlightState.ANSWERED}),
    FlightState.KILLED: frozenset({FlightState.ANSWERED}),
    FlightState.ANSWERED: frozenset(),
}


def _key(request_id: RequestId) -> tuple[str, object]:
    # 1, 1.0 and True are equal in Python; as ids on the wire they are three different requests.
    return type(request_id).__name__, request_id


class Flight:
    def __init__(self, request_id: RequestId) -> None:
        self.id = request_id
        self._lock = threading.Lock()  # every move, between its worker, a cancel and the shutdown
        self._state = FlightState.QUEUED
        self._kill: Callable[[], bool] | None = None  # RUNNING and KILLED: ends its process
        # A session step's: interrupts it (see interrupts.py); False if it was over. A cancel uses it, if set.
        self._interrupt: Callable[[], bool] | None = None
        # KILLED: why (its result says so): the client's cancel, or the pool's shutdown.
        self._cancelled: str | None = None
        # Sends its result, as cancelled, when it is cancelled while queued (set by whoever queues it).
        self.answer_cancelled: Callable[[], None] = lambda: None

    def _move(self, state: FlightState) -> None:
        if state not in _MOVES[self._state]:
            raise PoolError(f"the pool lost track of request {self.id!r} ({self._state.value} -> {state.value})")
        self._state = state

    @property
    def state(self) -> FlightState:
        return self._state

    def start(self, kill: Callable[[], bool], interrupt: Callable[[], bool] | None = None) -> bool:
        """QUEUED -> RUNNING, the worker takes it: ``kill`` ends its process (False if it had already
        ended); ``interrupt``, if given, is what a cancel does instead. False if it was cancelled while queued
        (ANSWERED): it must not run, and it has been answered."""
        with self._lock:
            if self._state is FlightState.ANSWERED:
                return False
            self._move(FlightState.RUNNING)
            self._kill, self._interrupt = kill, interrupt
            return True

    def cancel(self) -> Cancel:
        """The client's cancel: QUEUED -> ANSWERED (the caller answers it), RUNNING -> KILLED (its worker
        answers it), or nothing (already killed or answered)."""
        with self._lock:
            if self._state is FlightState.QUEUED:
                self._move(FlightState.ANSWERED)
                return Cancel.QUEUED
            if self._state is FlightState.RUNNING and self._interrupt is not None:
                if not self._interrupt():
                    return Cancel.FINISHED
                self._move(FlightState.INTERRUPTED)
                return Cancel.INTERRUPTED
            if self._state is FlightState.RUNNING:
                return self._kill_running(CLIENT_CANCELLED)
            return Cancel.FINISHED

    def expire(self) -> bool:
        """Its queue deadline passed: QUEUED -> ANSWERED (the caller refuses it), True; False if a worker
        started it or it was answered meanwhile (never a kill: a job that started runs on)."""
        with self._lock:
            if self._state is not FlightState.QUEUED:
                return False
            self._move(FlightState.ANSWERED)
            return True

    def stop(self, reason: str) -> bool:
        """The pool's shutdown escalated: kill it if it runs (its worker answers it, as cancelled for
        ``reason``); True if it was killed. A queued one is left to its worker, which refuses it."""
        with self._lock:
            return self._state in (FlightState.RUNNING, FlightState.INTERRUPTED) and \
                self._kill_running(reason) is Cancel.RUNNING

    def _kill_running(self, reason: str) -> Cancel:
        assert self._kill is not None  # RUNNING
        if not self._kill():
            return Cancel.FINISHED  # its process had ended: the result it earned stands
        self._move(FlightState.KILLED)
        self._cancelled = reason
        return Cancel.RUNNING

    @property
    def cancelled(self) -> str | None:
        """Why it was killed (or stopped on its way to a process) for a cancel; None if it was not. Read
        under the lock: a cancel whose kill is under way is waited for, never half seen."""
        with self._lock:
            return self._cancelled

    @property
    def interrupted(self) -> bool:
        """A cancel interrupted it (a session step), and nothing killed it since."""
        with self._lock:
            return self._state is FlightState.INTERRUPTED

    @property
    def answered(self) -> bool:
        with self._lock:
            return self._state is FlightState.ANSWERED

    def answer(self) -> bool:
        """The worker's result is ready: True if it is the one to send (not answered by a cancel)."""
        with self._lock:
            if self._state is FlightState.ANSWERED:
                return False
            self._move(FlightState.ANSWERED)
            return True


class Flights:
    """Every flight not yet answered, by request id (a client may reuse an id: all of them are found)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_id: dict[tuple[str, object], list[Flight]] = {}

    def add(self, flight: Flight) -> None:
        with self._lock:
            self._by_id.setdefault(_key(flight.id), []).append(flight)

    def remove(self, flight: Flight) -> None:
        with self._lock:
            flights = self._by_id.get(_key(flight.id), [])
            if flight in flights:
                flights.remove(flight)
            if not flights:
                self._by_id.pop(_key(flight.id), None)

    def unanswered(self) -> int:
        """Requests accepted and not yet answered (a flight cancelled while queued is answered at once)."""
        with self._lock:
            return sum(not flight.answered for flights in self._by_id.values() for flight in flights)

    def find(self, request_id: RequestId) -> list[Flight]:
        with self._lock:
            return list(self._by_id.get(_key(request_id), ()))

    def all(self) -> list[Flight]:
        with self._lock:
            return [flight for flights in self._by_id.values() for flight in flights]

    def cancel(self, target: RequestId, acknowledge: Callable[[], None], shown: RequestId | None = None) -> None:
        """The client's ``{"cancel": target}``: every queued or running flight with that id ends, and each still
        gets its one result, as cancelled. ``acknowledge`` answers the cancel itself, before the results of the
        flights it answered while queued. RequestError (the cancel is refused) when none was queued or running,
        naming ``shown`` (the id as its client gave it, where the pool's own differs: a listening pool's)."""
        ended = [(flight, how) for flight in self.find(target) if (how := flight.cancel()) is not Cancel.FINISHED]
        if not ended:
            raise RequestError(f"cancel: no queued or running job has the id "
                               f"{quoted(target if shown is None else shown)}; it may have finished already")
        acknowledge()
        for flight, how in ended:
            if how is Cancel.QUEUED:
                flight.answer_cancelled()

    def cancel_quietly(self, target: RequestId) -> None:
        """End ``target``'s queued or running flights with no answer to a cancel (a listening pool's dropped
        connection: nobody reads it); each still gets its one result. Not under the intake lock: a connection
        is dropped from wherever its outbox overflowed, a line's handling included."""
        for flight in self.find(target):
            if flight.cancel() is Cancel.QUEUED:
                flight.answer_cancelled()
