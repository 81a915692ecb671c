"""Accepted requests on their way to their one result, by id: what ``{"cancel": ID}`` finds and ends.

A :class:`Flight` is queued, then running, then answered. Cancelling a queued
flight answers it at once (its job never starts: the worker that takes it
later drops it); cancelling a running one kills its process through the
template's :class:`~.lifecycle.ChildLife`, and its worker answers it, as
cancelled. Either way exactly one result leaves: whoever answers first marks
the flight answered under its lock, and the other side sees that.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Callable

from ..protocol import RequestId

__all__ = ["CLIENT_CANCELLED", "Cancel", "Flight", "Flights"]

CLIENT_CANCELLED = "the client cancelled the job"


class Cancel(enum.Enum):
    QUEUED = "queued"  # the caller answers it now, as cancelled
    RUNNING = "running"  # its process was killed; its worker answers it, as cancelled
    FINISHED = "finished"  # too late: its result is already out, or about to be


def _key(request_id: RequestId) -> tuple[str, object]:
    # 1, 1.0 and True are equal in Python; as ids on the wire they are three different requests.
    return type(request_id).__name__, request_id


class Flight:
    def __init__(self, request_id: RequestId) -> None:
        self.id = request_id
        self._lock = threading.Lock()
        self._kill: Callable[[], bool] | None = None
        self._answered = False
        # Why it was killed while it ran (its result says so): the client's cancel, or the pool's shutdown.
        self._cancelled: str | None = None
        # Sends its result, as cancelled, when it is cancelled while queued (set by whoever queues it).
        self.answer_cancelled: Callable[[], None] = lambda: None

    def start(self, kill: Callable[[], bool]) -> bool:
        """The worker takes it: ``kill`` ends its process (False if it had already ended). False if it
        was cancelled while queued: it must not run, and it has been answered."""
        with self._lock:
            if self._answered:
                return False
            self._kill = kill
            return True

    def cancel(self) -> Cancel:
        with self._lock:
            if self._answered or self._cancelled:
                return Cancel.FINISHED
            if self._kill is None:
                self._answered = True
                return Cancel.QUEUED
            return self._kill_running(CLIENT_CANCELLED)

    def stop(self, reason: str) -> bool:
        """The pool's shutdown escalated: kill it if it runs (its worker answers it, as cancelled for
        ``reason``); True if it was killed. A queued one is left to its worker, which refuses it."""
        with self._lock:
            if self._answered or self._cancelled or self._kill is None:
                return False
            return self._kill_running(reason) is Cancel.RUNNING

    def _kill_running(self, reason: str) -> Cancel:
        assert self._kill is not None  # it runs
        if not self._kill():
            return Cancel.FINISHED  # its process had ended: the result it earned stands
        self._cancelled = reason
        return Cancel.RUNNING

    @property
    def cancelled(self) -> str | None:
        """Why it was killed (or stopped on its way to a process) for a cancel; None if it was not. Read
        under the lock: a cancel whose kill is under way is waited for, never half seen."""
        with self._lock:
            return self._cancelled

    @property
    def answered(self) -> bool:
        with self._lock:
            return self._answered

    def answer(self) -> bool:
        """The worker's result is ready: True if it is the one to send (not answered by a cancel)."""
        with self._lock:
            if self._answered:
                return False
            self._answered = True
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
