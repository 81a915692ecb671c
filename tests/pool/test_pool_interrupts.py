"""A cancel of a running session step interrupts it first (``KeyboardInterrupt``), as a notebook's interrupt does.

Within the pool's grace the session and its variables live on, and the result says ``"interrupted": true``;
past it the process is killed and the next step's result says the state is gone. The grace never extends
a step's deadline, and a job that is not a session is killed at once, as before.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from .pool_driver import PoolProcess, new_id, pool_process

pytestmark = pytest.mark.timeout(120)

_SWALLOWS = "import time\nwhile True:\n    try:\n        time.sleep(10)\n    except KeyboardInterrupt:\n        pass"


def _cancel(pool: PoolProcess, step: str, after: float = 0.5) -> float:
    """Cancel ``step`` once it has run ``after`` seconds; how long its result then took."""
    time.sleep(after)
    started = time.monotonic()
    answer = pool.result(pool.submit(cancel=step))
    assert answer.get("cancelled") == step, answer
    pool.result(step)
    return time.monotonic() - started


def _ok(result: dict[str, Any]) -> dict[str, Any]:
    assert result["exit"] == 0 and result["error"] is None, result
    return result


def test_an_interrupted_step_keeps_the_session_and_its_variables(tmp_path: Path) -> None:
    with pool_process("--workers=1", cwd=tmp_path, as_written=True) as pool:
        name = new_id("nb")
        pid = _ok(pool.run("import os\nx = 41\nprint(os.getpid())", session=name))["stdout"]
        step = pool.submit(session=name, code="x += 1\nwhile True:\n    pass")
        _cancel(pool, step)
        result = pool.result(step)
        assert result["error"]["type"] == "KeyboardInterrupt" and result["exit"] == 1, result
        assert result["interrupted"] is True and result["session_ended"] is False, result
        after = _ok(pool.run("import os\nprint(x)\nprint(os.getpid())", session=name))
        assert after["stdout"] == f"42\n{pid}", after  # the same process, its state intact
        assert "session_reopened" not in after
        pool.run(session=name, close=True)


def test_a_step_that_swallows_the_interrupt_is_killed_after_the_grace(tmp_path: Path) -> None:
    with pool_process("--workers=1", "--interrupt-grace=400ms", cwd=tmp_path, as_written=True) as pool:
        name = new_id("nb")
        _ok(pool.run("x = 1", session=name))
        step = pool.submit(session=name, code=_SWALLOWS)
        took = _cancel(pool, step)
        result = pool.result(step)
        assert result["error"]["type"] == "CancelledError" and result["session_ended"] is True, result
        assert "400ms" in result["error"]["message"] and "interrupted" not in result, result
        assert took >= 0.4, took  # not before its grace
        fresh = pool.run("print('x' in dir())", session=name)
        assert fresh["stdout"] == "False\n" and fresh["step"] == 1, fresh
        assert "cancelled" in fresh["session_reopened"], fresh
        pool.run(session=name, close=True)


def test_a_step_whose_code_gave_the_interrupt_its_default_action_is_cancelled_not_a_crash(tmp_path: Path) -> None:
    # The step's code reset the pool's interrupt signal to SIG_DFL (a real-time signal's default ends the process):
    # the cancel's own signal ended it. That is the client's cancel, as a kill past the grace is; it was answered
    # as a crash ("SignalError: the process was killed by signal 36") and the next step's note blamed the step.
    with pool_process("--workers=1", cwd=tmp_path, as_written=True) as pool:
        name = new_id("nb")
        _ok(pool.run("import signal\nfor n in range(signal.SIGRTMIN, signal.SIGRTMAX + 1):\n"
                     "    signal.signal(n, signal.SIG_DFL)\nx = 1", session=name))
        step = pool.submit(session=name, code="import time\ntime.sleep(30)")
        _cancel(pool, step)
        result = pool.result(step)
        assert result["error"]["type"] == "CancelledError" and result["exit"] == 130, result
        assert result["session_ended"] is True and "interrupted" not in result, result
        fresh = pool.run("print('x' in dir())", session=name)
        assert fresh["stdout"] == "False\n" and "cancelled" in fresh["session_reopened"], fresh
        pool.run(session=name, close=True)


def test_the_deadline_holds_while_a_grace_is_pending(tmp_path: Path) -> None:
    """No code runs after its deadline: a 1 s step cancelled at 0.7 s, with 10 s of grace, ends at 1 s."""
    (tmp_path / "out").mkdir()
    beat = tmp_path / "out" / "beat"
    code = ("import time\nwhile True:\n    try:\n        while True:\n"
            "            open('out/beat', 'a').write('.')\n            time.sleep(0.02)\n"
            "    except KeyboardInterrupt:\n        pass")
    with pool_process("--workers=1", "--interrupt-grace=10s", cwd=tmp_path, as_written=True) as pool:
        name = new_id("nb")
        _ok(pool.run("x = 1", session=name, allow_write=["out"]))
        started = time.monotonic()
        step = pool.submit(session=name, code=code, timeout="1s")
        time.sleep(0.7)
        pool.result(pool.submit(cancel=step))
        result = pool.result(step)
        took = time.monotonic() - started
        assert result["error"]["type"] == "TimeoutError" and result["session_ended"] is True, result
        assert took < 5, took  # the deadline, not the grace
        size = beat.stat().st_size
        time.sleep(0.5)
        assert beat.stat().st_size == size, "the step went on writing after its deadline"


def test_a_plain_jobs_cancel_still_kills_it_at_once(tmp_path: Path) -> None:
    with pool_process("--workers=1", "--interrupt-grace=10s", cwd=tmp_path, as_written=True) as pool:
        job = pool.submit(code=_SWALLOWS)
        took = _cancel(pool, job)
        result = pool.result(job)
        assert result["error"]["type"] == "CancelledError" and "interrupted" not in result, result
        assert took < 5, took


def test_a_step_cancelled_while_it_waits_behind_another_never_runs_and_the_session_lives_on(
        tmp_path: Path) -> None:
    with pool_process("--workers=1", cwd=tmp_path, as_written=True) as pool:
        name = new_id("nb")
        _ok(pool.run("x = 1", session=name))
        running = pool.submit(session=name, code="import time\ntime.sleep(1)")
        waiting = pool.submit(session=name, code="x = 'ran'")
        pool.result(pool.submit(cancel=waiting))
        result = pool.result(waiting)
        assert result["error"]["type"] == "CancelledError" and result["session_ended"] is False, result
        _ok(pool.result(running))
        assert _ok(pool.run("print(x)", session=name))["stdout"] == "1\n"
        pool.run(session=name, close=True)


def test_an_interrupt_while_a_later_step_displays_keeps_its_outputs_whole_and_its_report(tmp_path: Path) -> None:
    """A later step's display frames share its report pipe: an interrupt that comes while a frame is written
    waits until the frame is whole (then raises), so the report after it is still read and the session lives."""
    with pool_process("--workers=1", cwd=tmp_path, as_written=True) as pool:
        name = new_id("nb")
        _ok(pool.run("x = 1", session=name))
        # Frames of 1 MB, the display budget reset before each (the pool still bounds what it keeps): most of
        # the step is spent writing frames, so the interrupt most often comes in the middle of one.
        step = pool.submit(session=name, code="import sys\nshow = sys.modules['pynox.job.display']\nwhile True:\n"
                           "    show.begin(1 << 40)\n    display({'text/plain': 'y' * (1 << 20)}, raw=True)")
        _cancel(pool, step, after=0.3)
        result = pool.result(step)
        assert result["error"]["type"] == "KeyboardInterrupt" and result["interrupted"] is True, result
        assert result["session_ended"] is False, result
        notes = [output["data"]["text/plain"] for output in result["outputs"]
                 if output["data"]["text/plain"] != "y" * (1 << 20)]
        assert notes and not [note for note in notes if "left out" not in note or "cut short" in note], notes
        assert _ok(pool.run("print(x)", session=name))["stdout"] == "1\n"
        pool.run(session=name, close=True)


# The session's child holds the next step between taking it and running its code: as it files the step's source
# for tracebacks (job/execute.py, before the step's code may be interrupted), it says so on its stdout and sleeps.
# (Only the step's own source, named in its argv by then: not a file a traceback's formatting files.)
_SLOW_START = ("import linecache, os, sys, time\nclass _Slow(dict):\n    def __setitem__(self, key, value):\n"
               "        if key == sys.argv[0]:\n            os.write(1, b'taken\\n')\n            time.sleep(1.5)\n"
               "        super().__setitem__(key, value)\nlinecache.cache = _Slow(linecache.cache)")


def test_a_cancel_that_comes_before_the_steps_code_runs_interrupts_it_as_it_starts(tmp_path: Path) -> None:
    """The pool has sent the step; its process has it and has not begun its code (under load, a step's start
    takes that long): the interrupt came where the child drops it, and the step ran on to be killed past its
    grace, its session ended, as though it had swallowed a KeyboardInterrupt it never saw. The interrupt is
    sent again until the step takes it: the step's code is interrupted as it starts, its session lives on. The
    window is held open from inside (the session's first step slows the next one's start); the control: the
    same step, left alone, runs its code."""
    with pool_process("--workers=1", "--interrupt-grace=5s", cwd=tmp_path, as_written=True) as pool:
        name = new_id("nb")
        _ok(pool.run("x = 1\n" + _SLOW_START, session=name))
        control = _ok(pool.run("print('ran')", session=name))
        assert control["stdout"] == "taken\nran\n", control
        step = pool.submit(session=name, code="while True:\n    pass", stream=True)
        pool.wait_for(lambda m: m.get("id") == step and m.get("event") == "stream")  # it has the step: "taken"
        result = pool.result(pool.result(pool.submit(cancel=step))["cancelled"], timeout=30)
        assert result["error"]["type"] == "KeyboardInterrupt" and result["interrupted"] is True, result
        assert result["session_ended"] is False, result
        assert _ok(pool.run("print(x)", session=name))["stdout"] == "taken\n1\n"
        pool.run(session=name, close=True)
