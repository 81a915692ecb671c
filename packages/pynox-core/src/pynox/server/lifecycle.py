"""The life of the child serving a worker's job, as the server sees it: explicit states, checked moves.

::

    IDLE ──take──▶ TAKEN ──send──▶ SENT ──Started──▶ RUNNING ──Ended──▶ ENDED ──release──▶ IDLE
     ▲              │ ▲             │                   │                  ▲
     │    cancelled │ └─never reached                   │ answered         │
     │  (not sent), │   the template                    └──▶ ANSWERED ─────┘ Ended (reaped after its result left)
     │   or dropped │   (retried)                            (killed)
     └──────────────┘

``TAKEN``: the worker took the job (its flight started, so a cancel may come)
and has not sent it: it may still wait for a template to be started or
settled. A cancel now is kept, and the job is then never sent (``send`` says
so and returns to ``IDLE``): a cancel is as absolute as a deadline, whenever
it lands. ``SENT``: the job is with the template, the child's pidfd has not
arrived, so it cannot be killed yet; a cancel is kept and the child is killed
as its pidfd arrives. ``RUNNING``: it can be killed; a session's child stays
here between steps. ``ANSWERED``: its result left as soon as its report was
complete; it was killed then, and its job's deadline still holds until the
template has reaped it. ``ENDED``: the template reaped it and said how it
ended. Any other move is a bug in the server, refused here as a
:class:`PoolWorkerError` (the template is then replaced) rather than acted on.

A worker keeps one life across the templates it replaces: a job taken while
its template is being replaced stays ``TAKEN`` (see :meth:`ChildLife.abandon`),
and a cancel that lands meanwhile still finds it.

The child is killed in one place (:meth:`ChildLife.kill`), through its pidfd:
no pid-reuse race, and nothing the job does can refuse it. The server's worker
thread moves the states; a cancel (from the thread reading requests) may kill
at any moment, so the pidfd, the kept cancel and the moves that read it are
used under one lock, and a child condemned before its pidfd arrived is killed
as it arrives.
"""

from __future__ import annotations

import enum
import os
import signal
import threading

from ..errors import PoolWorkerError
from ..wire.frames import Ended

__all__ = ["ChildLife", "ChildState"]


class ChildState(enum.Enum):
    # Hashed by identity (members are singletons, compared by identity): a C slot, where Enum's own
    # __hash__ is a Python call; each move of every table is one or two (~30 a job on the worker).
    __hash__ = object.__hash__
    IDLE = "idle"
    TAKEN = "taken"
    SENT = "sent"
    RUNNING = "running"
    ANSWERED = "answered"
    ENDED = "ended"


_MOVES: dict[ChildState, frozenset[ChildState]] = {
    ChildState.IDLE: frozenset({ChildState.TAKEN}),
    ChildState.TAKEN: frozenset({ChildState.SENT, ChildState.IDLE}),
    ChildState.SENT: frozenset({ChildState.RUNNING, ChildState.TAKEN}),
    ChildState.RUNNING: frozenset({ChildState.ANSWERED, ChildState.ENDED}),
    ChildState.ANSWERED: frozenset({ChildState.ENDED}),
    ChildState.ENDED: frozenset({ChildState.IDLE}),
}


