"""Admission: the jobs that wait for a worker, counted from arrival, bounded, each with its queue deadline.

Intake reads every line as it arrives and never blocks on a full queue: a
job's wait is counted from the moment its line was read (``arrived_ns``), so
``queue_us`` and the queue-wait histogram show the whole of it, where before
a backlog waited unseen in the pipe. The bound on memory moves from the pipe
to this count: beyond ``[pool] max_queued`` waiting jobs a request is refused
at once, with the reason, instead of waiting without end. Where the operator set
no ``max_queued`` (and on stdin and stdout, where one client is served), intake
waits instead at ``DEFAULT_MAX_QUEUED`` waiting jobs, the protocol's own
backpressure: a client that writes faster than the pool runs is slowed, never
refused for it.

A job may carry a queue deadline (its ``queue_timeout``, else its profile's,
else ``[pool] queue_timeout``). When it passes before a worker takes the job,
the job is refused then, by the watcher thread here, not when a worker comes
free ("waited N s for a worker; the pool is saturated"): an agent hears it
while it can still do something else. A worker that takes a job just past its
deadline refuses it the same way (:meth:`Admission.taken`), so a job never
starts after its deadline. Exactly one result leaves: the refusal is the
flight's move QUEUED -> ANSWERED (:meth:`~.flights.Flight.expire`), which a
worker's start, a cancel or the deadline win once.

A job accepted enters here (:meth:`Admission.enter`): counted, found by a
cancel from then on (answered as cancelled while it waits), and queued for a
worker once the packages it names are in place (their install is part of its
wait; a failed install answers it as refused).
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from ..config import Config
from ..errors import RequestError
from ..grants import requested_units
from ..protocol import Request, Result, refusal
from ..units import format_duration, parse_duration
from ..wire.spec import JobSpec
from .flights import Flight, Flights

if TYPE_CHECKING:
    from .jobs import Job

__all__ = ["Admission", "Install", "Waiting", "queue_timeout", "saturated"]

# Installs a spec's packages, then calls back with the spec placed in their environment, or None and why not.
Install = Callable[[JobSpec, Callable[[JobSpec | None, str | None], None]], None]


class Waiting(Protocol):
    """What admission needs of a queued job."""

    @property
    def flight(self) -> Flight: ...

    @property
    def accepted_ns(self) -> int: ...

    @property
    def queue_deadline_ns(self) -> int | None: ...


class Admission:
    """Counts the jobs waiting for a worker and refuses them past their queue deadline.

    ``answer(result)`` sends a job's one result when it is answered here: refused past its deadline (its flight
    already moved to ANSWERED, from the watcher thread or from the worker that took the job late), cancelled
    while it waited, or refused for its packages. ``queue`` hands a job to the workers; ``install`` places the
    packages a job names (see packages.py); ``cancelled(job)`` is the result of a job cancelled before it started.
    """

    def __init__(self, capacity: int, workers: int, answer: Callable[[Result], None], *, flights: Flights,
                 queue: Callable[[Job], None], install: Install, cancelled: Callable[[Job], Result],
                 refuse: bool = True) -> None:
        """``refuse``: beyond ``capacity`` a job is refused at once; else :meth:`admit` waits for room."""
        self.capacity = capacity
        self.refuse = refuse
        self._workers = workers
        self._answer = answer
        self._flights = flights
        self._queue = queue
        self._install = install
        self._cancelled = cancelled
        self._lock = threading.Condition()
        self._waiting: set[int] = set()  # id() of each job admitted and not yet taken, expired or cancelled
        self._deadlines: list[tuple[int, int, Waiting]] = []  # a heap by deadline
        self._order = itertools.count()
        self._closed = False
        self._thread: threading.Thread | None = None

    @property
    def waiting(self) -> int:
        with self._lock:
            return len(self._waiting)

    def admit(self, job: Waiting) -> None:
        """Count ``job`` as waiting; RequestError (nothing ran) when ``max_queued`` jobs already wait, or, without
        ``refuse``, wait until one of them is taken (intake reads nothing meanwhile)."""
        with self._lock:
            while not self.refuse and len(self._waiting) >= self.capacity and not self._closed:
                self._lock.wait()
            if len(self._waiting) >= self.capacity:
                raise RequestError(
                    f"the pool's queue is full: {len(self._waiting)} jobs wait for its {self._workers} "
                    f"worker{'s' if self._workers != 1 else ''} ([pool] max_queued = {self.capacity}); refused at "
                    "once and nothing ran: the pool is saturated, try again later or elsewhere")
            self._waiting.add(id(job))
            if job.queue_deadline_ns is not None:
                heapq.heappush(self._deadlines, (job.queue_deadline_ns, next(self._order), job))
                if self._thread is None:
                    self._thread = threading.Thread(target=self._watch, name="pynox-queue-deadlines", daemon=True)
                    self._thread.start()
                self._lock.notify()

    def enter(self, job: Job) -> None:
        """``job`` was accepted: counted as waiting (RequestError when it is refused: nothing ran), found by a
        cancel from now on, and queued for a worker; one that names packages waits for them first, off intake's
        thread (an installed set is queued at once). The wait is the job's queue time (``queue_us``)."""

        def answer_cancelled() -> None:
            self.leave(job)
            self._answer(self._cancelled(job))

        job.flight.answer_cancelled = answer_cancelled
        self.admit(job)
        self._flights.add(job.flight)
        if not job.spec.packages:
            self._queue(job)
            return

        def placed(spec: JobSpec | None, why: str | None) -> None:
            if spec is not None:
                job.spec = spec
                self._queue(job)
                return
            # Nothing ran: answered as refused, unless a cancel answered it while it waited.
            self.leave(job)
            if job.flight.start(lambda: False) and job.flight.answer():
                self._answer(refusal(job.id, why or "packages: the install failed"))
            self._flights.remove(job.flight)

        try:
            self._install(job.spec, placed)
        except RequestError:  # this pool installs nothing, or too many jobs wait for installs
            self.leave(job)
            self._flights.remove(job.flight)
            raise

    def leave(self, job: Waiting) -> None:
        """``job`` no longer waits (a worker took it, or a cancel answered it)."""
        with self._lock:
            self._waiting.discard(id(job))
            self._lock.notify_all()  # room for a job intake holds, where it waits for one

    def taken(self, job: Waiting) -> None:
        """A worker took ``job``: it waits no more. Past its deadline it is refused here (it must not start)."""
        self.leave(job)
        deadline = job.queue_deadline_ns
        if deadline is not None and time.monotonic_ns() >= deadline:
            self._expire(job)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._lock.notify_all()

    def _watch(self) -> None:
        while True:
            with self._lock:
                while not self._closed and (not self._deadlines or self._deadlines[0][0] > time.monotonic_ns()):
                    wait = (self._deadlines[0][0] - time.monotonic_ns()) / 1e9 if self._deadlines else None
                    self._lock.wait(timeout=wait)
                if self._closed:
                    return
                _, _, job = heapq.heappop(self._deadlines)
                self._waiting.discard(id(job))
                self._lock.notify_all()
            self._expire(job)

    def _expire(self, job: Waiting) -> None:
        deadline = job.queue_deadline_ns
        assert deadline is not None
        if not job.flight.expire():
            return  # a worker started it, or it was answered (cancelled) meanwhile: nothing to do
        waited = (time.monotonic_ns() - job.accepted_ns) / 1e9
        result = refusal(job.flight.id, saturated(waited, (deadline - job.accepted_ns) / 1e9))
        result.queue_us = int(waited * 1e6)
        self._answer(result)


def saturated(waited: float, limit: float) -> str:
    """The refusal of a job whose queue deadline passed."""
    return (f"waited {format_duration(round(waited, 3))} for a worker (its queue_timeout is "
            f"{format_duration(limit)}); the pool is saturated: nothing ran")


def queue_timeout(request: Request, config: Config, pool_default: float | None) -> float | None:
    """How long ``request`` may wait for a worker, in seconds: its own, else its profile's, else the pool's;
    None for no deadline. A bad value is the request's RequestError."""
    if request.queue_timeout is not None:
        return requested_units(parse_duration, request.queue_timeout, "queue_timeout")
    if request.profile is not None:
        preset = config.profile(request.profile).queue_timeout
        if preset is not None:
            return parse_duration(preset, "queue_timeout")
    return pool_default
