"""A job's outcome, directly (no pool): the verdict taken once as what was gathered is frozen, and where the
result says the traceback begins in stderr."""

from __future__ import annotations

import signal
import time

import pytest

from pynox.protocol import Request
from pynox.server.jobs import to_job
from pynox.server.outcome import Gathering, traceback_at
from pynox.wire.exits import CANCELLED_EXIT, SETUP_FAILED_EXIT, TIMEOUT_EXIT, WORKER_ERROR_EXIT
from pynox.wire.spec import ErrorInfo, Frame

pytestmark = pytest.mark.pure

SPEC, _ = to_job(Request(code="pass"), cwd="/", runtime_paths=[])
RAISED = ErrorInfo(type="KeyError", message="'k'", file="agent.py", line=2,
                   traceback=[Frame(file="agent.py", line=2, source="d['k']")])


def test_what_was_gathered_is_frozen_once_and_stays() -> None:
    gathered = Gathering(exit=1, error=RAISED)
    gathered.stdout += b"out"
    outcome = gathered.freeze(SPEC, 1.0)
    gathered.stdout += b" more"
    gathered.exit = 0
    assert (outcome.stdout, outcome.exit, outcome.error) == (b"out", 1, RAISED)  # a copy, not a view
    with pytest.raises(AttributeError):  # a frozen struct: msgspec says "immutable type"
        outcome.exit = 0  # type: ignore[misc]  # the point: it cannot be changed


# The pool's verdicts, in the order they outrank each other; each over the job's own word (RAISED).
@pytest.mark.parametrize(("pool_saw", "exit", "error_type"), [
    ({"cancelled": "the client cancelled the job", "timed_out": True}, CANCELLED_EXIT, "CancelledError"),
    ({"protocol_violation": "it stopped reading", "timed_out": True}, WORKER_ERROR_EXIT, "PoolWorkerError"),
    ({"timed_out": True, "memory_exceeded": True}, TIMEOUT_EXIT, "TimeoutError"),
    ({"signal": signal.SIGXCPU}, TIMEOUT_EXIT, "TimeoutError"),
    ({"memory_exceeded": True, "setup_error": "no"}, 1, "MemoryError"),
    ({"setup_error": "could not apply the policy"}, SETUP_FAILED_EXIT, "SandboxSetupError"),
    ({"signal": signal.SIGSEGV, "exit": 139}, 139, "SignalError"),
    ({}, 1, "KeyError"),
])
def test_the_verdict_is_the_pools_and_taken_once(pool_saw: dict[str, object], exit: int, error_type: str) -> None:
    gathered = Gathering(exit=1, error=RAISED)
    for name, value in pool_saw.items():
        setattr(gathered, name, value)
    outcome = gathered.freeze(SPEC, 1.0)
    assert (outcome.exit, outcome.error.type if outcome.error else None) == (exit, error_type)


# A budget kill is counted (budget_kills) only where the result says it: a verdict that outranks it is told instead.
@pytest.mark.parametrize(("pool_saw", "counted", "error_type"), [
    ({}, "ops", "MemoryError"),
    ({"timed_out": True}, None, "TimeoutError"),
    ({"signal": signal.SIGXCPU}, None, "TimeoutError"),
    ({"protocol_violation": "it stopped reading"}, None, "PoolWorkerError"),
    ({"cancelled": "the client cancelled the job"}, None, "CancelledError"),
])
def test_a_budget_kill_is_counted_only_when_the_verdict_says_it(pool_saw: dict[str, object], counted: str | None,
                                                                 error_type: str) -> None:
    gathered = Gathering(signal=signal.SIGKILL, memory_exceeded=True, budget=("ops", 384 << 20))
    for name, value in pool_saw.items():
        setattr(gathered, name, value)
    error = gathered.freeze(SPEC, 1.0).error
    assert gathered.budget_killed == counted
    assert error is not None and error.type == error_type
    assert ("memory budget" in error.message) == (counted is not None), error.message


def test_a_cancel_before_the_job_reached_a_process_says_nothing_of_it_ran() -> None:
    outcome = Gathering(handed_over=False, cancelled="the client cancelled the job").freeze(SPEC, 1.0)
    assert outcome.error is not None and outcome.error.message.endswith("nothing of it ran")


CHAIN = ("WARNING:root:before\n"
         "Traceback (most recent call last):\n  File \"agent.py\", line 2, in <module>\nValueError: inner\n"
         "\nDuring handling of the above exception, another exception occurred:\n\n"
         "Traceback (most recent call last):\n  File \"agent.py\", line 4, in <module>\nKeyError: 'outer'\n")


@pytest.mark.parametrize(("stderr", "error", "at"), [
    (CHAIN, RAISED, len("WARNING:root:before\n")),  # the whole chain, not only its last traceback
    ("logged\n  File \"agent.py\", line 1\n    x = (1,\n        ^\nSyntaxError: '(' was never closed\n",
     RAISED, len("logged\n")),  # a SyntaxError's has no stack: it starts at its file and line
    ("only what the code wrote\n", RAISED, None),  # cut by max_output before it, say
    (CHAIN, ErrorInfo(type="TimeoutError", message="late"), None),  # the pool's own error has no traceback
    (CHAIN, None, None),
])
def test_where_the_traceback_begins(stderr: str, error: ErrorInfo | None, at: int | None) -> None:
    assert traceback_at(stderr, error) == at
    if at is not None:
        assert stderr[at:].lstrip().startswith(("Traceback", "File"))


def test_where_a_long_chain_begins_is_found_in_one_pass() -> None:
    """Each traceback of a chain was looked for again among all of them, in the pool: 5,000 links (0.8 MB of stderr,
    within the default max_output) took 0.5 s of its CPU, 20,000 took 7.9 s; one pass takes milliseconds."""
    link = ("Traceback (most recent call last):\n  File \"agent.py\", line 4, in <module>\nValueError: 1\n"
            "\nThe above exception was the direct cause of the following exception:\n\n")
    last = "Traceback (most recent call last):\n  File \"agent.py\", line 5\nKeyError: 2\n"
    stderr = "before\n" + link * 40_000 + last
    start = time.process_time()
    assert traceback_at(stderr, RAISED) == len("before\n")
    assert time.process_time() - start < 5
