"""The children a template confines ahead of the next job, as the server sees them: explicit states, checked moves.

::

    (forked for job n) ──Ended(prepares k)──▶ k due ──Prepared(job n)──▶ WAITING ──take (same key)──▶ HANDED
                                                         │ job n's key unknown  │ another key, or one │ dying, or
                                                         ▼                      │ of more than K      │ the hand-
                                                      RELEASED ◀────────────────┴─────────────────────┘ over failed
                                                         │ Ended
                                                         ▼                      WAITING ──Ended──▶ GONE
                                                       GONE                     (died while it waited)

Whenever the template reaps a child that was not given up, it confines
children from the latest job's grants until ``K`` of them live (``[pool]
prepared_children``; one handed a job counts until it ends), and says so:
the ``Ended`` frame says how many are ``due``, a ``Prepared`` frame brings
each, an ``Unprepared`` frame says how many will not come (a fork failed, or,
after a child killed, its memory cgroup has no room for them). ``WAITING``:
at most ``K`` wait, for a job with the same key
(confinement, the grants' files, the working directory), and the next such
job is handed to one of them instead of a fork, unless a runtime path may name
another file since (``policy.runtime.RuntimeWatch``: the job is then forked,
and the template discards every child it prepared before); from then it is the
worker's :class:`~pynox.server.lifecycle.ChildLife`, and the others wait on
while the template replaces it. ``RELEASED``: given up (discarded, or found
dying when its job came); the template still reports its end, which is then
expected and passed over, and replaces none given up. A serial that is
neither, in an ``Ended`` frame, is the template's error (:meth:`ended` says
so).

Only the server's worker thread moves these states, so no lock is held. The
table keeps the decisions; :class:`~pynox.server.templates.Template` does the
I/O they call for (sending ``Discard``, reading /proc).
"""

from __future__ import annotations

import enum
import itertools
import os
import socket
from dataclasses import dataclass

from ..errors import PoolWorkerError

__all__ = ["KEYS_KEPT", "Key", "PreparedChild", "PreparedChildren", "PreparedState"]

# What a prepared child is matched by: its job's confinement, encoded, and what its grants and working
# directory name (device, inode).
Key = tuple[bytes, tuple[tuple[int, int], ...]]
# Jobs whose key is remembered for the child prepared from them: the last one, and the one before it, whose
# Prepared frame may still be on its way when the next job is sent.
KEYS_KEPT = 2


class PreparedState(enum.Enum):
    __hash__ = object.__hash__  # by identity, as lifecycle.ChildState's (a C slot, not a Python call)
    WAITING = "waiting"
    HANDED = "handed"
    RELEASED = "released"
    GONE = "gone"


_MOVES: dict[PreparedState, frozenset[PreparedState]] = {
    PreparedState.WAITING: frozenset({PreparedState.HANDED, PreparedState.RELEASED, PreparedState.GONE}),
    PreparedState.HANDED: frozenset({PreparedState.RELEASED}),  # the job could not be given to it after all
    PreparedState.RELEASED: frozenset({PreparedState.GONE}),
    PreparedState.GONE: frozenset(),
}


@dataclass
class PreparedChild:
    """A child confined ahead of the next job: its pidfd, and the server's end of its control socket, on
    which its seccomp listener is waiting."""

    serial: int
    pid: int
    pidfd: int
    control: socket.socket
    key: Key | None
    state: PreparedState = PreparedState.WAITING

    def move(self, state: PreparedState) -> None:
        if state not in _MOVES[self.state]:
            raise PoolWorkerError(f"the pool lost track of a prepared child ({self.state.value} -> {state.value})")
        self.state = state

    def close(self) -> None:
        """Closing the control socket ends the child if it is still waiting (it reads EOF)."""
        self.control.close()
        try:
            os.close(self.pidfd)
        except OSError:
            pass


