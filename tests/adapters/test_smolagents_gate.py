"""PynoxExecutor's call gate, directly (no pool, no agent): its table of moves, what each state lets through.

The gate decides whether a call from the sandbox reaches a tool: only while a step runs that gave no final
answer. Driven here as the executor drives it, move by move; the agent-level behaviour (a final answer
shuts later calls out, a thread left behind reaches nothing) is tested through real sessions in
test_smolagents.py.
"""

from __future__ import annotations

import threading

import pytest

import pynox
from pynox_smolagents._gate import CallGate, Gate

pytestmark = pytest.mark.pure

_ANSWERED = "already gave its final answer"
_OVER = "the step that started this thread is over"


def _at(state: Gate) -> CallGate:
    gate = CallGate()
    if state is not Gate.OVER:
        gate.begin_step()
    if state in (Gate.ANSWERING, Gate.ANSWERED):
        gate.enter("final_answer", answers=True)
    if state is Gate.ANSWERED:
        assert gate.end_step(0) is False  # the final_answer call is still in flight
    assert gate.state is state
    return gate


@pytest.mark.parametrize(("state", "refusal"), [(Gate.OVER, _OVER), (Gate.OPEN, None),
                                                (Gate.ANSWERING, _ANSWERED), (Gate.ANSWERED, _ANSWERED)])
def test_what_each_state_lets_through(state: Gate, refusal: str | None) -> None:
    gate = _at(state)
    before = gate.in_flight
    if refusal is None:
        gate.check("search")
        gate.enter("search", answers=False)
        assert gate.in_flight == before + 1
        gate.leave(refused_answer=False)
        with gate.admitted("pynox_step_value"):
            pass
    else:
        with pytest.raises(pynox.HostError, match=refusal):
            gate.check("search")
        with pytest.raises(pynox.HostError, match=refusal):
            gate.enter("search", answers=False)
        with pytest.raises(pynox.HostError, match=refusal), gate.admitted("pynox_step_value"):
            raise AssertionError("admitted a call the gate refuses")
        assert gate.in_flight == before  # a refused call is not counted
    assert gate.state is state


def test_a_step_that_answers() -> None:
    gate = CallGate()
    assert gate.state is Gate.OVER
    gate.begin_step()
    assert gate.state is Gate.OPEN
    gate.enter("final_answer", answers=True)
    assert gate.state is Gate.ANSWERING
    gate.leave(refused_answer=False)
    assert gate.end_step(0) is True
    assert gate.state is Gate.ANSWERED
    gate.begin_step()  # the next step opens it again
    assert gate.state is Gate.OPEN


def test_a_refused_final_answer_lets_the_step_go_on() -> None:
    gate = _at(Gate.ANSWERING)
    gate.leave(refused_answer=True)
    assert gate.state is Gate.OPEN
    gate.enter("final_answer", answers=True)  # it may answer again
    assert gate.state is Gate.ANSWERING


def test_a_final_answer_refused_after_its_step_ended() -> None:
    gate = _at(Gate.ANSWERED)
    gate.leave(refused_answer=True)
    assert gate.state is Gate.OVER  # no answer was given after all: a late call is refused as over
    assert gate.in_flight == 0


@pytest.mark.parametrize("state", [Gate.OPEN, Gate.OVER])
def test_a_refused_answer_of_an_earlier_step_moves_nothing(state: Gate) -> None:
    gate = _at(Gate.ANSWERED)
    gate.begin_step()  # the tool outlived its step, and the next step began
    if state is Gate.OVER:
        assert gate.end_step(0) is False
    gate.leave(refused_answer=True)
    assert gate.state is state


def test_the_step_waits_for_its_calls_in_flight() -> None:
    gate = _at(Gate.OPEN)
    gate.enter("search", answers=False)
    threading.Timer(0.05, gate.leave, kwargs={"refused_answer": False}).start()
    assert gate.end_step(5) is True
    assert gate.in_flight == 0


@pytest.mark.parametrize(("state", "move"), [(Gate.OPEN, "begin_step"), (Gate.ANSWERING, "begin_step"),
                                             (Gate.OVER, "end_step"), (Gate.ANSWERED, "end_step")])
def test_a_move_off_the_table_is_refused(state: Gate, move: str) -> None:
    gate = _at(state)
    with pytest.raises(RuntimeError, match=f"lost track of its step's calls \\({state.value}: "):
        getattr(gate, move)(*([0] if move == "end_step" else []))
    assert gate.state is state
