"""The zygote every template is forked from, and the templates it forked, killed from outside: the pool goes on.

Workers' and sessions' templates are forked from one zygote (server/zygote.py). The zygote reaps them and
reports each one's end (wait status, usage) to the pool, which handles a forked template's death as it does one
it started itself: replaced, counted, logged with its signal. The templates outlive the zygote: a killed zygote
takes no job and no session with it; the pool logs its death, and the next template is forked from a new one.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from tests.pool.pool_driver import (
    ZYGOTE,
    PoolProcess,
    descendants,
    pool_process,
    proc_table,
    sleeping_family,
    wait_gone,
)

pytestmark = pytest.mark.timeout(120)


def _ok(result: dict[str, Any]) -> dict[str, Any]:
    assert result["exit"] == 0 and result["error"] is None, result
    return result


def _zygote(root: int) -> int:
    table = proc_table()
    found = [pid for pid in descendants(root, table) if table[pid][3] == ZYGOTE]
    assert len(found) == 1, found
    return found[0]


def _parent(pid: int) -> int:
    return proc_table()[pid][0]


def _template_of_a_job(pool: Any) -> int:
    """The template the pool's next plain job runs on: the job's parent."""
    return int(_ok(pool.run("import os\nprint(os.getppid())"))["stdout"])


def _once(pool: Any, request_id: str) -> None:
    """Exactly one result for ``request_id``."""
    assert len(pool.responses(request_id)) == 1, pool.responses(request_id)


def test_a_killed_worker_template_is_reported_by_the_zygote_and_replaced(tmp_path: Path) -> None:
    with pool_process("--workers=1", "--log=json", cwd=tmp_path) as pool:
        template = _template_of_a_job(pool)
        zygote = _zygote(pool.pid)
        assert _parent(template) == zygote  # the case: a worker's template forked from the zygote, not the pool's
        os.kill(template, signal.SIGKILL)
        assert wait_gone([template], 10) == []
        _ok(pool.run("print(1)", id="after"))
        _once(pool, "after")
        replacement = _template_of_a_job(pool)
        assert replacement != template and _parent(replacement) == zygote
        assert pool.stats()["template_restarts"] == 1
        assert pool.finish() == 0
    died = [line["message"] for line in pool.log_lines() if line.get("event") == "template_died"]
    # Its status is the zygote's report (the pool is not its parent), with its usage beside it.
    assert len(died) == 1 and f"template {template} was killed by SIGKILL (after " in died[0], died


def test_a_killed_zygote_takes_no_job_or_session_with_it(tmp_path: Path) -> None:
    with pool_process("--workers=1", "--log=json", cwd=tmp_path) as pool:
        session_child = int(_ok(pool.run("import os\nx = 1\nprint(os.getpid())", session="a"))["stdout"])
        template = _template_of_a_job(pool)
        zygote = _zygote(pool.pid)
        os.kill(zygote, signal.SIGKILL)
        assert wait_gone([zygote], 10) == []
        # The templates it forked serve on: the worker's, and the session's with its state.
        assert _template_of_a_job(pool) == template
        step = _ok(pool.run("print(x)", session="a", id="step"))
        assert step["stdout"] == "1\n" and not step.get("session_ended"), step
        _once(pool, "step")
        assert wait_gone([session_child], 0) == [session_child]  # the control: the session's process lives
        # The worker's template killed now: the zygote that would report its status is gone, and the pool says
        # so; its replacement is forked from a new zygote.
        os.kill(template, signal.SIGKILL)
        assert wait_gone([template], 10) == []
        _ok(pool.run("print(2)", id="after"))
        _once(pool, "after")
        fresh = _template_of_a_job(pool)
        new_zygote = _zygote(pool.pid)
        assert new_zygote != zygote and _parent(fresh) == new_zygote
        assert _ok(pool.run("print('x' in dir())", session="b"))["stdout"] == "False\n"
        pool.run(session="b", close=True)
        pool.run(session="a", close=True)
        assert pool.finish() == 0
    assert wait_gone([session_child, template], 10) == []
    lines = pool.log_lines()
    zygote_died = [line["message"] for line in lines if line.get("event") == "zygote_died"]
    assert len(zygote_died) == 1 and f"the zygote {zygote} was killed by SIGKILL" in zygote_died[0], zygote_died
    died = [line["message"] for line in lines if line.get("event") == "template_died"]
    assert len(died) == 1 and f"template {template} ended after the zygote" in died[0], died


def test_templates_that_outlived_the_zygote_end_with_the_pool(tmp_path: Path) -> None:
    """No parent-death signal ties a forked template to the pool: its socket's end does, which the pool's death
    closes. The pool killed after its zygote: the templates the zygote left, their running job and session
    step, and the prepared children, are all gone within a second, as in test_kills.py."""
    pool = PoolProcess("--workers=2", cwd=tmp_path)
    try:
        sleeping_family(pool)
        family = [pid for pid in descendants(pool.pid) if pid != _zygote(pool.pid)]
        assert len(family) >= 6, family
        os.kill(_zygote(pool.pid), signal.SIGKILL)
        time.sleep(0.5)
        assert wait_gone(family, 0) == family  # the control: the zygote's death took none of them
        os.kill(pool.pid, signal.SIGKILL)
        assert wait_gone(family, 1.0) == [], "processes outlived their pool by more than a second"
    finally:
        pool.kill()
