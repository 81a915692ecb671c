"""The template started ahead for the next new session, as the server sees it: explicit states, checked moves.

::

                first take             ready             want              prepare
    DORMANT ─────────────▶ STARTING ────────▶ READY ────────────▶ STALE ──────────▶ PREPARING
                             ▲                  │   ◀────────────    │                   │
                             │                  │    want (met)      │                   │ ready
                             │                  │ take               │ take              ▼
                             │                  ▼                    │             READY (or STALE, if a
                             └── answered ─── OWED ◀─────────────────┘             want came meanwhile)
                                 found dead

    STARTING ──ready──▶ STALE (a want came while it started)     STARTING, PREPARING ──lost──▶ STARTING
    STARTING, PREPARING ──failed──▶ FAILED                        every state ──close──▶ CLOSED

What the states hold: the template waiting (``READY``, ``STALE``, ``PREPARING``), the one taken and owed a
replacement (``OWED``), what the next session is likely confined with (the *want*: the last shareable first
step's bounds and grants, kept in every state), and what the waiting template's child was prepared for.

``DORMANT``: no session has asked for a template yet, and none is started ahead: a pool that never has a session
starts none. The first take starts the thread that keeps one ready, and gets none (its caller starts its own).
``STARTING``: that thread starts a template, then prepares a child in it for the want, if one is known; a take
gets none meanwhile. A template that fails while it is prepared is closed and another started (``lost``).
``READY``: one waits, its child prepared for the want (or none wanted). ``STALE``: one waits, and a want came
that its child was not prepared for (another confinement; or none was prepared); the thread prepares one for it
(``PREPARING``: a fork's time, during which a take waits for it), then it is ``READY`` again, or ``STALE`` if yet
another want came meanwhile. A take of a ``READY`` or ``STALE`` template gets it, as it is. ``OWED``: the
template was taken, and the next one is started only once its taker's first step has been answered (on two
cores, forking and confining the next one would take the time that step needs), or at once if it was found dead
as it was taken. ``FAILED``: starting one failed (or the thread met a bug); sessions start their own from then.
``CLOSED``: the pool is closing; the template waiting (``READY``, ``STALE``) is closed by the closer. One being
prepared (``PREPARING``) is the thread's until it reports, as one it is starting is: the thread closes it once it
finds the pool closed (ready, lost or failed), and the closer waits for the thread. Every template has one closer:
one closed by two (the closer and the thread it was taken from under) closed descriptor numbers that were
another's by the second close (CI saw a pool's drain die on one, a spare template's memory cgroup descriptor).

A take in ``STARTING``, ``OWED``, ``FAILED`` or ``CLOSED`` gets none and moves nothing; a want while no
template waits is kept for the next; what the thread reports once the pool is closed moves nothing (the thread
closes what it holds). Those are moves of the table too, to themselves; anything else is a bug in the server,
refused as a :class:`PoolError`.

The table keeps the decisions, under one condition shared by the sessions' threads (take, answered), the spare's
thread (work, ready, lost, failed) and the pool's close; ``sessions._SpareTemplate`` starts, prepares, checks and
closes the templates.
"""

from __future__ import annotations

import enum
import threading
from typing import Generic, TypeVar

from ..errors import PoolError
from ..wire.spec import JobSpec

__all__ = ["SpareEvent", "SpareLife", "SpareState"]

Spare = TypeVar("Spare")


class SpareState(enum.Enum):
    DORMANT = "dormant"
    STARTING = "starting"
    READY = "ready"
    STALE = "stale"
    PREPARING = "preparing"
    OWED = "owed"
    FAILED = "failed"
    CLOSED = "closed"


class SpareEvent(enum.Enum):
    TAKE = "take"  # a session wants a template
    FOUND_DEAD = "found dead"  # the template taken had died while it waited
    ANSWERED = "answered"  # the first step of the session that took it was answered (or the session ended)
    WANT = "want"  # a want the waiting template's child was not prepared for
    WANT_MET = "want met"  # a want it was prepared for
    PREPARE = "prepare"  # the thread prepares a child for the want
    READY = "ready"  # the thread's template is ready, prepared for the want (or none wanted)
    READY_STALE = "ready, stale"  # it is ready, and a want it was not prepared for came meanwhile
    LOST = "lost"  # it failed while being prepared, and was closed: another is started
    FAILED = "failed"  # the thread stops: starting one failed, or a bug
    CLOSE = "close"


