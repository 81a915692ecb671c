"""``max_sessions`` reached: new sessions are refused clearly and start no process; everything else goes on.

A slot comes back when a session is closed or ends (a crash), and only then.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tests.pool.pool_driver import PoolProcess, pool_process, proc_table, refused

pytestmark = pytest.mark.timeout(120)

LIMIT = 3


def _refused(result: dict[str, Any], name: str) -> None:
    refused(result, "max_sessions")
    assert result["session"] == name, result


def _session_templates(pool: PoolProcess, workers: list[int]) -> int:
    """Templates serving a session: with a session's child. The one started ahead for the next session has
    none (at most a child prepared for it, which serves nothing yet)."""
    parents = {ppid for ppid, _state, _start, name in proc_table().values() if name == "pynox-session"}
    return len({pid for pid in pool.templates() if pid in parents} - set(workers))


def test_max_sessions_reached(tmp_path: Path) -> None:
    with pool_process("--workers=1", f"--max-sessions={LIMIT}", cwd=tmp_path) as pool:
        workers = pool.templates()
        for i in range(LIMIT):
            assert pool.run(f"x = {i}", session=f"s{i}")["exit"] == 0
        _refused(pool.run("x = 9", session="extra"), "extra")
        # A burst of new sessions at once: every one refused, none started.
        burst = [pool.submit(session=f"burst-{i}", code="x = 1") for i in range(10)]
        for i, request_id in enumerate(burst):
            _refused(pool.result(request_id), f"burst-{i}")
        assert _session_templates(pool, workers) == LIMIT
        # The sessions there, and plain jobs, are served as before.
        assert pool.run("print(x)", session="s1")["stdout"] == "1\n"
        assert pool.run("print('plain')")["stdout"] == "plain\n"
        assert pool.stats()["sessions_active"] == LIMIT
        # Closing one frees its slot.
        assert pool.run(session="s0", close=True)["closed"] is True
        assert pool.run("print('in')", session="extra")["stdout"] == "in\n"
        # A session that ends by a crash frees its slot too.
        crashed = pool.run("import os\nos.abort()", session="s1")
        assert crashed["session_ended"] is True, crashed
        assert pool.run("x = 4", session="s4")["exit"] == 0
        _refused(pool.run("x = 5", session="s5"), "s5")
        assert pool.stats()["sessions_active"] == LIMIT
        end = time.monotonic() + 10  # the ended sessions' templates are stopped after their last answer
        while _session_templates(pool, workers) != LIMIT:
            assert time.monotonic() < end, pool.tree()
            time.sleep(0.05)
        request_errors = pool.stats()["request_errors"]
        assert request_errors == 1 + len(burst) + 1
