"""A bug of the pool's own around a job costs that request its result, never its answer, and never the thread
that answers it: the request gets one answer (a PoolWorkerError of its id), and the next request is served.

The bug is planted (tests/harness/pool_bugs): one of the pool's steps raises for requests whose id starts with
``bug-``, as a bug would (one did: a scratch file whose name is not UTF-8 ended its worker's thread, and every job
queued for that worker waited for ever). Everything else is a real pool and a real confined job. The control: the
same pool serves the same requests, under other ids, as usual.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.harness import pool_bugs

from .pool_driver import new_id, pool_process

pytestmark = pytest.mark.timeout(120)


def test_a_bug_around_a_job_answers_it_and_the_worker_serves_the_next(tmp_path: Path) -> None:
    with pool_process("--workers=1", cwd=tmp_path, env=pool_bugs.planted("scratch")) as pool:
        control = pool.run("open('mine', 'w').write('x')", scratch=True)
        assert control["exit"] == 0 and [f["path"] for f in control["files"]] == ["mine"], control
        hit = pool.run("open('bug-file', 'w').write('x')", scratch=True, id=new_id("bug"))
        assert hit["error"]["type"] == "PoolWorkerError" and "around this job" in hit["error"]["message"], hit
        # The worker lives on (one worker: a dead one would leave this in its queue until the wait ends).
        for _ in range(3):
            assert pool.run("print(6 * 7)")["stdout"] == "42\n"


def test_a_result_the_pool_fails_to_make_is_answered_by_its_id(tmp_path: Path) -> None:
    with pool_process("--workers=1", cwd=tmp_path, env=pool_bugs.planted("record")) as pool:
        assert pool.run("print(1)")["exit"] == 0  # the control: another id, the same job
        request = new_id("bug")
        hit = pool.run("print(1)", id=request)
        assert hit["id"] == request and hit["error"]["type"] == "PoolWorkerError", hit
        assert "could not write this request's result (PlantedBug)" in hit["error"]["message"], hit
        step = new_id("bug")
        answer = pool.run("x = 1", session="planted", id=step)
        assert (answer["id"], answer["session"], answer["error"]["type"]) == (step, "planted", "PoolWorkerError")
        assert pool.run("x = 2", session="planted")["exit"] == 0, "the session's thread lives on"
        assert pool.run("print(6 * 7)")["stdout"] == "42\n"
