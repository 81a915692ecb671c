"""pynox.server.shutdown: how a pool ends, as one table of moves, driven directly (no pool, no signals)."""

from __future__ import annotations

import threading

import pytest

from pynox.server.shutdown import Shutdown, Stage

pytestmark = pytest.mark.pure


class _Recorder:
    def __init__(self, drain_timeout: float = 60.0) -> None:
        self.drains = 0
        self.stops: list[str] = []
        self.stopped = threading.Event()
        self.machine = Shutdown(drain_timeout, on_drain=self._drain, on_stop=self._stop)

    def _drain(self) -> None:
        self.drains += 1

    def _stop(self, reason: str) -> None:
        self.stops.append(reason)
        self.stopped.set()


def test_eof_finishes_without_refusing_and_a_signal_then_drains() -> None:
    rec = _Recorder()
    rec.machine.input_ended()
    assert rec.machine.stage is Stage.FINISHING and not rec.machine.refusing() and rec.drains == 1
    rec.machine.signalled("SIGTERM")
    assert rec.machine.stage is Stage.DRAINING and rec.machine.refusing()
    assert rec.drains == 1 and rec.stops == []  # the drain runs once; the signal only armed the deadline
    rec.machine.cancel_deadline()


def test_a_second_signal_stops_once_and_says_why() -> None:
    rec = _Recorder()
    rec.machine.signalled("SIGTERM")
    assert rec.machine.stage is Stage.DRAINING and "SIGTERM" in rec.machine.why()
    rec.machine.signalled("SIGINT")
    rec.machine.signalled("SIGTERM")
    rec.machine.input_ended()
    assert rec.machine.stage is Stage.STOPPING and rec.drains == 1
    assert len(rec.stops) == 1 and "second SIGINT" in rec.stops[0] and "(SIGTERM)" in rec.stops[0]
    rec.machine.cancel_deadline()


def test_the_deadline_stops_the_drain() -> None:
    rec = _Recorder(drain_timeout=0.05)
    rec.machine.signalled("SIGTERM")
    assert rec.stopped.wait(5)
    assert rec.machine.stage is Stage.STOPPING and "drain deadline of 50ms passed" in rec.stops[0]


def test_a_drain_that_ended_in_time_is_never_stopped() -> None:
    rec = _Recorder(drain_timeout=0.05)
    rec.machine.signalled("SIGTERM")
    rec.machine.cancel_deadline()
    assert not rec.stopped.wait(0.3)
    assert rec.machine.stage is Stage.DRAINING
