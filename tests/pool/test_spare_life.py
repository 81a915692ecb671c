"""The spare template's table of moves, directly (no pool, no template): every operation from every state, the
want, and the waits of a take and of the spare's thread."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from pynox.errors import PoolError
from pynox.server.spare import SpareLife, SpareState
from pynox.wire.spec import Confinement, JobSpec, Payload

pytestmark = pytest.mark.pure

_S = SpareState
_WAIT = 10.0  # seconds a thread of these tests may take to reach its wait (a loaded machine)


class _T:
    """A template, as the table sees one: something it holds and hands back."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


def _want(cwd: str) -> JobSpec:
    confinement = Confinement(cwd=cwd, allow_read=[], allow_write=[], network="none", timeout=30.0, memory=1 << 30,
                              max_file_size=None, package_dirs=[], host_channel=False, max_open_files=256, uid=None,
                              gid=None, session=True, hint_style="api")
    payload = Payload(code=None, script=None, name="", args=[], env={}, functions=[])
    return JobSpec(confinement=confinement, payload=payload)


T1, T2 = _T("T1"), _T("T2")
A, A2, B = _want("/a"), _want("/a"), _want("/b")  # A2: another want confined as A is


def _at(state: SpareState) -> SpareLife[_T]:
    """A life in ``state``; where a template waits it is T1, its child prepared for A (STALE: B came since)."""
    life: SpareLife[_T] = SpareLife()
    if state is _S.CLOSED:
        life.close()
    if state in (_S.DORMANT, _S.CLOSED):
        assert life.state is state
        return life
    assert life.take() == (None, True)  # the first take: its caller starts the thread, and its own template
    if state is _S.FAILED:
        assert life.failed() is None
    elif state is not _S.STARTING:
        life.answered(None, A)  # a session's first step answered: A is wanted from now
        assert life.work() == (None, A)  # start one, and prepare a child in it for A
        assert life.ready(T1, A, True)
        if state is _S.OWED:
            assert life.take() == (T1, False)
        elif state in (_S.STALE, _S.PREPARING):
            life.answered(None, B)
            if state is _S.PREPARING:
                assert life.work() == (T1, B)
    assert life.state is state
    return life


_Op = Callable[[SpareLife[_T]], object]
_OPS: dict[str, _Op] = {
    "take": lambda life: life.take(),
    "found dead": lambda life: life.found_dead(T1),
    "answered": lambda life: life.answered(T1, None),
    "want B": lambda life: life.answered(None, B),
    "want A again": lambda life: life.answered(None, A2),
    "work": lambda life: life.work(),
    "ready": lambda life: life.ready(T2, life.wanted, True),
    "lost": lambda life: life.lost(life.wanted),
    "failed": lambda life: life.failed(),
    "close": lambda life: life.close(),
}
_ERROR, _BLOCKS = "error", "blocks"
# Where each operation leads from each state, written out again here, so that a change to the table has to be
# made twice; _ERROR: refused, the state unchanged; _BLOCKS: it waits (see the tests of the waits).
_EVERY = {state: state for state in SpareState}
_EXPECTED: dict[str, dict[SpareState, SpareState | str]] = {
    "take": {**_EVERY, _S.DORMANT: _S.STARTING, _S.READY: _S.OWED, _S.STALE: _S.OWED, _S.PREPARING: _BLOCKS},
    "found dead": {**{state: _ERROR for state in SpareState}, _S.OWED: _S.STARTING, _S.CLOSED: _S.CLOSED},
    "answered": {**_EVERY, _S.OWED: _S.STARTING},  # a template not owed (none, or one a session started) moves none
    "want B": {**_EVERY, _S.READY: _S.STALE},
    "want A again": {**_EVERY, _S.STALE: _S.READY},  # the confinement its child was prepared for
    "work": {_S.DORMANT: _BLOCKS, _S.STARTING: _S.STARTING, _S.READY: _BLOCKS, _S.STALE: _S.PREPARING,
             _S.PREPARING: _ERROR, _S.OWED: _BLOCKS, _S.FAILED: _S.FAILED, _S.CLOSED: _S.CLOSED},
    "ready": {**{state: _ERROR for state in SpareState}, _S.STARTING: _S.READY, _S.PREPARING: _S.READY,
              _S.CLOSED: _S.CLOSED},
    "lost": {**{state: _ERROR for state in SpareState}, _S.STARTING: _S.STARTING, _S.PREPARING: _S.STARTING,
             _S.CLOSED: _S.CLOSED},
    "failed": {**{state: _ERROR for state in SpareState}, _S.STARTING: _S.FAILED, _S.PREPARING: _S.FAILED,
               _S.CLOSED: _S.CLOSED},
    "close": {state: _S.CLOSED for state in SpareState},
}


@pytest.mark.parametrize(("start", "op"), [(start, op) for op in _OPS for start in SpareState
                                            if _EXPECTED[op][start] != _BLOCKS])
def test_every_operation_from_every_state(start: SpareState, op: str) -> None:
    life = _at(start)
    expected = _EXPECTED[op][start]
    if expected == _ERROR:
        with pytest.raises(PoolError, match=rf"lost track of its spare template \({start.value}"):
            _OPS[op](life)
    else:
        _OPS[op](life)
    assert life.state is (start if expected == _ERROR else expected)


