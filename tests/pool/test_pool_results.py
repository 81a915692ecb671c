"""Results: one object per line, in completion order, with every documented field and error type."""

from __future__ import annotations

import platform
import time
from pathlib import Path
from typing import Any

import pytest

from .pool_driver import PoolProcess, new_id

pytestmark = pytest.mark.timeout(90)

RESULT_FIELDS = {"id", "exit", "stdout", "stderr", "error", "stdout_truncated", "stderr_truncated",
                 "duration_ms", "duration_us", "queue_us", "runtime", "policy"}
POLICY_FIELDS = {"allow_read", "allow_write", "network", "subprocesses", "timeout_ms", "memory_bytes", "backend"}
ERROR_FIELDS = {"type", "message", "file", "line", "hint"}


def test_every_documented_field_of_a_result(pool: PoolProcess, workdir: Path) -> None:
    (workdir / "out").mkdir(exist_ok=True)
    result = pool.run("import json, sys\nprint(json.dumps({'ok': True}))\nprint('to stderr', file=sys.stderr)",
                      name="step.py", allow_write=["out"], timeout="5s", memory="512m")
    assert set(result) >= RESULT_FIELDS, set(result)
    assert result["exit"] == 0
    assert result["stdout"] == '{"ok": true}\n'
    assert result["stderr"] == "to stderr\n"
    assert result["error"] is None
    assert result["stdout_truncated"] is False and result["stderr_truncated"] is False
    for field in ("duration_ms", "duration_us", "queue_us"):
        assert type(result[field]) is int and result[field] >= 0, field
    assert result["duration_us"] > 0
    assert result["duration_ms"] == result["duration_us"] // 1000
    assert result["runtime"] == {"name": "pynox", "python": platform.python_version(), "mode": "pool",
                                 "preloaded_modules": []}
    policy = result["policy"]
    assert set(policy) >= POLICY_FIELDS, set(policy)
    assert policy["allow_read"] == []
    assert policy["allow_write"] == [str((workdir / "out").resolve())]
    assert policy["network"] == "deny"
    assert policy["subprocesses"] == "deny"
    assert policy["timeout_ms"] == 5000
    assert policy["memory_bytes"] == 536870912
    assert policy["backend"] == "landlock+seccomp"


def test_a_refused_request_still_has_every_field(pool: PoolProcess) -> None:
    result = pool.run("print(1)", nonsense=True)
    assert set(result) >= RESULT_FIELDS
    assert set(result["error"]) >= ERROR_FIELDS


def test_each_result_is_one_line(pool: PoolProcess) -> None:
    result = pool.run("print('a\\nb\\r\\nc')\nprint('\\u2603 \\x00 \"quoted\"')")
    assert result["stdout"] == 'a\nb\r\nc\n\u2603 \x00 "quoted"\n'
    assert not pool.bad_lines


def test_output_that_is_not_utf8_still_makes_a_valid_line(pool: PoolProcess) -> None:
    result = pool.run("import os\nos.write(1, b'\\xff\\xfeok')\nos.write(2, b'\\xc3')")
    assert result["stdout"] == "\ufffd\ufffdok" and result["stderr"] == "\ufffd"


def test_results_arrive_in_completion_order_not_request_order(pool: PoolProcess) -> None:
    slow = pool.submit(code="import time\ntime.sleep(1.5)\nprint('slow')")
    fast = pool.submit(code="print('fast')")
    fast_result = pool.result(fast)
    slow_result = pool.result(slow)
    assert pool.index_of(fast_result) < pool.index_of(slow_result)
    assert (fast_result["stdout"], slow_result["stdout"]) == ("fast\n", "slow\n")


def test_queue_us_is_the_time_a_job_waited_for_a_worker(pool: PoolProcess) -> None:
    busy = [pool.submit(code="import time\ntime.sleep(0.6)") for _ in range(2)]
    waited = pool.result(pool.submit(code="print('after')"))
    assert waited["queue_us"] >= 300_000, waited["queue_us"]
    assert waited["duration_us"] < 300_000  # its own run, not the wait
    for request_id in busy:
        assert pool.result(request_id)["queue_us"] < 300_000


def test_stdout_and_stderr_are_captured_at_the_descriptor_level(pool: PoolProcess) -> None:
    code = "import os, sys\nos.write(1, b'fd1 ')\nsys.stdout.write('py\\n')\nos.write(2, b'fd2\\n')"
    result = pool.run(code)
    assert sorted(result["stdout"].split()) == ["fd1", "py"]
    assert result["stderr"] == "fd2\n"


