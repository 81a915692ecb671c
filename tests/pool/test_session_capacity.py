"""What idle sessions cost, seen from outside: the proportional set size of the pool's processes.

Every session's template is forked from the pool's zygote (server/zygote.py), so the pages of the warm
interpreter are shared: an idle session costs what its template and child wrote since, a few MiB, where a
template started by exec for each cost 12-13 MiB with nothing preloaded. A pool holds a dozen descriptors per
session; the 70th session or so used to get numbers ``select`` refuses, and its step failed. Nor does an idle
pool wake itself much: a look on a timer costs the pool's CPU at every step of a busy session too.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.harness import procfs

from .pool_driver import ZYGOTE, descendants, pool_process, proc_table, refused, wait_gone

pytestmark = pytest.mark.timeout(180)

_SESSIONS = 100
_MIB_PER_IDLE_SESSION = 8  # measured: about 4.5 MiB with nothing preloaded, 5 with pandas


def _ok(result: dict[str, Any]) -> dict[str, Any]:
    assert result["exit"] == 0 and result["error"] is None, result
    return result


def _pss_mib(root: int) -> float:
    """Pss of ``root`` and every process below it: shared pages count once, split between their sharers."""
    total = 0
    for pid in [root, *descendants(root)]:
        try:
            rollup = procfs.read(pid, "smaps_rollup").splitlines()
            total += next(int(line.split()[1]) for line in rollup if line.startswith("Pss:"))
        except (OSError, StopIteration):
            continue  # it ended while we looked
    return total / 1024


def test_a_hundred_idle_sessions_cost_a_few_mib_each() -> None:
    with pool_process("--workers=1", f"--max-sessions={_SESSIONS}") as pool:
        _ok(pool.run("x = 0", session="warm"))  # the zygote and the template waiting ahead are started
        pool.run(session="warm", close=True)
        time.sleep(0.5)
        before = _pss_mib(pool.pid)
        names = [f"idle{index}" for index in range(_SESSIONS)]
        for name in names:
            _ok(pool.run("x = 0", session=name))
        assert pool.stats()["sessions_active"] == _SESSIONS
        per_session = (_pss_mib(pool.pid) - before) / _SESSIONS
        assert per_session <= _MIB_PER_IDLE_SESSION, per_session
        # Every session still answers, with its own state (the first one opened, the last one).
        for name in (names[0], names[-1]):
            assert _ok(pool.run(f"x += 1\nprint(x, {name!r})", session=name))["stdout"] == f"1 {name}\n"
        refused(pool.run("x = 0", session="one-too-many"), "max_sessions")
        for name in names:
            pool.submit(session=name, close=True)
        deadline = time.monotonic() + 60
        while pool.stats()["sessions_active"]:
            assert time.monotonic() < deadline
            time.sleep(0.1)


def test_an_idle_forked_session_is_closed_and_its_processes_end_but_not_the_zygote() -> None:
    with pool_process("--workers=1", "--session-idle=1s", "--max-sessions=1") as pool:
        _ok(pool.run("x = 1", session="first"))
        tree = pool.tree()
        table = proc_table()  # after the tree: a child forked meanwhile (prepared ahead) is in this table too
        child = next(pid for pid, depth in tree.items()
                     if depth == 2 and pid in table and table[pid][3] == "pynox-session")
        template = table[child][0]
        zygote = table[template][0]
        assert table[zygote][3] == ZYGOTE, table[zygote]
        # Its one slot is taken until the idle close frees it.
        refused(pool.run("y = 1", session="second"), "max_sessions")
        assert wait_gone([child, template], 10) == []
        assert pool.stats()["sessions_active"] == 0
        fresh = _ok(pool.run("print('x' in dir())", session="second"))
        assert fresh["stdout"] == "False\n"
        assert proc_table()[zygote][3] == ZYGOTE  # the zygote outlives the sessions it forked templates for
        pool.run(session="second", close=True)


def _woken(pid: int) -> int:
    """How often the threads of ``pid`` have gone to sleep and been woken (their voluntary context switches)."""
    total = 0
    for task in procfs.tasks(pid):
        try:
            total += procfs.status_number(f"{pid}/task/{task}", "voluntary_ctxt_switches")
        except OSError:
            continue  # a thread that ended meanwhile
    return total


def test_an_idle_pool_with_its_zygote_wakes_about_once_a_second() -> None:
    """The zygote's watch (server/zygote.py) waits for a report or a wake-up, never on a timer: it looked five
    times a second. What is left is the idle sessions' reaper, once a second."""
    with pool_process("--workers=1") as pool:
        _ok(pool.run("x = 0", session="warm"))  # the zygote and its watch are started
        assert len([pid for pid in descendants(pool.pid) if proc_table()[pid][3] == ZYGOTE]) == 1
        time.sleep(0.5)
        before = _woken(pool.pid)
        time.sleep(3.0)
        woken = _woken(pool.pid) - before
        assert woken <= 6, f"the pool's threads were woken {woken} times in 3 s while it was idle"
        _ok(pool.run("x += 1\nprint(x)", session="warm"))
