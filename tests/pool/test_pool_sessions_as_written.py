"""Sessions as the protocol page writes them, driven as a client written from that page drives them.

Every request goes out exactly as written (``as_written``): a session's first request carries only code
(no grants, no ``"open"``), and the pool opens the session with its defaults. After a session ended, the
next request under its name starts a new process with the permissions that request brings, and its result
says the state is gone (``session_reopened``).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .pool_driver import PoolProcess, new_id, pool_process, refused

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def pool(workdir: Path) -> Iterator[PoolProcess]:
    with pool_process("--workers=2", cwd=workdir, env=os.environ.copy(), as_written=True) as shared:
        yield shared


def _name() -> str:
    return new_id("spec-notebook")


def _ok(result: dict[str, Any]) -> dict[str, Any]:
    assert result["exit"] == 0 and result["error"] is None, result
    return result


def _close(pool: PoolProcess, name: str) -> None:
    assert pool.run(session=name, close=True)["closed"] is True


def test_a_first_request_with_only_code_opens_a_session_with_the_defaults(pool: PoolProcess) -> None:
    name = _name()
    first = _ok(pool.run("x = 41", session=name))
    assert (first["session"], first["step"], first["session_ended"]) == (name, 1, False)
    assert first["runtime"]["mode"] == "session"
    assert first["policy"]["allow_read"] == [] and first["policy"]["allow_write"] == []
    assert first["policy"]["network"] == "deny"
    assert "session_reopened" not in first and "interrupted" not in first
    _close(pool, name)


def test_a_variable_survives_between_steps(pool: PoolProcess) -> None:
    name = _name()
    _ok(pool.run("import json\nrows = [1, 2, 3]", session=name))
    second = _ok(pool.run("print(json.dumps(sum(rows)))", session=name))
    assert second["stdout"] == "6\n" and second["step"] == 2
    _close(pool, name)


def test_a_session_is_one_process(pool: PoolProcess) -> None:
    name = _name()
    pids = {_ok(pool.run("import os\nprint(os.getpid())", session=name))["stdout"] for _ in range(3)}
    assert len(pids) == 1
    _close(pool, name)


def test_a_python_exception_leaves_the_session_alive(pool: PoolProcess) -> None:
    name = _name()
    _ok(pool.run("x = 'kept'", session=name))
    failed = pool.run("1 / 0", session=name)
    assert failed["error"]["type"] == "ZeroDivisionError" and failed["session_ended"] is False, failed
    assert _ok(pool.run("print(x)", session=name))["stdout"] == "kept\n"
    _close(pool, name)


def test_a_timeout_ends_it_and_the_next_request_starts_a_new_process_that_says_so(pool: PoolProcess) -> None:
    name = _name()
    _ok(pool.run("x = 1", session=name))
    ended = pool.run("while True:\n    pass", session=name, timeout="1s")
    assert ended["error"]["type"] == "TimeoutError" and ended["session_ended"] is True, ended
    fresh = pool.run("print(x)", session=name)
    assert fresh["error"]["type"] == "NameError" and fresh["step"] == 1, fresh
    assert fresh["session_reopened"] == "step 2 timed out", fresh
    _close(pool, name)


@pytest.mark.parametrize("code, why", [("import os\nos.abort()", "SignalError"),
                                       ("import sys\nsys.exit(3)", "status 3")], ids=["crash", "exit"])
def test_a_crash_or_an_exit_ends_it_and_the_next_request_says_the_state_is_gone(pool: PoolProcess, code: str,
                                                                                why: str) -> None:
    name = _name()
    _ok(pool.run("x = 1", session=name))
    assert pool.run(code, session=name)["session_ended"] is True
    fresh = pool.run("print('x' in dir())", session=name)
    assert fresh["stdout"] == "False\n" and why in fresh["session_reopened"], fresh
    _close(pool, name)


def test_the_next_request_after_an_end_brings_its_own_permissions(pool: PoolProcess, workdir: Path) -> None:
    (workdir / "spec-out").mkdir(exist_ok=True)
    name = _name()
    _ok(pool.run("x = 1", session=name))
    assert pool.run("while True:\n    pass", session=name, timeout="500ms")["session_ended"] is True
    again = _ok(pool.run("open('spec-out/f.txt', 'w').write('w')", session=name, allow_write=["spec-out"]))
    assert again["policy"]["allow_write"] == [str((workdir / "spec-out").resolve())]
    assert (workdir / "spec-out" / "f.txt").read_text() == "w"
    _close(pool, name)


def test_a_later_step_with_a_permission_field_is_a_request_error(pool: PoolProcess) -> None:
    name = _name()
    _ok(pool.run("x = 'still here'", session=name))
    answer = pool.run("print('never')", session=name, allow_network=True)
    refused(answer, "allow_network")
    assert answer["session_ended"] is False
    assert _ok(pool.run("print(x)", session=name))["stdout"] == "still here\n"
    _close(pool, name)


def test_a_later_step_may_carry_name_args_timeout_and_max_output(pool: PoolProcess) -> None:
    name = _name()
    _ok(pool.run("x = 'y' * 40", session=name))
    step = _ok(pool.run("import sys\nprint(sys.argv)\nprint(x)", session=name, name="cell.py", args=["a"],
                        timeout="5s", max_output=20))
    assert step["stdout"].startswith("['cell.py', 'a']\n") and step["stdout_truncated"] is True
    assert step["policy"]["timeout_ms"] == 5000
    _close(pool, name)


def test_close_answers_closed_and_the_next_request_starts_fresh(pool: PoolProcess) -> None:
    name = _name()
    _ok(pool.run("x = 1", session=name))
    request_id = new_id("close")
    pool.send({"id": request_id, "session": name, "close": True})
    assert pool.result(request_id) == {"id": request_id, "session": name, "closed": True}
    fresh = pool.run("print('x' in dir())", session=name)
    assert fresh["stdout"] == "False\n" and fresh["step"] == 1
    assert "session_reopened" not in fresh  # the client closed it: it knows
    _close(pool, name)


def test_sessions_are_isolated_from_each_other_and_from_plain_jobs(pool: PoolProcess) -> None:
    a, b = _name(), _name()
    _ok(pool.run("secret = 'a'\nimport os\nprint(os.getpid())", session=a))
    other = _ok(pool.run("print('secret' in dir())\nimport os\nprint(os.getpid())", session=b))
    assert other["stdout"].split()[0] == "False"
    assert _ok(pool.run("print('secret' in dir())"))["stdout"] == "False\n"
    _close(pool, a)
    _close(pool, b)


def test_steps_queue_behind_each_other_and_the_ninth_pending_is_refused(pool: PoolProcess) -> None:
    name = _name()
    ids = [pool.submit(session=name, code="import time\ntime.sleep(1)\norder = [0]")]
    ids += [pool.submit(session=name, code=f"order.append({i})") for i in range(1, 8)]
    refused(pool.result(pool.submit(session=name, code="print('ninth')")), "pending")
    results = [pool.result(i) for i in ids]
    assert [r["step"] for r in results] == list(range(1, 9)) and all(r["exit"] == 0 for r in results), results
    assert _ok(pool.run("print(order)", session=name))["stdout"] == "[0, 1, 2, 3, 4, 5, 6, 7]\n"
    _close(pool, name)


def test_an_idle_session_is_closed_and_the_next_request_opens_a_new_one(tmp_path: Path) -> None:
    with pool_process("--workers=1", "--session-idle=1s", cwd=tmp_path, as_written=True) as pool:
        name = _name()
        _ok(pool.run("x = 1", session=name))
        deadline = time.monotonic() + 10
        while pool.stats()["sessions_active"] and time.monotonic() < deadline:
            time.sleep(0.2)
        assert pool.stats()["sessions_active"] == 0
        fresh = pool.run("print('x' in dir())", session=name)
        assert fresh["stdout"] == "False\n" and fresh["step"] == 1, fresh
        assert "session_idle" in fresh["session_reopened"], fresh


def test_max_sessions_caps_concurrent_sessions(tmp_path: Path) -> None:
    with pool_process("--workers=1", "--max-sessions=2", cwd=tmp_path, as_written=True) as pool:
        a, b = _name(), _name()
        _ok(pool.run("x = 1", session=a))
        _ok(pool.run("x = 2", session=b))
        refused(pool.run("x = 3", session=_name()), "max_sessions")
        _close(pool, a)
        _ok(pool.run("x = 3", session=_name()))


def test_stats_count_the_active_sessions(tmp_path: Path) -> None:
    with pool_process("--workers=1", cwd=tmp_path, as_written=True) as pool:
        names = [_name(), _name()]
        for name in names:
            _ok(pool.run("x = 1", session=name))
        stats = pool.stats()
        assert stats["sessions_active"] == 2 and stats["ok"] == 2, stats
        for name in names:
            _close(pool, name)
        assert pool.stats()["sessions_active"] == 0


def test_the_log_line_carries_the_session_and_its_step(tmp_path: Path) -> None:
    with pool_process("--workers=1", "--log=json", cwd=tmp_path, as_written=True) as pool:
        name = _name()
        _ok(pool.run("x = 1", session=name, id="nb-1"))
        _ok(pool.run("print(x)", session=name, id="nb-2"))
        _close(pool, name)
    lines = [json.loads(line) for line in bytes(pool.stderr).decode().splitlines() if line.startswith("{")]
    jobs = {line["id"]: line for line in lines if line.get("event") == "job"}
    assert (jobs["nb-1"]["session"], jobs["nb-1"]["step"]) == (name, 1), jobs
    assert (jobs["nb-2"]["session"], jobs["nb-2"]["step"], jobs["nb-2"]["exit"]) == (name, 2, 0), jobs