def test_output_flood_is_capped_and_the_job_still_finishes(pool: PoolProcess) -> None:
    code = "import os\nfor _ in range(64):\n    os.write(1, b'x' * 65536)\nprint('done', flush=True)"
    result = pool.run(code, max_output=1000)
    assert result["exit"] == 0
    assert len(result["stdout"]) == 1000 and result["stdout_truncated"] is True
    assert result["stderr_truncated"] is False


def test_what_each_pipe_holds_as_the_job_ends_is_read_whole(pool: PoolProcess) -> None:
    """The pipes of a job that ends full are read to their end as they hang up (capture.py): stdout and the
    report enlarged to 1 MiB, stdout filled in one write, stderr filled to its 64 KiB: every byte is counted
    and kept up to the limit, in order, and the report written after them is the job's word."""
    code = ("import fcntl, os\nfor fd in (1, 3):\n    fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, 1 << 20)\n"
            "os.write(1, b''.join(b'%07d\\n' % i for i in range(131072)))\nos.write(2, b'e' * 65536)\n"
            "raise ValueError('after the flood')")
    result = pool.run(code, max_output="2m")
    assert result["error"]["type"] == "ValueError" and result["error"]["message"] == "after the flood", result["error"]
    lines = result["stdout"].split("\n")
    assert lines[:-1] == [f"{i:07d}" for i in range(131072)] and lines[-1] == "", len(lines)
    assert result["usage"]["stdout_bytes"] == 1 << 20 and result["stdout_truncated"] is False
    assert result["stderr"].startswith("e" * 65536 + "Traceback") and result["usage"]["stderr_bytes"] > 65536
    capped = pool.run(code, max_output="100k")
    assert len(capped["stdout"]) == 100 << 10 and capped["stdout_truncated"] is True
    assert capped["usage"]["stdout_bytes"] == 1 << 20 and capped["error"]["type"] == "ValueError"


# --- errors ----------------------------------------------------------------------------------------------


def _error(result: dict[str, Any], error_type: str) -> dict[str, Any]:
    error = result["error"]
    assert error is not None and error["type"] == error_type, result
    assert set(error) >= ERROR_FIELDS
    return error


def test_error_type_is_the_python_exception_class_with_file_and_line(pool: PoolProcess) -> None:
    result = pool.run("class QuotaExceeded(Exception):\n    pass\n\nx = 1\nraise QuotaExceeded('over')",
                      name="step.py")
    assert result["exit"] == 1
    error = _error(result, "QuotaExceeded")
    assert (error["message"], error["file"], error["line"]) == ("over", "step.py", 5)
    assert error["hint"] is None
    assert "QuotaExceeded: over" in result["stderr"]


def test_error_file_and_line_point_at_the_script(pool: PoolProcess, workdir: Path) -> None:
    (workdir / "broken.py").write_text("def f():\n    return {}['missing']\n\nf()\n")
    error = _error(pool.run(script="broken.py"), "KeyError")
    assert error["file"] == "broken.py" and error["line"] == 2


def test_syntax_error_points_at_its_line(pool: PoolProcess) -> None:
    error = _error(pool.run("x = 1\ny = (\n", name="cell.py"), "SyntaxError")
    assert error["file"] == "cell.py" and error["line"] in (2, 3)


def test_a_non_zero_exit_is_reported_as_it_is(pool: PoolProcess) -> None:
    result = pool.run("import sys\nprint('bye')\nsys.exit(3)")
    assert result["exit"] == 3 and result["stdout"] == "bye\n"


@pytest.mark.parametrize(("code", "exit"), [
    ("raise SystemExit(10**100)", 255),  # as CPython exits: beyond a C long, -1 (it was 0: a success)
    ("raise SystemExit(-(2**64))", 255),
    ("raise SystemExit(2**40 + 3)", 3),
    ("class Code(int):\n    def __and__(self, other):\n        raise RuntimeError('no')\nraise SystemExit(Code(3))", 3),
    ("class Word:\n    def __str__(self):\n        raise RuntimeError('no')\nraise SystemExit(Word())", 1),
    ("class Word:\n    def __str__(self):\n        raise KeyboardInterrupt\nraise SystemExit(Word())", 1),
])
def test_an_odd_exit_code_exits_as_python_would(pool: PoolProcess, code: str, exit: int) -> None:
    result = pool.run(code)
    assert result["exit"] == exit and result["error"] is None, result


# The job's own stand-ins for its streams, whose methods raise what is not an Exception.
_RAISING_STREAM = ("import sys\nclass Stream:\n    def write(self, text):\n        raise KeyboardInterrupt\n"
                   "    def flush(self):\n        raise SystemExit(4)\n")