_S, _E = SpareState, SpareEvent
_ALWAYS = {_E.CLOSE: _S.CLOSED}
# The table: from each state, each event that may happen there and where it leads; nothing else may.
_MOVES: dict[SpareState, dict[SpareEvent, SpareState]] = {
    _S.DORMANT: {_E.TAKE: _S.STARTING, _E.WANT: _S.DORMANT, _E.WANT_MET: _S.DORMANT, **_ALWAYS},
    _S.STARTING: {_E.TAKE: _S.STARTING, _E.WANT: _S.STARTING, _E.WANT_MET: _S.STARTING, _E.READY: _S.READY,
                  _E.READY_STALE: _S.STALE, _E.LOST: _S.STARTING, _E.FAILED: _S.FAILED, **_ALWAYS},
    _S.READY: {_E.TAKE: _S.OWED, _E.WANT: _S.STALE, _E.WANT_MET: _S.READY, **_ALWAYS},
    _S.STALE: {_E.TAKE: _S.OWED, _E.WANT: _S.STALE, _E.WANT_MET: _S.READY, _E.PREPARE: _S.PREPARING, **_ALWAYS},
    # A take waits while it prepares (a fork's time): no TAKE here.
    _S.PREPARING: {_E.WANT: _S.PREPARING, _E.WANT_MET: _S.PREPARING, _E.READY: _S.READY,
                   _E.READY_STALE: _S.STALE, _E.LOST: _S.STARTING, _E.FAILED: _S.FAILED, **_ALWAYS},
    _S.OWED: {_E.TAKE: _S.OWED, _E.FOUND_DEAD: _S.STARTING, _E.ANSWERED: _S.STARTING, _E.WANT: _S.OWED,
              _E.WANT_MET: _S.OWED, **_ALWAYS},
    _S.FAILED: {_E.TAKE: _S.FAILED, _E.WANT: _S.FAILED, _E.WANT_MET: _S.FAILED, **_ALWAYS},
    _S.CLOSED: {event: _S.CLOSED for event in SpareEvent if event is not _E.PREPARE},
}
_WAITING = frozenset({_S.READY, _S.STALE, _S.PREPARING})  # the states that hold a template waiting


