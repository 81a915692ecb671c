"""A server session's table of moves, directly (no pool): every legal move, each refusal, and the intake."""

from __future__ import annotations

import pytest

from pynox.errors import PoolError
from pynox.server.session_life import SessionLife, SessionState

pytestmark = pytest.mark.pure

_S = SessionState
_MOVE = {_S.RUNNING: "running", _S.IDLE: "step_done", _S.ENDED: "ended", _S.CLOSED: "closed"}
# The ways to reach each state from a fresh life, so that every move can be tried from it.
_PATH = {_S.OPENING: [], _S.RUNNING: [_S.RUNNING], _S.IDLE: [_S.RUNNING, _S.IDLE],
         _S.ENDED: [_S.ENDED], _S.CLOSED: [_S.CLOSED]}
_LEGAL = {
    _S.OPENING: {_S.RUNNING, _S.ENDED, _S.CLOSED},  # its first step; refused before it started; closed unused
    _S.RUNNING: {_S.IDLE, _S.ENDED},  # the step's result leaves, the session goes on; or it ended with the step
    _S.IDLE: {_S.RUNNING, _S.ENDED, _S.CLOSED},  # the next step; its child died waiting; closed
    _S.ENDED: {_S.CLOSED},  # queued steps refused, the thread is done
    _S.CLOSED: set(),
}


def _at(state: SessionState) -> SessionLife:
    life = SessionLife("notebook")
    for step in _PATH[state]:
        getattr(life, _MOVE[step])()
    assert life.state is state
    return life


@pytest.mark.parametrize("start", list(SessionState))
@pytest.mark.parametrize("target", [_S.RUNNING, _S.IDLE, _S.ENDED, _S.CLOSED])
def test_every_move_of_the_table(start: SessionState, target: SessionState) -> None:
    life = _at(start)
    if target in _LEGAL[start]:
        getattr(life, _MOVE[target])()
        assert life.state is target
    else:
        with pytest.raises(PoolError, match=r"lost track of session 'notebook' \(" + start.value):
            getattr(life, _MOVE[target])()
        assert life.state is start  # a refused move changes nothing


def test_a_notebook_runs_steps_then_is_closed_by_its_idle_timer() -> None:
    life = SessionLife("notebook")
    assert not life.has_process  # opening: nothing to look at for the reaper, nothing to kill yet
    for _ in range(3):
        life.running()
        assert life.has_process
        life.step_done()
        assert life.has_process
    assert life.stop_taking() is True  # the idle timer closes its intake and queues the close
    assert life.closing
    life.closed()
    assert not life.has_process


def test_its_child_dying_ends_it() -> None:
    life = _at(_S.IDLE)
    life.ended()  # found dead by the next step
    assert not life.has_process
    assert life.stop_taking() is True  # forgotten: nothing more is queued on it
    life.closed()


def test_the_intake_closes_once() -> None:
    life = SessionLife("notebook")
    assert not life.closing
    assert life.stop_taking() is True  # the client's close queues the close
    assert life.stop_taking() is False  # the shutdown, later, queues none
    assert life.closing
    assert life.state is SessionState.OPENING  # the steps queued before the close still run
    life.running()
    life.step_done()
