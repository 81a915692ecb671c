"""A flight's table of moves, directly (no pool): every legal move, each refusal, and exactly one answer."""

from __future__ import annotations

import pytest

from pynox.errors import PoolError, RequestError
from pynox.server.flights import CLIENT_CANCELLED, Cancel, Flight, Flights, FlightState

pytestmark = pytest.mark.pure


def _running(kill_works: bool = True) -> tuple[Flight, list[int]]:
    kills: list[int] = []

    def kill() -> bool:
        kills.append(1)
        return kill_works

    flight = Flight("a")
    assert flight.start(kill) is True
    assert flight.state is FlightState.RUNNING
    return flight, kills


def test_queued_then_running_then_answered_once() -> None:
    flight, kills = _running()
    assert flight.cancelled is None
    assert flight.answer() is True
    assert flight.state is FlightState.ANSWERED
    assert flight.answer() is False  # one result only
    assert flight.cancel() is Cancel.FINISHED
    assert flight.stop("shutdown") is False
    assert kills == []  # nothing answered is killed


def test_a_cancel_while_queued_answers_it_and_it_never_starts() -> None:
    flight = Flight("a")
    assert flight.cancel() is Cancel.QUEUED
    assert flight.state is FlightState.ANSWERED
    assert flight.answered
    assert flight.start(lambda: True) is False  # its worker drops it
    assert flight.answer() is False  # and sends nothing
    assert flight.cancel() is Cancel.FINISHED


def test_a_queued_flight_may_be_answered_without_running() -> None:
    flight = Flight("a")  # a session's step refused as its session ended
    assert flight.answer() is True
    assert flight.state is FlightState.ANSWERED


def test_a_cancel_while_running_kills_it_and_its_worker_answers() -> None:
    flight, kills = _running()
    assert flight.cancel() is Cancel.RUNNING
    assert kills == [1]
    assert flight.state is FlightState.KILLED
    assert flight.cancelled == CLIENT_CANCELLED
    assert flight.cancel() is Cancel.FINISHED  # killed once
    assert flight.stop("shutdown") is False
    assert kills == [1]
    assert flight.answer() is True
    assert flight.state is FlightState.ANSWERED
    assert flight.cancelled == CLIENT_CANCELLED  # its result still says why


def test_the_shutdown_kills_a_running_flight_and_leaves_a_queued_one() -> None:
    queued = Flight("q")
    assert queued.stop("the drain deadline passed") is False
    assert queued.state is FlightState.QUEUED
    flight, kills = _running()
    assert flight.stop("the drain deadline passed") is True
    assert flight.state is FlightState.KILLED
    assert flight.cancelled == "the drain deadline passed"
    assert kills == [1]


def test_a_cancel_after_its_process_ended_leaves_its_result_standing() -> None:
    flight, kills = _running(kill_works=False)
    assert flight.cancel() is Cancel.FINISHED
    assert flight.stop("shutdown") is False
    assert kills == [1, 1]
    assert flight.state is FlightState.RUNNING
    assert flight.cancelled is None
    assert flight.answer() is True


@pytest.mark.parametrize("killed", [False, True])
def test_starting_twice_is_refused(killed: bool) -> None:
    flight, _ = _running()
    if killed:
        flight.cancel()
    with pytest.raises(PoolError, match="lost track"):
        flight.start(lambda: True)


def test_a_session_steps_cancel_interrupts_it_and_its_session_answers() -> None:
    interrupts: list[int] = []
    kills: list[int] = []
    flight = Flight("a")
    assert flight.start(lambda: kills.append(1) is None, lambda: interrupts.append(1) is None) is True
    assert flight.cancel() is Cancel.INTERRUPTED
    assert (interrupts, kills) == ([1], [])
    assert flight.state is FlightState.INTERRUPTED and flight.interrupted and flight.cancelled is None
    assert flight.cancel() is Cancel.FINISHED  # interrupted once
    assert flight.answer() is True and flight.state is FlightState.ANSWERED


def test_the_shutdown_still_kills_an_interrupted_step() -> None:
    kills: list[int] = []
    flight = Flight("a")
    flight.start(lambda: kills.append(1) is None, lambda: True)
    assert flight.cancel() is Cancel.INTERRUPTED
    assert flight.stop("the pool is stopping") is True
    assert kills == [1] and flight.state is FlightState.KILLED and flight.cancelled == "the pool is stopping"


def test_an_interrupt_of_a_step_that_is_over_changes_nothing() -> None:
    flight = Flight("a")
    flight.start(lambda: True, lambda: False)
    assert flight.cancel() is Cancel.FINISHED
    assert flight.state is FlightState.RUNNING


def test_a_cancel_of_an_id_acknowledges_once_then_answers_its_queued_flights() -> None:
    """``{"cancel": ID}`` ends every flight with that id: the cancel's answer first, then the result of each one it
    answered while queued; a running one is killed (its worker answers it)."""
    told: list[str] = []
    flights = Flights()
    queued = Flight("a")
    queued.answer_cancelled = lambda: told.append("queued answered")
    running, kills = _running()
    other = Flight("b")
    for flight in (queued, running, other):
        flights.add(flight)
    flights.cancel("a", lambda: told.append("cancel answered"))
    assert told == ["cancel answered", "queued answered"]
    assert queued.state is FlightState.ANSWERED and running.state is FlightState.KILLED and kills == [1]
    assert other.state is FlightState.QUEUED  # another id is none of its business


def test_a_cancel_that_ends_nothing_is_refused_and_answers_nothing() -> None:
    """No flight with the id, or only ones whose result is out: the cancel is refused (RequestError), and neither
    it nor any flight is answered. The control: the same flight, still queued, is cancelled."""
    told: list[str] = []
    flights = Flights()
    with pytest.raises(RequestError, match="no queued or running job has the id 'a'"):
        flights.cancel("a", lambda: told.append("cancel answered"))
    done = Flight("a")
    flights.add(done)
    assert done.start(lambda: True) and done.answer()
    with pytest.raises(RequestError):
        flights.cancel("a", lambda: told.append("cancel answered"))
    assert told == []
    queued = Flight("a")
    flights.add(queued)
    flights.cancel("a", lambda: told.append("cancel answered"))
    assert told == ["cancel answered"] and queued.state is FlightState.ANSWERED
