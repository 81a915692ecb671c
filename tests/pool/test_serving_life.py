"""The served job's table of moves, directly (no pool): every event from every state, the clock, and the verdict a
violation found after the timeout keeps."""

from __future__ import annotations

import pytest

from pynox.errors import PoolWorkerError
from pynox.server.serving import ServingEvent, ServingLife, ServingState

pytestmark = pytest.mark.pure

_S, _E = ServingState, ServingEvent
_DEADLINE = 1_000
_GRACE = 500
# The events that reach each state from a fresh life, so that every event can be tried from it.
_PATH = {
    _S.RUNNING: [],
    _S.VIOLATED: [_E.VIOLATION],
    _S.TIMED_OUT: [_E.DEADLINE],
    _S.TIMED_OUT_VIOLATED: [_E.DEADLINE, _E.VIOLATION],
    _S.DEAD: [_E.DEADLINE, _E.DIED],
    _S.DEAD_VIOLATED: [_E.DEADLINE, _E.DIED, _E.VIOLATION],
}
# The table as the server means it: written out again here, so that a change to it has to be made twice.
_LEGAL = {
    _S.RUNNING: {_E.VIOLATION: _S.VIOLATED, _E.DEADLINE: _S.TIMED_OUT},
    # Killed for a violation, its deadline still holds: at it, killed again and the grace starts.
    _S.VIOLATED: {_E.VIOLATION: _S.VIOLATED, _E.DEADLINE: _S.TIMED_OUT_VIOLATED},
    # Killed at its deadline: a violation found now outranks the timeout; its pidfd is watched.
    _S.TIMED_OUT: {_E.VIOLATION: _S.TIMED_OUT_VIOLATED, _E.DIED: _S.DEAD},
    _S.TIMED_OUT_VIOLATED: {_E.VIOLATION: _S.TIMED_OUT_VIOLATED, _E.DIED: _S.DEAD_VIOLATED},
    _S.DEAD: {_E.VIOLATION: _S.DEAD_VIOLATED},  # a frame still buffered on its channel, read after its death
    _S.DEAD_VIOLATED: {_E.VIOLATION: _S.DEAD_VIOLATED},
}


def _do(life: ServingLife, event: ServingEvent, now: int = _DEADLINE) -> None:
    if event is _E.VIOLATION:
        life.violated(f"violation at {life.state.value}")
    elif event is _E.DEADLINE:
        life.time_out(now)
    else:
        life.died()


def _at(state: ServingState) -> ServingLife:
    life = ServingLife(_DEADLINE, _GRACE)
    for event in _PATH[state]:
        _do(life, event)
    assert life.state is state
    return life


@pytest.mark.parametrize("start", list(ServingState))
@pytest.mark.parametrize("event", list(ServingEvent))
def test_every_event_from_every_state(start: ServingState, event: ServingEvent) -> None:
    life = _at(start)
    target = _LEGAL[start].get(event)
    if target is not None:
        _do(life, event)
        assert life.state is target
    else:
        kill_deadline, violation = life.kill_deadline, life.violation
        with pytest.raises(PoolWorkerError, match=rf"lost track of its job \({start.value}: {event.value}\)"):
            _do(life, event)
        # A refused move changes nothing.
        assert (life.state, life.kill_deadline, life.violation) == (start, kill_deadline, violation)


@pytest.mark.parametrize("state", list(ServingState))
def test_what_each_state_says(state: ServingState) -> None:
    life = _at(state)
    assert life.condemned is (state is not _S.RUNNING)  # a pidfd arriving now is killed at once
    assert life.timed_out is (state in {_S.TIMED_OUT, _S.TIMED_OUT_VIOLATED, _S.DEAD, _S.DEAD_VIOLATED})
    assert life.dead is (state in {_S.DEAD, _S.DEAD_VIOLATED})
    assert (life.violation is not None) is state.value.endswith("violated")


def test_the_deadline_then_the_grace() -> None:
    life = ServingLife(_DEADLINE, _GRACE)
    assert not life.due(_DEADLINE - 1)
    assert life.wake() == _DEADLINE  # the loop sleeps until its deadline at most
    assert life.due(_DEADLINE)
    life.time_out(_DEADLINE + 7)  # seen a little late: the grace counts from when it was killed
    assert not life.due(_DEADLINE + 8)  # timed out once: never due again
    assert life.wake() == life.kill_deadline == _DEADLINE + 7 + _GRACE
    assert not life.grace_over(_DEADLINE + 7 + _GRACE - 1)
    assert life.grace_over(_DEADLINE + 7 + _GRACE)  # the template is broken


def test_a_violation_found_after_the_timeout_keeps_both() -> None:
    # The verdict reads the violation first (outcome.py); the timeout still happened, and its grace still runs.
    life = ServingLife(_DEADLINE, _GRACE)
    life.time_out(_DEADLINE)
    life.violated("a frame over its cap")
    assert life.timed_out and life.violation == "a frame over its cap"
    assert life.grace_over(_DEADLINE + _GRACE)


def test_a_job_killed_for_a_violation_is_still_timed_out_at_its_deadline() -> None:
    life = ServingLife(_DEADLINE, _GRACE)
    life.violated("the job does not read the answers to its host calls")
    assert not life.timed_out and not life.grace_over(10 * _DEADLINE)  # no grace before its deadline
    assert life.due(_DEADLINE)
    life.time_out(_DEADLINE)
    assert life.state is _S.TIMED_OUT_VIOLATED
    assert life.violation == "the job does not read the answers to its host calls"


def test_a_later_violation_names_the_result() -> None:
    life = ServingLife(_DEADLINE, _GRACE)
    life.violated("the job did not read the answers to its host calls for 10s")
    life.violated("a call frame over its cap")  # read from the channel after the outbox condemned it
    assert life.violation == "a call frame over its cap"
