"""The job being served, as the server's loop sees it: its deadline, its kills and what they were for; explicit
states, checked moves.

::

                 violation                    violation
    RUNNING ──────────────────▶ VIOLATED ─────────────▶ (itself: the reason replaced)
       │                           │
       │ deadline                  │ deadline
       ▼          violation        ▼                violation
    TIMED_OUT ────────────────▶ TIMED_OUT_VIOLATED ────▶ (itself)
       │                           │
       │ died                      │ died
       ▼          violation        ▼                violation
     DEAD ────────────────────▶ DEAD_VIOLATED ─────────▶ (itself)

Two things are seen of a job while it is served, and its state is the pair: how far its clock went, and whether
it broke the rules. The clock: ``RUNNING``, under its deadline; ``TIMED_OUT``, its deadline passed, it was
killed, and the template has a grace (:meth:`ServingLife.grace_over`, past which the template is broken) to
report its end, while its pidfd is watched; ``DEAD``, its pidfd said it died within that grace, so its result is
due now (the template may be slow to say so: stopped, busy). The rules: a host-call protocol violation, answers
it stopped reading, or a session step's report the pool cannot take (``*_VIOLATED``) kill it too. Neither folds
into the other: a job killed for a violation still has its deadline, at which it is killed again and its grace
starts; and a violation found after the timeout (a frame still buffered on the host channel, say) outranks the
timeout's verdict (outcome.py reads the violation first), so the state must remember both. A violation seen
again (the channel's, after the outbox's) replaces the reason: the result names the last one found.

Any state but ``RUNNING`` is condemned: a child whose pidfd arrives now is killed as it arrives, and its end
(the kernel's exit status) is awaited before its result leaves. A move off the table (a death seen before the
deadline, a second timeout) is a bug in the server, refused as a :class:`PoolWorkerError` (the template is then
replaced) rather than acted on.

The same clock serves a child answered from its report (:mod:`.lifecycle`'s ``ANSWERED``): killed as its result
left, its deadline still holds until the template reaps it; at that deadline it is killed again and the grace
starts (``Template._settle``). Only the server's worker thread moves these states, so no lock is held. The table
keeps the decisions and the times; :class:`~pynox.server.templates.Template` does the kills and the I/O.
"""

from __future__ import annotations

import enum

from ..errors import PoolWorkerError

__all__ = ["ServingEvent", "ServingLife", "ServingState"]


class ServingState(enum.Enum):
    __hash__ = object.__hash__  # by identity, as lifecycle.ChildState's (a C slot, not a Python call)
    RUNNING = "running"
    VIOLATED = "violated"
    TIMED_OUT = "timed out"
    TIMED_OUT_VIOLATED = "timed out, violated"
    DEAD = "dead"
    DEAD_VIOLATED = "dead, violated"


class ServingEvent(enum.Enum):
    __hash__ = object.__hash__  # by identity, as lifecycle.ChildState's (a C slot, not a Python call)
    VIOLATION = "violation"  # it broke the rules, and was killed
    DEADLINE = "deadline"  # its deadline passed, and it was killed
    DIED = "died"  # its pidfd became readable within the grace


_S, _E = ServingState, ServingEvent
# The table: from each state, each event that may happen there and where it leads; nothing else may.
_MOVES: dict[ServingState, dict[ServingEvent, ServingState]] = {
    _S.RUNNING: {_E.VIOLATION: _S.VIOLATED, _E.DEADLINE: _S.TIMED_OUT},
    _S.VIOLATED: {_E.VIOLATION: _S.VIOLATED, _E.DEADLINE: _S.TIMED_OUT_VIOLATED},
    _S.TIMED_OUT: {_E.VIOLATION: _S.TIMED_OUT_VIOLATED, _E.DIED: _S.DEAD},
    _S.TIMED_OUT_VIOLATED: {_E.VIOLATION: _S.TIMED_OUT_VIOLATED, _E.DIED: _S.DEAD_VIOLATED},
    _S.DEAD: {_E.VIOLATION: _S.DEAD_VIOLATED},
    _S.DEAD_VIOLATED: {_E.VIOLATION: _S.DEAD_VIOLATED},
}
_UNDER_DEADLINE = frozenset({_S.RUNNING, _S.VIOLATED})
_DEAD = frozenset({_S.DEAD, _S.DEAD_VIOLATED})


class ServingLife:
    """One job's (or session step's) state while it is served, its deadline, the end of its grace once it
    timed out, and the reason of the violation it was killed for, if any. Times are monotonic ns."""

    def __init__(self, deadline: int, grace: int) -> None:
        self.state = ServingState.RUNNING
        self.deadline = deadline
        self.grace = grace  # how long the template has to report a child killed at its deadline
        self.kill_deadline: int | None = None  # set at the timeout: the template must report the end by then
        self.violation: str | None = None

    def _move(self, event: ServingEvent) -> None:
        target = _MOVES[self.state].get(event)
        if target is None:
            raise PoolWorkerError(f"the pool lost track of its job ({self.state.value}: {event.value})")
        self.state = target

    def violated(self, reason: str) -> None:
        """It broke the rules (the caller kills it): the verdict is the violation's, whatever its clock says."""
        self._move(ServingEvent.VIOLATION)
        self.violation = reason

    def due(self, now: int) -> bool:
        """Whether its deadline has passed and it has not been timed out yet (:meth:`time_out` is due)."""
        return self.state in _UNDER_DEADLINE and now >= self.deadline

    def time_out(self, now: int) -> None:
        """Its deadline passed (the caller kills it): the template's grace to report its end starts now."""
        self._move(ServingEvent.DEADLINE)
        self.kill_deadline = now + self.grace

    def died(self) -> None:
        """Its pidfd, watched since its timeout, says it is dead: its result is due now."""
        self._move(ServingEvent.DIED)

    def grace_over(self, now: int) -> bool:
        """Whether the template let the grace pass without reporting the end of the child killed at its
        deadline: the template is broken."""
        return self.kill_deadline is not None and now >= self.kill_deadline

    def wake(self) -> int:
        """When the clock must be looked at next: the end of the grace once it timed out, else its deadline."""
        return self.kill_deadline if self.kill_deadline is not None else self.deadline

    @property
    def timed_out(self) -> bool:
        """Its deadline passed (and its pidfd is watched)."""
        return self.state not in _UNDER_DEADLINE

    @property
    def condemned(self) -> bool:
        """Killed, or to be killed as its pidfd arrives; its end is awaited before its result leaves."""
        return self.state is not ServingState.RUNNING

    @property
    def dead(self) -> bool:
        """Its pidfd said it died: nothing more is awaited of its end."""
        return self.state in _DEAD