@pytest.mark.parametrize("state", [_S.READY, _S.STALE])
def test_the_template_waiting_is_handed_out_once(state: SpareState) -> None:
    life = _at(state)
    assert life.close() is T1
    assert life.close() is None


@pytest.mark.parametrize("report", ["ready", "lost", "failed"])
def test_a_template_being_prepared_as_the_pool_closes_is_closed_by_the_thread_alone(report: str) -> None:
    """The thread is using it (CI saw both close one: the second closed numbers that were another's by then)."""
    life = _at(_S.PREPARING)
    assert life.close() is None  # not the closer's
    if report == "ready":
        assert life.ready(T1, B, True) is False  # the thread, finishing, is told to close it
    elif report == "lost":
        life.lost(B)  # the thread closed it as it failed
    else:
        assert life.failed() is T1  # the thread's to close
    assert life.state is _S.CLOSED
    assert life.close() is None and life.failed() is None


def test_a_take_once_closed_gets_none_of_the_template_the_thread_prepares() -> None:
    """The close left it to the thread, which is using it and closes it when it reports: a take then (a session
    the drain did not wait for) must not get it too, or it would have two closers again."""
    life = _at(_S.PREPARING)
    assert life.close() is None
    assert life.take() == (None, False)
    assert life.ready(T1, B, True) is False  # still the thread's to close
    assert life.take() == (None, False)


def test_a_take_gets_the_waiting_template_and_owes_the_next() -> None:
    life = _at(_S.STALE)
    assert life.take() == (T1, False)  # as it is: prepared for A, not B
    assert life.take() == (None, False)  # a second session while the first one's first step runs: its own
    life.answered(_T("its own"), None)  # the second one's template was never owed
    assert life.state is _S.OWED
    life.answered(T1, None)
    assert life.state is _S.STARTING and life.work() == (None, B)  # the next, prepared for the last want


def test_a_spare_found_dead_is_owed_nothing() -> None:
    life = _at(_S.OWED)
    with pytest.raises(PoolError, match="not the one taken"):
        life.found_dead(T2)
    life.found_dead(T1)
    assert life.state is _S.STARTING and life.work() == (None, A)


def test_a_want_that_came_while_preparing_is_prepared_next() -> None:
    life = _at(_S.PREPARING)  # for B
    life.answered(None, A2)  # confined as the child T1 held before: but that one is being replaced
    assert life.ready(T1, B, True)
    assert life.state is _S.STALE and life.work() == (T1, A2)


def test_a_want_that_cannot_be_prepared_is_forgotten_until_another_session_asks() -> None:
    life = _at(_S.PREPARING)
    assert life.ready(T1, B, False)  # a grant of B is gone: no child waits
    assert life.state is _S.READY and life.wanted is None and life.prepared_for is None
    life.answered(None, B)  # another session's first step: tried again
    assert life.state is _S.STALE


def test_a_template_lost_while_preparing_is_replaced_without_the_want() -> None:
    life = _at(_S.PREPARING)
    life.lost(B)
    assert life.state is _S.STARTING and life.work() == (None, None)  # started, no child prepared in it
    assert life.ready(T2, None, False)
    assert life.state is _S.READY


def test_a_newer_want_survives_the_failure_of_an_older_one() -> None:
    life = _at(_S.PREPARING)
    newer = _want("/c")
    life.answered(None, newer)
    life.lost(B)
    assert life.work() == (None, newer)


def _blocked(call: Callable[[], object]) -> tuple[threading.Thread, list[object]]:
    got: list[object] = []
    thread = threading.Thread(target=lambda: got.append(call()), daemon=True)
    thread.start()
    thread.join(0.2)
    assert thread.is_alive() and not got  # it waits
    return thread, got


def test_a_take_waits_while_a_child_is_prepared() -> None:
    life = _at(_S.PREPARING)
    thread, got = _blocked(life.take)
    assert life.ready(T1, B, True)
    thread.join(_WAIT)
    assert got == [(T1, False)] and life.state is _S.OWED


def test_a_take_waiting_on_a_preparation_that_fails_gets_none() -> None:
    life = _at(_S.PREPARING)
    thread, got = _blocked(life.take)
    life.lost(B)
    thread.join(_WAIT)
    assert got == [(None, False)] and life.state is _S.STARTING


@pytest.mark.parametrize("state", [_S.DORMANT, _S.READY, _S.OWED])
def test_the_thread_waits_for_work(state: SpareState) -> None:
    life = _at(state)
    thread, got = _blocked(life.work)
    if state is _S.DORMANT:
        life.close()
        expected: object = None
    elif state is _S.READY:
        life.answered(None, B)
        expected = (T1, B)
    else:
        life.answered(T1, None)
        expected = (None, A)
    thread.join(_WAIT)
    assert got == [expected]


def test_the_thread_outlives_its_templates_until_the_pool_closes() -> None:
    life = _at(_S.FAILED)
    thread, _ = _blocked(life.wait_closed)
    life.close()
    thread.join(_WAIT)
    assert not thread.is_alive()
