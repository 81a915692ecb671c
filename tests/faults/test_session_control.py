"""A session child that stops reading its control channel costs its own step, never a pool thread.

The job makes the child's loop sleep where it would receive its next step, the control channel still
open, so the next step's frame fills the socket buffer (about 208 KiB) and nobody reads it. The step must
still end at its deadline, the session with it, and the pool must still drain and exit on EOF.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.pool.pool_driver import pool_process

pytestmark = pytest.mark.timeout(60)

# The session's loop receives its steps with this function: the job's code makes it sleep instead (putting another
# socket at the control channel's number no longer does it: the child puts its channel back after each step).
_HIJACK = "import sys, time\nsys.modules['pynox.job.execute'].recv_alone = lambda control: time.sleep(3600)"
_BIG_STEP = "x = 0\n" * 60_000 + "print('big step ran')"  # about 360 KiB of code


def test_a_step_the_child_never_reads_times_out(tmp_path: Path) -> None:
    with pool_process("--workers=1", cwd=tmp_path) as pool:
        assert pool.run(_HIJACK, session="stuck")["exit"] == 0
        start = time.monotonic()
        result = pool.run(_BIG_STEP, session="stuck", timeout="1s", wait=15)
        elapsed = time.monotonic() - start
        assert result["error"]["type"] == "TimeoutError", result
        assert result["session_ended"] is True
        assert elapsed < 6, f"the step was answered after {elapsed:.1f}s"
        # The pool goes on: a new session under the same name, and a plain job.
        assert pool.run("print('again')", session="stuck")["stdout"] == "again\n"
        assert pool.run("print('plain')")["stdout"] == "plain\n"
    # pool_process: EOF, exit 0 within its deadline, nothing left running.


def test_the_same_big_step_runs_when_the_child_reads(tmp_path: Path) -> None:
    with pool_process("--workers=1", cwd=tmp_path) as pool:
        assert pool.run("pass", session="fine")["exit"] == 0
        result = pool.run(_BIG_STEP, session="fine", timeout="10s")
        assert result["stdout"] == "big step ran\n", result
