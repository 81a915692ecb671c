"""SIGKILL and SIGSTOP from outside: templates, jobs, session children, prepared children, the pool itself.

A kill costs at most the one job the killed process was serving; that job gets
one clear answer, every other request gets its normal one, and the pool goes
on serving with replaced templates. When the pool itself dies, nothing it
started outlives it by more than a second.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.pool.pool_driver import (
    PREPARED_PER_WORKER,
    PoolProcess,
    descendants,
    jobs_of,
    pool_process,
    proc_table,
    sleeping_family,
    wait_gone,
)

pytestmark = pytest.mark.timeout(120)


def _until(condition: Callable[[], object], what: str, deadline: float = 15.0) -> None:
    end = time.monotonic() + deadline
    while not condition():
        assert time.monotonic() < end, f"{what} did not happen within {deadline}s"
        time.sleep(0.02)


def _running_job(pool: PoolProcess) -> tuple[int, int]:
    """A job process running below the pool, and its template (from one look at /proc: a job seen in one
    look may have ended by the next)."""
    found: list[tuple[int, int]] = []

    def look() -> bool:
        table = proc_table()
        found[:] = [(job, table[job][0]) for job in jobs_of(pool.pid) if job in table]
        return bool(found)

    _until(look, "a job start")
    return found[0]


def _exactly_one_answer_each(pool: PoolProcess, ids: list[str]) -> dict[str, dict[str, object]]:
    results = {request_id: pool.result(request_id, timeout=60) for request_id in ids}
    pool.quiet_for(lambda m: False, 0.5)  # room for a second answer to show up
    for request_id in ids:
        assert len(pool.responses(request_id)) == 1, pool.responses(request_id)
    return results


def test_templates_killed_again_and_again_while_jobs_run(tmp_path: Path) -> None:
    kills = 4
    with pool_process("--workers=2", cwd=tmp_path) as pool:
        ids = [pool.submit(code=f"import time\ntime.sleep(0.3)\nprint({i})") for i in range(24)]
        victims = []
        for _ in range(kills):
            _job, template = _running_job(pool)
            os.kill(template, signal.SIGKILL)
            victims.append(template)
            assert wait_gone([template], 5) == []
            _until(lambda: len(pool.templates()) == 2, "the replacement of a killed template")
        results = _exactly_one_answer_each(pool, ids)
        failed = {i: r for i, r in results.items() if r["error"] is not None}
        # Each kill interrupts the one job its template was serving, if any; it is not retried.
        assert 1 <= len(failed) <= kills, failed
        assert {r["error"]["type"] for r in failed.values()} == {"PoolWorkerError"}  # type: ignore[index]
        for index, request_id in enumerate(ids):
            if request_id not in failed:
                assert results[request_id]["stdout"] == f"{index}\n", results[request_id]
        assert not set(pool.templates()) & set(victims)
        assert pool.run("print('served')")["stdout"] == "served\n"
        stats = pool.stats()
        assert (stats["worker_errors"], stats["ok"]) == (len(failed), len(ids) - len(failed) + 1)


def test_a_job_killed_from_outside_is_a_signal_error_and_its_template_stays(tmp_path: Path) -> None:
    with pool_process("--workers=1", cwd=tmp_path) as pool:
        templates = pool.templates()
        request_id = pool.submit(code="import time\nprint('started', flush=True)\ntime.sleep(30)")
        job, _ = _running_job(pool)
        os.kill(job, signal.SIGKILL)
        result = pool.result(request_id)
        assert (result["exit"], result["error"]["type"]) == (128 + 9, "SignalError"), result
        assert "SIGKILL" in result["error"]["message"]
        assert pool.stats()["signals"] == 1
        assert pool.templates() == templates  # a job's death is no fault of its template
        assert pool.run("print('next')")["stdout"] == "next\n"


def test_a_job_stopped_from_outside_still_ends_at_its_deadline(tmp_path: Path) -> None:
    with pool_process("--workers=1", cwd=tmp_path) as pool:
        started = time.monotonic()
        request_id = pool.submit(code="import time\ntime.sleep(30)", timeout="1s")
        job, _ = _running_job(pool)
        os.kill(job, signal.SIGSTOP)
        result = pool.result(request_id)
        assert (result["exit"], result["error"]["type"]) == (124, "TimeoutError"), result
        assert time.monotonic() - started < 20
        assert wait_gone([job], 5) == []
        assert pool.run("print('next')")["stdout"] == "next\n"


def test_a_prepared_child_killed_from_outside_costs_no_job(tmp_path: Path) -> None:
    """The child a template confines ahead of the next job is not a job: killing it loses nothing.

    Finding 2: the template reaped the dead child when the hand-over failed, then discarded it again;
    the second SIGKILL went to a pid no longer its own (ProcessLookupError), the template died with a
    traceback on the pool's stderr and the job got a PoolWorkerError."""
    with pool_process("--workers=1", cwd=tmp_path) as pool:
        assert pool.run("print(1)")["stdout"] == "1\n"
        templates = pool.templates()
        # The template prepares the next children once it has reaped the job, which is after the answer.
        end = time.monotonic() + 10
        while True:
            table = proc_table()
            ready = [pid for pid in descendants(pool.pid, table) if table[pid][3] == "pynox-ready"]
            if len(ready) >= PREPARED_PER_WORKER or time.monotonic() > end:
                break
            time.sleep(0.02)
        assert len(ready) == PREPARED_PER_WORKER, table
        for pid in ready:  # every one of them: the next job finds none of those it was prepared with alive
            os.kill(pid, signal.SIGKILL)
        assert wait_gone(ready, 5) == []
        results = [pool.run(f"print({i})") for i in range(3)]  # the same policy it was prepared for
        assert [r["stdout"] for r in results] == ["0\n", "1\n", "2\n"], results
        assert pool.stats()["signals"] == 0
        assert pool.templates() == templates, "the template died"
        assert b"Traceback" not in pool.stderr, bytes(pool.stderr)