class PreparedChildren:
    """One template's prepared children: those waiting (at most ``limit``), those given up, the keys of recent
    jobs, and how many the template announced and has not brought yet."""

    def __init__(self, limit: int = 1) -> None:
        self.limit = limit  # [pool] prepared_children: the most that wait at once
        self.waiting: list[PreparedChild] = []  # oldest first
        self.due = 0  # announced in Ended frames, not arrived yet: each frame comes in the time of a fork
        self._released: dict[int, PreparedChild] = {}
        self._keys: dict[int, Key] = {}
        self._jobs = itertools.count(1)

    def job(self, key: Key | None) -> int:
        """The number a job is sent to the template with; a child prepared from it takes a job of ``key``."""
        job = next(self._jobs)
        if key is not None:
            self._keys[job] = key
            while len(self._keys) > KEYS_KEPT:
                del self._keys[next(iter(self._keys))]
        return job

    def forget(self) -> list[PreparedChild]:
        """The template moved to other cgroups (see Template._enter): no child it prepared before may take a
        job, nor one on its way (its job's key is forgotten). Returns the children to discard (released now)."""
        self._keys.clear()
        discard = list(self.waiting)
        for child in discard:
            self.release(child)
        return discard

    def announced(self, count: int) -> None:
        """An Ended frame said the template is preparing ``count`` children now."""
        self.due += count

    def unannounced(self, count: int) -> None:
        """An Unprepared frame said ``count`` of the children announced could not be forked: none comes for them."""
        self.due = max(self.due - count, 0)

    def arrived(self, serial: int, job: int, pid: int, pidfd: int, control: socket.socket) -> list[PreparedChild]:
        """A Prepared frame for ``job``: it waits for a job of its key, unless that key was forgotten. Those
        waiting for another key (an older job's: the template prepares for the latest) are given up, and the
        oldest beyond ``limit``. Returns the children to discard (released now), itself among them if so."""
        self.due = max(self.due - 1, 0)
        child = PreparedChild(serial, pid, pidfd, control, self._keys.get(job))
        discard = [other for other in self.waiting if other.key != child.key]
        self.waiting.append(child)
        if child.key is None:
            discard.append(child)
        kept = [other for other in self.waiting if other not in discard]
        discard += kept[:max(len(kept) - self.limit, 0)]
        for given_up in discard:
            self.release(given_up)
        return discard

    def give_up_other_keys(self, key: Key | None) -> list[PreparedChild]:
        """Before a job of ``key`` starts: the waiting children that cannot take it, given up now (released: to
        discard), so they are gone before the job's memory is measured from (see Template.run)."""
        discard = [other for other in self.waiting if key is None or other.key != key]
        for given_up in discard:
            self.release(given_up)
        return discard

    def take(self, key: Key | None) -> tuple[PreparedChild | None, list[PreparedChild]]:
        """A waiting child for a job of ``key``, and those given up (released now: to discard). The child that
        matches is now handed the job (or to be released if it is dying; take again then); others of the same
        key wait on. Those of another key are given up; all of them if none matches (the job is forked)."""
        child = next((other for other in self.waiting if key is not None and other.key == key), None)
        discard = [other for other in self.waiting if other is not child and other.key != key]
        if child is None:
            discard = list(self.waiting)
        for given_up in discard:
            self.release(given_up)
        if child is None:
            return None, discard
        self.waiting.remove(child)
        child.move(PreparedState.HANDED)
        return child, discard

    def release(self, child: PreparedChild) -> None:
        """Give ``child`` up: its end, which the template reports, is passed over. A child handed a job that never
        reached it (it was dying) is released too. The server's ends are closed once that end is reported
        (:meth:`ended`), not now: the child would read the control socket's EOF and end on its own, before its
        template kills it for the Discard on its way, and the template would then take it for one that ended
        after a job and prepare another in its place (each one room beyond the next job's memory limit, whose
        base was measured with it)."""
        child.move(PreparedState.RELEASED)
        if child in self.waiting:
            self.waiting.remove(child)
        self._released[child.serial] = child

    @property
    def released(self) -> bool:
        """Whether a child given up has not been reported ended yet."""
        return bool(self._released)

    def ended(self, serial: int) -> bool:
        """The template reaped ``serial``: True if it was a prepared child the server knew of (it died while
        it waited, or it had been given up); False if it is none of them."""
        child = next((other for other in self.waiting if other.serial == serial), None)
        if child is not None:
            self.waiting.remove(child)
            child.move(PreparedState.GONE)
            child.close()
            return True
        child_released = self._released.pop(serial, None)
        if child_released is None:
            return False
        child_released.move(PreparedState.GONE)
        child_released.close()
        return True

    def close(self) -> None:
        for child in [*self.waiting, *self._released.values()]:
            child.close()
        self.waiting.clear()
        self._released.clear()
