"""Regressions the soak found: what one cycle leaks, a thousand cycles turn into an outage.

Each test repeats one way a child or a template ends, then compares the idle
pool's descriptors with those it had before, by kind (a pool that holds one
pidfd more per closed session runs out of descriptors after ~1,000 sessions).
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.harness import procfs
from tests.pool.pool_driver import (
    PREPARED_PER_WORKER,
    READY_CHILD,
    PoolProcess,
    descendants,
    pool_process,
    prepared_for_a_session,
    proc_table,
)

from .driver import idle_snapshot

pytestmark = pytest.mark.timeout(120)

PIDFD = "anon_inode:[pidfd]"


def _without_pidfds(kinds: Counter[str]) -> tuple[Counter[str], int]:
    kinds = Counter(kinds)
    held = kinds.pop(PIDFD, 0)
    return kinds, held


def _pidfds_of(pid: int) -> dict[int, str]:
    """The process each pidfd the pool holds points at (pid and command name), for a failure's message."""
    table = proc_table()
    return {fd: f"{target} {table[target][3] if target in table else '(gone)'}"
            for fd, target in procfs.pidfd_targets(pid).items()}


def _spare_prepared(pool: PoolProcess) -> None:
    """Wait until the template waiting for the next session holds the child it confines for it (made once a
    session's first step was answered): the pool then holds that child's control socket, in both snapshots."""
    end = time.monotonic() + 20
    while True:
        table = proc_table()
        if any(table[pid][3] == READY_CHILD and prepared_for_a_session(pid) for pid in descendants(pool.pid, table)):
            return
        assert time.monotonic() < end, "no child was prepared for the next session"
        time.sleep(0.02)


def test_sessions_however_they_end_leave_no_descriptor_in_the_pool(tmp_path: Path) -> None:
    """Finding 1: a session closed by ``close``, by the idle timer or with the pool kept the pidfd of its child."""
    with pool_process("--workers=1", "--session-idle=1s", cwd=tmp_path) as pool:
        assert pool.run("print(1)")["exit"] == 0
        # The first session makes the pool keep a template waiting for the next one: measured from then on.
        assert pool.run("x = 1", session="first")["exit"] == 0
        assert pool.run(session="first", close=True)["closed"] is True
        _spare_prepared(pool)
        before, _ = _without_pidfds(idle_snapshot(pool, 1).pool_fds)
        for i in range(8):
            assert pool.run("x = 1", session=f"closed-{i}")["exit"] == 0
            assert pool.run(session=f"closed-{i}", close=True)["closed"] is True
        for i in range(4):
            assert pool.run("x = 1", session=f"idle-{i}")["exit"] == 0
        for i in range(4):
            assert pool.run("x = 1", session=f"crashed-{i}")["exit"] == 0
            assert pool.run("import os\nos.abort()", session=f"crashed-{i}")["session_ended"] is True
        end = time.monotonic() + 20
        while pool.stats()["sessions_active"]:
            assert time.monotonic() < end, "idle sessions were never closed"
            time.sleep(0.2)
        _spare_prepared(pool)
        after, held = _without_pidfds(idle_snapshot(pool, 1).pool_fds)
        assert after == before, f"descriptors before {before}, after {after}"
        # The pidfds of the children prepared ahead of the worker's next job, the pool's handles on the worker's
        # template and on the session template waiting for the next session (both forked from the zygote: a
        # pidfd each, see zygote.py), and that of the child it confined ahead for that session (see
        # sessions._SpareTemplate).
        assert held <= PREPARED_PER_WORKER + 3, _pidfds_of(pool.pid)


def test_a_template_killed_mid_job_leaves_no_descriptor_in_the_pool(tmp_path: Path) -> None:
    """Finding 1, second path: the pidfd of the job a dead template was serving went with the template."""
    with pool_process("--workers=1", cwd=tmp_path) as pool:
        assert pool.run("print(1)")["exit"] == 0
        before, _ = _without_pidfds(idle_snapshot(pool, 1).pool_fds)
        for round_ in range(4):
            # This job's own marker says it runs: a process of the job before it (answered, not yet
            # reaped) would make a process count say so too early.
            marker = tmp_path / f"running-{round_}"
            request_id = pool.submit(code=f"open({str(marker)!r}, 'w').close()\nimport time\ntime.sleep(30)",
                                     allow_write=[str(tmp_path)])
            end = time.monotonic() + 10
            while not marker.exists():
                assert time.monotonic() < end, "the job never started"
                time.sleep(0.02)
            (template,) = pool.templates()
            os.kill(template, signal.SIGKILL)
            assert pool.result(request_id)["error"]["type"] == "PoolWorkerError"
            assert pool.run("print('replaced')")["stdout"] == "replaced\n"
        after, held = _without_pidfds(idle_snapshot(pool, 1).pool_fds)
        assert after == before, f"descriptors before {before}, after {after}"
        # The children prepared ahead of the next job, and the worker's template (forked from the zygote).
        assert held <= PREPARED_PER_WORKER + 1, _pidfds_of(pool.pid)