def test_a_session_child_killed_from_outside_ends_the_session(tmp_path: Path) -> None:
    with pool_process("--workers=1", cwd=tmp_path) as pool:
        assert pool.run("x = 1", session="nb")["exit"] == 0
        # A session's process lives between its steps: killed before it takes the step, the step did not run
        # (a PoolWorkerError saying to send it again). The step's first output shows it running.
        step = pool.submit(session="nb", code="import time\nprint('started', flush=True)\ntime.sleep(30)",
                           stream=True)
        _until(lambda: pool.events(step), "the step's first output")
        child, _ = _running_job(pool)
        os.kill(child, signal.SIGKILL)
        result = pool.result(step)
        assert (result["error"]["type"], result["session_ended"], result["step"]) == ("SignalError", True, 2)
        fresh = pool.run("print(x)", session="nb")
        assert (fresh["error"]["type"], fresh["step"]) == ("NameError", 1), fresh
        assert pool.run(session="nb", close=True)["closed"] is True


def test_a_session_template_killed_mid_step_ends_the_session(tmp_path: Path) -> None:
    with pool_process("--workers=1", cwd=tmp_path) as pool:
        workers = pool.templates()
        assert pool.run("x = 1", session="nb")["exit"] == 0
        step = pool.submit(session="nb", code="import time\ntime.sleep(30)")
        child, template = _running_job(pool)
        assert template not in workers  # the session's own template
        os.kill(template, signal.SIGKILL)
        result = pool.result(step)
        assert (result["error"]["type"], result["session_ended"]) == ("PoolWorkerError", True), result
        assert wait_gone([template, child], 5) == [], "the session's child outlived its template"
        fresh = pool.run("print(x)", session="nb")
        assert (fresh["error"]["type"], fresh["step"]) == ("NameError", 1), fresh
        assert pool.run("print('plain')")["stdout"] == "plain\n"
        assert pool.run(session="nb", close=True)["closed"] is True


def test_the_pool_killed_takes_every_process_it_started_within_a_second(tmp_path: Path) -> None:
    pool = PoolProcess("--workers=2", cwd=tmp_path)
    try:
        sleeping_family(pool)
        family = list(descendants(pool.pid))  # templates, jobs, the session child, prepared children
        assert len(family) >= 6, family
        os.kill(pool.pid, signal.SIGKILL)
        assert wait_gone(family, 1.0) == [], "processes outlived their pool by more than a second"
    finally:
        pool.kill()