class SpareLife(Generic[Spare]):
    """The spare's state, the template it holds (waiting, or taken and owed), the want, and what the waiting
    template's child was prepared for."""

    def __init__(self) -> None:
        self._state = SpareState.DORMANT
        self._changed = threading.Condition()
        self._spare: Spare | None = None  # READY, STALE, PREPARING: the template waiting
        self._owed: Spare | None = None  # OWED: the template taken, whose taker's first step is not answered
        self.wanted: JobSpec | None = None  # the next session's likely first step (no payload), if one is known
        self.prepared_for: JobSpec | None = None  # the want the waiting template's child was prepared with

    @property
    def state(self) -> SpareState:
        with self._changed:
            return self._state

    def _move(self, event: SpareEvent) -> None:
        """With the condition held."""
        target = _MOVES[self._state].get(event)
        if target is None:
            raise PoolError(f"the pool lost track of its spare template ({self._state.value}: {event.value})")
        self._state = target
        self._changed.notify_all()

    def _stale(self) -> bool:
        """Whether the want is one the waiting template's child was not prepared for."""
        wanted, prepared = self.wanted, self.prepared_for
        return wanted is not None and (prepared is None or wanted.confinement != prepared.confinement)

    # -- the sessions' threads ------------------------------------------------------------------------
    def take(self) -> tuple[Spare | None, bool]:
        """A session wants a template: the one waiting, if any (now owed a replacement), once a child being
        prepared in it is; and whether this is the first take, whose caller starts the spare's thread."""
        with self._changed:
            while self._state is SpareState.PREPARING:
                self._changed.wait()
            first = self._state is SpareState.DORMANT
            spare = None
            if self._state in _WAITING:  # not once closed: one it was preparing then is the thread's (see close)
                spare, self._spare = self._spare, None
                self._owed, self.prepared_for = spare, None
            self._move(SpareEvent.TAKE)
            return spare, first

    def found_dead(self, spare: Spare) -> None:
        """The template just taken had died while it waited: nothing is owed for it, the next is started now."""
        with self._changed:
            if self._state is not SpareState.CLOSED and self._owed is not spare:
                raise PoolError(f"the pool lost track of its spare template ({self._state.value}: a dead one "
                                "that is not the one taken)")
            self._owed = None
            self._move(SpareEvent.FOUND_DEAD)

    def answered(self, taken: Spare | None, wanted: JobSpec | None) -> None:
        """A session's first step was answered (or the session ended before one was): if ``taken`` is the
        template owed, the next is started now; ``wanted`` (None: the session's confinement cannot be shared)
        is the want from now."""
        with self._changed:
            if self._state is SpareState.OWED and taken is not None and taken is self._owed:
                self._owed = None
                self._move(SpareEvent.ANSWERED)
            if wanted is not None:
                self.wanted = wanted
                self._move(SpareEvent.WANT if self._stale() else SpareEvent.WANT_MET)

    def close(self) -> Spare | None:
        """The pool is closing: the template waiting, for the caller to close; None while one is prepared, which
        the spare's thread is using and closes itself when it reports (its caller then waits for the thread)."""
        with self._changed:
            spare = None
            if self._state is not SpareState.PREPARING:
                spare, self._spare = self._spare, None
            self._move(SpareEvent.CLOSE)
            return spare

    # -- the spare's thread ----------------------------------------------------------------------------
    def work(self) -> tuple[Spare | None, JobSpec | None] | None:
        """On the spare's thread: wait until there is work, and say what: ``(None, want)``, start a template
        (and prepare a child in it for the want, if any); ``(template, want)``, prepare a child in the waiting
        template (STALE -> PREPARING). None once the pool is closing, or the thread failed."""
        with self._changed:
            while True:
                if self._state in (SpareState.CLOSED, SpareState.FAILED):
                    return None
                if self._state is SpareState.PREPARING:  # only this thread prepares: it asks for no work meanwhile
                    raise PoolError("the pool lost track of its spare template (preparing: asked for work)")
                if self._state is SpareState.STARTING:
                    return None, self.wanted
                if self._state is SpareState.STALE:
                    self._move(SpareEvent.PREPARE)
                    return self._spare, self.wanted
                self._changed.wait()  # dormant, ready, or owed

    def ready(self, spare: Spare, wanted: JobSpec | None, prepared: bool) -> bool:
        """The thread's template is ready: its child prepared for ``wanted`` if ``prepared`` (False: none could
        be, a grant is gone, and the want is forgotten unless a newer one came). False if the pool closed
        meanwhile: the thread closes it."""
        with self._changed:
            self._forget(wanted, prepared)
            self.prepared_for = wanted if prepared else None
            # Closed meanwhile: the thread closes it (one it was preparing too: the close left it to the thread).
            self._spare = spare if self._state is not SpareState.CLOSED else None
            self._move(SpareEvent.READY_STALE if self._stale() else SpareEvent.READY)
            return self._state is not SpareState.CLOSED

    def lost(self, wanted: JobSpec | None) -> None:
        """The thread's template failed while a child was prepared in it for ``wanted`` (the thread closed it):
        another is started; the want is forgotten until another session's first step is answered."""
        with self._changed:
            self._forget(wanted, False)
            self._spare, self.prepared_for = None, None
            self._move(SpareEvent.LOST)

    def failed(self) -> Spare | None:
        """The thread stops (starting a template failed, or a bug): the template it was preparing, if any, for
        the thread to close."""
        with self._changed:
            spare, self._spare = self._spare, None
            self._move(SpareEvent.FAILED)
            return spare

    def wait_closed(self) -> None:
        """On the spare's thread, which must outlive the templates it started (sessions hold them)."""
        with self._changed:
            while self._state is not SpareState.CLOSED:
                self._changed.wait()

    def _forget(self, wanted: JobSpec | None, prepared: bool) -> None:
        if not prepared and wanted is not None and self.wanted is wanted:  # not a newer one, which is tried
            self.wanted = None
