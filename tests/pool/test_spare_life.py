"""The spare template's table of moves, directly (no pool, no template): every operation from every state."""

from __future__ import annotations

import threading

import pytest

from pynox.errors import PoolError
from pynox.server.spare import SpareLife, SpareState

pytestmark = [pytest.mark.pure, pytest.mark.timeout(10)]

_S = SpareState
_SPARE = "a template"


def _at(state: SpareState) -> SpareLife[str]:
    life: SpareLife[str] = SpareLife()
    if state is _S.CLOSED:
        life.close()
    elif state is not _S.DORMANT:
        assert life.take() == (None, True)
        if state is _S.READY:
            assert life.started(_SPARE)
        elif state is _S.FAILED:
            life.failed()
    assert life.state is state
    return life


# What each operation does from each state: the state after it and what it returns, or None: refused.
_Table = dict[SpareState, tuple[SpareState, object] | None]
_TAKE: _Table = {_S.DORMANT: (_S.STARTING, (None, True)), _S.STARTING: (_S.STARTING, (None, False)),
         _S.READY: (_S.STARTING, (_SPARE, False)), _S.FAILED: (_S.FAILED, (None, False)),
         _S.CLOSED: (_S.CLOSED, (None, False))}
_STARTED: _Table = {_S.DORMANT: None, _S.STARTING: (_S.READY, True), _S.READY: None, _S.FAILED: None,
            _S.CLOSED: (_S.CLOSED, False)}
_FAILED: _Table = {_S.DORMANT: None, _S.STARTING: (_S.FAILED, None), _S.READY: None, _S.FAILED: None,
           _S.CLOSED: (_S.CLOSED, None)}
_CLOSE: _Table = {state: (_S.CLOSED, _SPARE if state is _S.READY else None) for state in SpareState}


@pytest.mark.parametrize("start", list(SpareState))
@pytest.mark.parametrize("operation", ["take", "started", "failed", "close"])
def test_every_move_of_the_table(start: SpareState, operation: str) -> None:
    life = _at(start)
    tables: dict[str, _Table] = {"take": _TAKE, "started": _STARTED, "failed": _FAILED, "close": _CLOSE}
    expected = tables[operation][start]
    do = {"take": life.take, "started": lambda: life.started(_SPARE), "failed": life.failed,
          "close": life.close}[operation]
    if expected is None:
        with pytest.raises(PoolError, match=r"lost track of its spare template \(" + start.value):
            do()
        assert life.state is start  # a refused move changes nothing
    else:
        state, returned = expected
        assert do() == returned
        assert life.state is state


def test_the_starting_thread_is_told_when_a_spare_is_wanted_and_when_to_stop() -> None:
    assert _at(_S.STARTING).wanted() is True
    assert _at(_S.CLOSED).wanted() is False
    assert _at(_S.FAILED).wanted() is False
    life = _at(_S.READY)
    answers: list[bool] = []
    waiter = threading.Thread(target=lambda: answers.append(life.wanted()))
    waiter.start()
    waiter.join(0.2)
    assert waiter.is_alive() and not answers  # one is ready: no other is wanted until it is taken
    assert life.take() == (_SPARE, False)
    waiter.join(5)
    assert answers == [True]


def test_a_pool_with_sessions_keeps_one_ready_until_it_closes() -> None:
    life: SpareLife[str] = SpareLife()
    assert life.take() == (None, True)  # the first session starts its own, and the thread that keeps one ready
    assert life.started("first") and life.take() == ("first", False)
    assert life.take() == (None, False)  # the next is still starting: this session starts its own
    assert life.started("second")
    closer = threading.Thread(target=life.wait_closed)
    closer.start()
    assert life.close() == "second"  # the waiting one is the pool's to close
    closer.join(5)
    assert not closer.is_alive()
    assert life.started("late") is False  # finished starting after the close: its starter closes it
