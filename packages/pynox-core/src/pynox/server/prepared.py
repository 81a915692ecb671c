"""The children a template confines ahead of the next job, as the server sees them: explicit states, checked moves.

::

    (forked for job n) ──Ended(prepares)──▶ due ──Prepared(job n)──▶ WAITING ──take (same key)──▶ HANDED
                                                      │ job n's key unknown   │ another key, a newer   │ dying, or
                                                      ▼                       │ one arrived            │ the hand-
                                                   RELEASED ◀─────────────────┴────────────────────────┘ over failed
                                                      │ Ended
                                                      ▼                       WAITING ──Ended──▶ GONE
                                                    GONE                      (died while it waited)

After a job's child is forked the template confines one more child from that
job's grants, and says so: the job's ``Ended`` frame says one is ``due``, its
``Prepared`` frame brings it. ``WAITING``: at most one waits, for a job with
the same key (confinement, the grants' files, the working directory), and
the next such job is handed to it instead of a fork; from then it is the
worker's :class:`~pynox.server.lifecycle.ChildLife`. ``RELEASED``: given up
(discarded, or found dying when its job came); the template still reports
its end, which is then expected and passed over. A serial that is neither,
in an ``Ended`` frame, is the template's error (:meth:`ended` says so).

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
    """One template's prepared children: the one waiting, those given up, and the keys of recent jobs."""

    def __init__(self) -> None:
        self.waiting: PreparedChild | None = None
        self.due = False  # the template said it is preparing one: its frame comes in the time of a fork
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

    def announced(self) -> None:
        """An Ended frame said the template is preparing a child."""
        self.due = True

    def arrived(self, serial: int, job: int, pid: int, pidfd: int, control: socket.socket) -> list[PreparedChild]:
        """A Prepared frame for ``job``: it waits for the next job, unless that job's key was forgotten.
        Returns the children to discard (released now): the one that waited before it, or itself."""
        self.due = False
        child = PreparedChild(serial, pid, pidfd, control, self._keys.get(job))
        discard = [self.waiting] if self.waiting is not None else []
        self.waiting = child
        if child.key is None:
            discard.append(child)
        for given_up in discard:
            self.release(given_up)
        return discard

    def take(self, key: Key | None) -> tuple[PreparedChild | None, PreparedChild | None]:
        """The waiting child, for a job of ``key``: ``(child, None)`` if it matches (it is now handed the
        job, or to be released if it is dying), ``(None, child)`` if it does not (released now: to discard),
        ``(None, None)`` if none waits."""
        child, self.waiting = self.waiting, None
        if child is None:
            return None, None
        if child.key is None or child.key != key:
            self.release(child)
            return None, child
        child.move(PreparedState.HANDED)
        return child, None

    def release(self, child: PreparedChild) -> None:
        """Give ``child`` up (and close the server's ends): its end, which the template reports, is passed over.
        A child handed a job that never reached it (it was dying) is released too."""
        child.move(PreparedState.RELEASED)
        if self.waiting is child:
            self.waiting = None
        self._released[child.serial] = child
        child.close()

    @property
    def released(self) -> bool:
        """Whether a child given up has not been reported ended yet."""
        return bool(self._released)

    def ended(self, serial: int) -> bool:
        """The template reaped ``serial``: True if it was a prepared child the server knew of (it died while
        it waited, or it had been given up); False if it is none of them."""
        if self.waiting is not None and self.waiting.serial == serial:
            child, self.waiting = self.waiting, None
            child.move(PreparedState.GONE)
            child.close()
            return True
        child_released = self._released.pop(serial, None)
        if child_released is None:
            return False
        child_released.move(PreparedState.GONE)
        return True

    def close(self) -> None:
        if self.waiting is not None:
            self.waiting.close()
            self.waiting = None