class ChildLife:
    """One template's current child: its state, its pidfd and pid, and how it ended."""

    def __init__(self) -> None:
        self.state = ChildState.IDLE
        self.pidfd: int | None = None
        self.pid: int | None = None
        self.ended: Ended | None = None
        # ANSWERED: the monotonic deadline (ns) of its job, which holds until it is reaped.
        self.deadline: int | None = None
        # CPU time of this child counted in results already sent (a session's steps): each reports its own.
        self.cpu_us_reported = 0
        self._lock = threading.Lock()  # the pidfd and the kept cancel, between the worker and a cancel
        # Cancelled before its pidfd arrived: TAKEN, never sent; SENT, killed as soon as its pidfd arrives.
        self._condemned = False
        # A cancel reached the job taken last (its process killed, or condemned): a child that died before it
        # claimed its job was not lost to the job, and is not replaced by a fresh one (see Template.run).
        self.cancelled = False

    def _move(self, state: ChildState) -> None:
        if state not in _MOVES[self.state]:
            raise PoolWorkerError(f"the pool lost track of its job's process ({self.state.value} -> {state.value})")
        self.state = state

    def take(self) -> None:
        """A job is on its way: from now a cancel is kept until the job is sent (or dropped)."""
        with self._lock:
            self._move(ChildState.TAKEN)
            self.cancelled = False

    def sent(self) -> bool:
        """TAKEN -> SENT, the job goes to the template now; or, if it was cancelled since it was taken,
        TAKEN -> IDLE and False: it must not be sent, nothing of it ran."""
        with self._lock:
            if self._condemned:
                self._move(ChildState.IDLE)
                self._condemned = False
                return False
            self._move(ChildState.SENT)
            return True

    def not_sent(self) -> None:
        """The job never reached the template (it died, or the frame could not be sent): it is still on its
        way, to a fresh template, and a cancel is still kept."""
        with self._lock:
            self._move(ChildState.TAKEN)

    def drop(self) -> None:
        """TAKEN -> IDLE: the job was answered without being sent (refused, or no template could serve it)."""
        with self._lock:
            self._move(ChildState.IDLE)
            self._condemned = False

    def started(self, pidfd: int, pid: int) -> None:
        with self._lock:
            self._move(ChildState.RUNNING)
            self.pidfd, self.pid, self.cpu_us_reported = pidfd, pid, 0
            condemned, self._condemned = self._condemned, False
        if condemned:
            self.kill()

    def answered(self, deadline: int) -> None:
        """Its result left before the template reaped it: it is killed now, and reaped before the next job."""
        self._move(ChildState.ANSWERED)
        self.deadline = deadline
        self.kill()

    def reaped(self, ended: Ended) -> None:
        self._move(ChildState.ENDED)
        self.ended = ended

    def release(self) -> None:
        """ENDED -> IDLE: the pidfd is closed, the next job may come."""
        self._move(ChildState.IDLE)
        self._forget()

    def abandon(self) -> None:
        """Whatever the state, forget the child (its template is being closed, and the child dies with it).
        A job taken and not sent has no child yet: it stays TAKEN, cancel kept, for the next template."""
        with self._lock:
            if self.state is not ChildState.TAKEN:
                self.state = ChildState.IDLE
                self._condemned = False
        self._forget()

    def _forget(self) -> None:
        with self._lock:
            if self.pidfd is not None:
                os.close(self.pidfd)
            self.pidfd = self.pid = self.ended = self.deadline = None
            self.cpu_us_reported = 0
            if self.state is not ChildState.TAKEN:
                self._condemned = False

    @property
    def alive(self) -> bool:
        """Not yet reaped: a child that was sent, runs, or was answered and killed (a job only taken has none)."""
        return self.state in (ChildState.SENT, ChildState.RUNNING, ChildState.ANSWERED)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)

    def cancel(self) -> bool:
        """Kill the child for a cancel, from any thread: True if it was still running or on its way (taken or
        sent: the cancel is kept), False if its job was already over (answered, ended, or none)."""
        with self._lock:
            if self.state in (ChildState.TAKEN, ChildState.SENT) and self.pidfd is None:
                self._condemned = self.cancelled = True
                return True
            if self.state is not ChildState.RUNNING:
                return False
            self.cancelled = True
        self.kill()
        return True

    def signal(self, number: int) -> None:
        """Send ``number`` through the pidfd; a no-op before the pidfd arrives or after the child ended."""
        with self._lock:
            if self.pidfd is not None and self.state is not ChildState.ENDED:
                try:
                    signal.pidfd_send_signal(self.pidfd, number)
                except ProcessLookupError:
                    pass

    def used(self, cpu_us: int, max_rss_kb: int | None) -> tuple[int, int | None]:
        """What a result reports from the process's totals: its own CPU (the totals less what earlier
        steps reported) and the peak."""
        own = max(cpu_us - self.cpu_us_reported, 0)
        self.cpu_us_reported = cpu_us
        return own, max_rss_kb
