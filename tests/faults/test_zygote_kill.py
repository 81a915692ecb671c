"""The zygote sessions' templates are forked from, killed from outside: the pool goes on.

Its forked templates die with it (their parent-death signal), and with them the sessions they serve, as a
job dies with its worker's template; the pool answers their next step as ended, and the next new session is
forked from a new zygote. Plain jobs never depended on it.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest

from tests.pool.pool_driver import ZYGOTE, descendants, pool_process, proc_table, wait_gone

pytestmark = pytest.mark.timeout(120)


def _ok(result: dict[str, Any]) -> dict[str, Any]:
    assert result["exit"] == 0 and result["error"] is None, result
    return result


def _zygote(root: int) -> int:
    table = proc_table()
    found = [pid for pid in descendants(root, table) if table[pid][3] == ZYGOTE]
    assert len(found) == 1, found
    return found[0]


def test_a_killed_zygote_ends_its_sessions_and_the_next_session_has_a_new_one(tmp_path: Path) -> None:
    with pool_process("--workers=1", cwd=tmp_path) as pool:
        child = int(_ok(pool.run("import os\nx = 1\nprint(os.getpid())", session="a"))["stdout"])
        zygote = _zygote(pool.pid)
        os.kill(zygote, signal.SIGKILL)
        assert wait_gone([zygote, child], 10) == []  # its session's process went with it
        step = pool.run("print(x)", session="a")
        # Answered, as a session whose process ended: its state is gone, and the answer says so.
        assert step["session_ended"] is True and step["exit"] != 0 and step["stdout"] == "", step
        _ok(pool.run("print(1)"))  # plain jobs never depended on it
        fresh = _ok(pool.run("print('x' in dir())", session="b"))
        assert fresh["stdout"] == "False\n"
        assert _zygote(pool.pid) != zygote
        pool.run(session="b", close=True)
