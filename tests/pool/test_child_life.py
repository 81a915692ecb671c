"""The child life's table of moves, directly: a cancel is kept from the moment a job is taken until it is sent."""

from __future__ import annotations

import os
import signal
import subprocess

import pytest

from pynox.errors import PoolWorkerError
from pynox.server.lifecycle import ChildLife, ChildState


def test_a_cancel_while_taken_stops_the_job_before_it_is_sent() -> None:
    life = ChildLife()
    life.take()
    assert life.cancel() is True  # kept: the job is on its way
    assert life.sent() is False  # never sent
    assert life.state is ChildState.IDLE
    life.take()  # the next job starts clean: the cancel belonged to the one before
    assert life.sent() is True


def test_a_cancel_kept_across_a_replaced_template() -> None:
    life = ChildLife()
    life.take()
    assert life.sent() is True
    life.not_sent()  # the template died before the job reached it: the job goes to a fresh one
    assert life.cancel() is True
    life.abandon()  # the dead template is closed; the job, still taken, keeps its cancel
    assert life.state is ChildState.TAKEN
    assert life.sent() is False


def test_a_cancel_is_remembered_for_the_job_taken_last() -> None:
    """A job whose prepared child died before it claimed the job is sent again, unless a cancel reached it: the
    death may be the cancel's kill (Template.run reads ``cancelled``)."""
    life = ChildLife()
    life.take()
    assert life.cancelled is False
    assert life.cancel() is True  # kept while taken
    assert life.cancelled is True
    assert life.sent() is False
    life.take()  # the next job: nothing cancelled it
    assert life.cancelled is False
    assert life.sent() is True
    with subprocess.Popen(["sleep", "30"]) as child:
        life.started(os.pidfd_open(child.pid), child.pid)
        assert life.cancel() is True  # running: killed
        assert child.wait(timeout=10) == -signal.SIGKILL
    assert life.cancelled is True
    life.abandon()  # closes its pidfd


def test_nothing_to_cancel_once_the_job_is_over() -> None:
    life = ChildLife()
    assert life.cancel() is False  # no job
    life.take()
    life.drop()  # answered without being sent (refused)
    assert life.cancel() is False
    life.take()
    assert life.sent() is True  # the drop forgot nothing it should keep


@pytest.mark.parametrize(("taken", "move"), [(False, "sent"), (False, "drop"), (False, "release"), (True, "take"),
                                             (True, "not_sent")])
def test_a_move_off_the_table_is_refused(taken: bool, move: str) -> None:
    life = ChildLife()
    if taken:
        life.take()
    with pytest.raises(PoolWorkerError, match="lost track"):
        getattr(life, move)()