@pytest.mark.parametrize(("code", "exit", "kind"), [
    (_RAISING_STREAM + "sys.stdout = sys.stderr = Stream()\nx = 1", 0, None),  # flushed at the end: ignored
    (_RAISING_STREAM + "sys.stdout = sys.stderr = Stream()\nraise ValueError('v')", 1, "ValueError"),
])
def test_streams_the_code_broke_do_not_cost_it_its_result(pool: PoolProcess, code: str, exit: int,
                                                          kind: str | None) -> None:
    # Pynox flushes them and prints the traceback to them; neither may end the job as a setup failure (125).
    result = pool.run(code)
    assert result["exit"] == exit, result
    assert (result["error"] or {}).get("type") == kind, result


def test_a_session_step_that_broke_its_streams_keeps_its_session(pool: PoolProcess) -> None:
    session = "broken-streams"
    first = pool.run(_RAISING_STREAM + "sys.stdout = sys.stderr = Stream()\nx = 1", session=session)
    assert first["exit"] == 0 and not first["session_ended"], first
    following = pool.run("raise ValueError(x)", session=session, stream=True)  # its streams then counted
    assert following["exit"] == 1 and following["error"]["type"] == "ValueError", following
    assert not following["session_ended"], following
    pool.result(pool.submit(session=session, close=True))


def test_permission_errors_carry_a_hint(pool: PoolProcess) -> None:
    error = _error(pool.run("open('/etc/passwd').read()"), "PermissionError")
    assert error["hint"] and "allow_read" in error["hint"]
    assert error["line"] == 1


def test_the_hint_for_a_file_not_yet_there_names_a_grant_that_allows_it(pool: PoolProcess, tmp_path: Path) -> None:
    """A grant must name a path that exists: the hint for a refused create names the nearest directory that does,
    and following it lets the same code write the file. (Granting the file itself is refused: the control.)"""
    target = tmp_path / "reports" / "new.txt"
    target.parent.mkdir()
    code = f"open({str(target)!r}, 'w').write('made')"
    hint = _error(pool.run(code), "PermissionError")["hint"]
    assert f'allow_write=["{target.parent}"]' in hint and f"{target} does not exist yet" in hint, hint
    assert pool.run(code, allow_write=[str(target)])["error"]["type"] == "RequestError"
    assert pool.run(code, allow_write=[str(target.parent)])["exit"] == 0
    assert target.read_text() == "made"


def test_memory_errors_carry_a_hint(pool: PoolProcess) -> None:
    result = pool.run("x = bytearray(600 << 20)", memory="256m")
    error = _error(result, "MemoryError")
    assert error["hint"] and "memory" in error["hint"]
    assert pool.run("print('alive')")["stdout"] == "alive\n"


def test_timeout_error(pool: PoolProcess) -> None:
    started = time.monotonic()
    result = pool.run("while True:\n    pass", timeout="1s")
    assert time.monotonic() - started < 6
    assert result["exit"] == 124
    _error(result, "TimeoutError")
    assert 900 <= result["duration_ms"] < 5000


def test_signal_error(pool: PoolProcess) -> None:
    result = pool.run("import os\nos.abort()")
    error = _error(result, "SignalError")
    assert "SIGABRT" in error["message"]
    assert result["exit"] != 0


def test_sandbox_setup_error_means_the_code_never_ran(pool: PoolProcess, workdir: Path) -> None:
    marker = workdir / "out" / "setup-error-marker"
    (workdir / "out").mkdir(exist_ok=True)
    result = pool.run("open('out/setup-error-marker', 'w')", memory="1m", allow_write=["out"])
    assert result["exit"] == 125
    _error(result, "SandboxSetupError")
    assert not marker.exists()


def test_request_error(pool: PoolProcess) -> None:
    result = pool.run("print(1)", timeout="forever")
    _error(result, "RequestError")
    assert "timeout" in result["error"]["message"]


def test_ids_of_many_concurrent_jobs_each_get_one_result(pool: PoolProcess) -> None:
    ids = [pool.submit(code=f"print({i})") for i in range(40)]
    for i, request_id in enumerate(ids):
        assert pool.result(request_id)["stdout"] == f"{i}\n"
    pool.quiet_for(lambda m: False, 0.2)
    assert all(len(pool.responses(request_id)) == 1 for request_id in ids)


def test_results_are_not_mixed_between_concurrent_jobs(pool: PoolProcess) -> None:
    ids = {new_id("mix"): i for i in range(10)}
    for request_id, i in ids.items():
        pool.submit(id=request_id, code=f"import sys\nprint('out-{i}' * 1000)\nprint('err-{i}', file=sys.stderr)")
    for request_id, i in ids.items():
        result = pool.result(request_id)
        assert result["stdout"] == f"out-{i}" * 1000 + "\n"
        assert result["stderr"] == f"err-{i}\n"
