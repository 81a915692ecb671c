"""The Python client against the real pool: results, concurrency, tools, sessions, host functions, recovery."""

from __future__ import annotations

import asyncio
import inspect
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import pynox
from pynox import Pool, PoolError, RequestError, Result
from tests.harness.clients import in_background
from tests.harness.fixtures import shared_pool

pool = shared_pool(workers=2)


def test_ok_result_fields(pool: Pool) -> None:
    result = pool.run("print('hi')")
    assert result.ok and result.exit == 0 and result.error is None
    assert result.stdout == "hi\n" and result.text == "hi"
    assert result.policy["backend"] == "landlock+seccomp" and result.policy["network"] == "deny"
    assert result.runtime["mode"] == "pool" and result.duration_us > 0


def test_raised_result_points_at_the_models_line(pool: Pool) -> None:
    result = pool.run("x = 1\nraise ValueError('bad value')", name="step.py")
    assert not result.ok and result.exit == 1
    assert result.error == {"type": "ValueError", "message": "bad value", "file": "step.py", "line": 2,
                            "path": None, "hint": None,
                            "traceback": [{"file": "step.py", "line": 2, "source": "raise ValueError('bad value')",
                                           "column": None, "omitted": 0}]}
    assert result.text == "ValueError: bad value (step.py:2)\n    raise ValueError('bad value')"
    with pytest.raises(pynox.JobError) as caught:
        result.raise_for_error()
    assert caught.value.result is result


def test_timed_out_result(pool: Pool) -> None:
    started = time.monotonic()
    result = pool.run("while True:\n    pass", timeout="500ms")
    assert time.monotonic() - started < 5
    assert result.exit == 124 and result.error is not None and result.error["type"] == "TimeoutError"
    assert result.timed_out and not result.refused
    assert "500ms" in result.text and "Hint:" in result.text
    # The code's own TimeoutError, or its own exit status 124, is not the pool's verdict.
    assert not pool.run("raise TimeoutError('mine')").timed_out
    assert not pool.run("raise SystemExit(124)").timed_out


def test_usage_is_typed_and_the_kernels(pool: Pool) -> None:
    result = pool.run("import sys\nsys.stdout.write('ab')\nsys.stderr.write('c')")
    assert isinstance(result.usage, pynox.Usage)
    assert (result.usage.stdout_bytes, result.usage.stderr_bytes, result.usage.host_calls) == (2, 1, 0)
    assert result.usage.cpu_ms > 0 and result.usage.max_rss_kb > 0


def test_truncated_result(pool: Pool) -> None:
    result = pool.run("print('x' * 100_000)", max_output="1k")
    assert result.ok and result.stdout_truncated and result.truncated
    assert len(result.stdout) == 1024
    assert "truncated" in result.text


def test_denied_path_is_a_result_with_a_hint(pool: Pool) -> None:
    result = pool.run("open('/etc/passwd').read()")
    assert result.error is not None and result.error["type"] == "PermissionError"
    assert 'allow_read=["/etc/passwd"]' in result.error["hint"]
    assert "root:" not in result.text


def test_paths_may_be_pathlike_and_units_numbers(pool: Pool, tmp_path: os.PathLike[str]) -> None:
    from pathlib import Path

    out = Path(tmp_path)
    result = pool.run(f"open({str(out / 'f.txt')!r}, 'w').write('data')", allow_write=[out], timeout=5,
                      memory=512 << 20)
    assert result.ok, result.text
    assert (out / "f.txt").read_text() == "data"
    assert result.policy["timeout_ms"] == 5000 and result.policy["memory_bytes"] == 512 << 20


def test_refused_request_raises_request_error(pool: Pool) -> None:
    with pytest.raises(RequestError, match="timeout"):
        pool.run("print(1)", timeout="soon")
    with pytest.raises(RequestError, match="does not exist"):
        pool.run("print(1)", allow_read=["/no/such/dir"])
    # JSON has no NaN nor infinity: they went as null, and the job ran under the default.
    for field, value in (("timeout", float("nan")), ("timeout", float("inf")), ("memory", float("inf")),
                         ("max_output", float("nan"))):
        with pytest.raises(RequestError, match=f"^{field}: "):
            pool.run("print(1)", **{field: value})


@pytest.mark.parametrize(("field", "given"), [
    ("code", {"code": "print('\udc80')"}),
    # What os.environ and os.listdir give for bytes that are not UTF-8.
    ("env", {"code": "print(1)", "env": {"NAME": "caf\udce9"}}),
    ("allow_read", {"code": "print(1)", "allow_read": ["caf\udce9.csv"]}),
    ("args", {"code": "print(1)", "args": ["\udc80"]}),
])
def test_a_lone_surrogate_in_a_request_is_a_request_error(pool: Pool, field: str, given: dict[str, Any]) -> None:
    # JSON cannot carry it: encoding the request raised UnicodeEncodeError from the client's own code.
    with pytest.raises(RequestError, match=f"^{field}: .*surrogate"):
        pool.run(**given)
    with pool.session() as session:
        with pytest.raises(RequestError, match=r"^code: .*surrogate"):
            session.run("print('\udc80')")
        assert session.run("print('still here')").stdout == "still here\n"


def test_fifty_concurrent_runs_from_threads_get_their_own_results(pool: Pool) -> None:
    results: dict[int, Result] = {}

    def one(i: int) -> None:
        results[i] = pool.run(f"print({i} * 3)")

    threads = [threading.Thread(target=one, args=(i,)) for i in range(50)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(results) == list(range(50))
    assert all(results[i].stdout == f"{i * 3}\n" for i in range(50))


def test_fifty_concurrent_aruns_get_their_own_results(pool: Pool) -> None:
    async def main() -> list[Result]:
        return await asyncio.gather(*(pool.arun(f"print({i} + 1000)") for i in range(50)))

    results = asyncio.run(main())
    assert [r.stdout for r in results] == [f"{i + 1000}\n" for i in range(50)]


def test_tool_is_a_plain_function_the_frameworks_accept(pool: Pool, tmp_path: os.PathLike[str]) -> None:
    def search(query: str, limit: int = 5) -> list[str]:
        """Search the catalog."""
        return [query] * limit

    run_python = pool.tool(allow_read=[tmp_path], timeout="7s", memory="256m", functions={"search": search})
    assert inspect.isfunction(run_python) and run_python.__name__ == "run_python"
    signature = inspect.signature(run_python)
    assert list(signature.parameters) == ["code"]
    assert signature.parameters["code"].annotation in (str, "str")
    assert signature.return_annotation in (str, "str")
    doc = run_python.__doc__ or ""
    assert os.path.realpath(tmp_path) in doc and "7s" in doc and "256m" in doc
    assert "search(query: str, limit: int = 5) -> list[str]: Search the catalog." in doc
    assert "from pynox_host import search" in doc and "Args:\n    code:" in doc
    assert run_python("from pynox_host import search\nprint(search('a', limit=2))") == "['a', 'a']"


def test_tool_refuses_a_non_string_and_never_raises_for_the_model(pool: Pool) -> None:
    run_python = pool.tool()
    assert run_python(42).startswith("Error: code must be a string")  # type: ignore[arg-type]
    assert "ZeroDivisionError" in run_python("1/0")


def test_session_tool_keeps_state_and_recovers_after_a_timeout(pool: Pool) -> None:
    notebook = pool.tool(session=True, timeout="1s")
    notebook("x = 41")
    assert notebook("x += 1\nprint(x)") == "42"
    text = notebook("while True:\n    pass")
    assert "TimeoutError" in text and "session ended" in text
    assert "NameError" in notebook("print(x)")
    notebook("x = 1")
    assert notebook("print(x)") == "1"


def test_session_object(pool: Pool) -> None:
    with pool.session() as session:
        assert not session.alive
        session.run("import math\nr = 2")
        result = session.run("print(round(math.pi * r * r, 2))")
        assert result.stdout == "12.57\n" and result.step == 2 and session.steps == 2 and session.alive
        assert session.run("1/0").error["type"] == "ZeroDivisionError"
        assert session.run("print(r)").stdout == "2\n"
    assert not session.alive


def test_host_function_exception_arrives_as_host_error(pool: Pool) -> None:
    def lookup(key: str) -> str:
        raise LookupError(f"no {key} in postgres://app:s3cret@db/prod")

    def refuse(key: str) -> str:
        raise pynox.HostError(f"{key} is not a known product")

    def not_json() -> object:
        return object()

    code = ("from pynox_host import lookup, refuse, not_json, HostError\n"
            "for f, a in ((lookup, ('k',)), (refuse, ('k',)), (not_json, ())):\n"
            "    try:\n        f(*a)\n    except HostError as e:\n        print(type(e).__name__, e)\n")
    functions = {"lookup": lookup, "refuse": refuse, "not_json": not_json}
    result = pool.run(code, functions=functions)
    assert result.ok, result.text
    lines = result.stdout.splitlines()
    # By default the job learns the exception's type, never its text (it may hold a secret) ...
    assert lines[0] == "HostError lookup() failed (LookupError); the host logged the details"
    assert "s3cret" not in result.stdout
    # ... unless the host raised pynox.HostError on purpose, or chose to send every message.
    assert lines[1] == "HostError k is not a known product"
    assert lines[2].startswith("HostError not_json() returned a value that is not plain JSON")
    full = pool.run(code, functions=functions, host_errors="full")
    assert full.stdout.splitlines()[0] == "HostError LookupError: no k in postgres://app:s3cret@db/prod"


def test_a_host_error_whose_text_holds_a_lone_surrogate_reaches_the_job(pool: Pool) -> None:
    # A file name that is not UTF-8 is decoded with surrogates (os.listdir, os.fsdecode): JSON cannot carry them.
    def listing() -> list[str]:
        raise pynox.HostError("no file named '\udcff.csv'")

    def opening() -> str:
        raise FileNotFoundError(2, "No such file or directory", "\udcff.csv")

    class Unspeakable(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no text")

    def muted() -> str:
        raise Unspeakable()

    code = ("from pynox_host import listing, opening, muted, HostError\nfor f in (listing, opening, muted):\n"
            "    try:\n        f()\n    except HostError as e:\n        print(e)\n")
    # Its answer could not be sent (or made): the job waited until its timeout, and the host printed a thread's
    # traceback.
    functions = {"listing": listing, "opening": opening, "muted": muted}
    result = pool.run(code, functions=functions, host_errors="full", timeout=5)
    assert result.ok, result.text
    assert result.stdout.splitlines() == ["no file named '\\udcff.csv'",
                                          "FileNotFoundError: [Errno 2] No such file or directory: '\\udcff.csv'",
                                          "Unspeakable: <exception str() failed>"]


def test_slow_host_function_does_not_block_other_jobs(pool: Pool) -> None:
    release = threading.Event()

    def wait() -> str:
        release.wait(10)
        return "done"

    slow: list[Result] = []
    thread = threading.Thread(target=lambda: slow.append(
        pool.run("from pynox_host import wait\nprint(wait())", functions={"wait": wait})))
    thread.start()
    time.sleep(0.3)
    assert pool.run("print('other')").stdout == "other\n"  # served while the host function blocks
    release.set()
    thread.join(timeout=20)
    assert slow[0].stdout == "done\n"


def test_stats(pool: Pool) -> None:
    before = pool.stats()["jobs"]
    pool.run("print(1)")
    stats = pool.stats()
    assert stats["event"] == "stats" and stats["jobs"] == before + 1 and stats["workers"] == 2
    # The gauges and histograms too, as plain values a caller can serialise or compare.
    assert stats["busy_workers"] == 0 and stats["queue_capacity"] == 1024 and stats["pid"] > 0
    assert isinstance(stats["duration_seconds"], dict) and stats["duration_seconds"]["count"] >= 1
    assert stats["duration_seconds"]["counts"][-1] <= stats["duration_seconds"]["count"]


def test_pool_process_killed_under_the_client_then_the_next_call_works() -> None:
    with Pool(workers=1) as pool:
        assert pool.run("print(1)").ok
        process = pool._process
        assert process is not None
        thread, errors = in_background(lambda: pool.run("import time\ntime.sleep(30)"), PoolError)
        time.sleep(0.5)
        os.kill(process.popen.pid, signal.SIGKILL)
        thread.join(timeout=10)
        assert errors and "exited" in str(errors[0])
        assert pool.run("print('again')").stdout == "again\n"
        assert pool._process is not process


def test_closed_pool_refuses() -> None:
    pool = Pool(workers=1)
    pool.close()
    pool.close()
    with pytest.raises(PoolError, match="closed"):
        pool.run("print(1)")


@pytest.mark.parametrize("code", ["import os\nos.fork()", "import os\nos.posix_spawn('/bin/true', ['true'], {})"])
def test_a_process_started_directly_gets_the_process_hint(pool: Pool, code: str) -> None:
    # os.fork and os.posix_spawn are C functions: no frame but the model's own line says what was refused.
    error = pool.run(code).error
    assert error is not None and error["type"] == "PermissionError"
    assert "Starting programs or processes" in error["hint"]


def test_pynox_pool_is_the_specifications_name_for_pool() -> None:
    assert pynox.PynoxPool is pynox.Pool and "PynoxPool" in pynox.__all__


def _stand_in(tmp_path: Path, first_line: str) -> Path:
    """A pool binary that writes ``first_line`` and then reads requests without answering."""
    script = tmp_path / "stand_in.py"
    script.write_text(f"import sys\nprint({first_line!r}, flush=True)\nfor line in sys.stdin:\n    pass\n")
    binary = tmp_path / "stand-in-pynox"
    binary.write_text(f"#!/bin/sh\nexec {sys.executable} {script} \"$@\"\n")
    binary.chmod(0o755)
    return binary


def test_a_start_error_keeps_its_type_when_it_has_no_message(tmp_path: Path) -> None:
    with pytest.raises(pynox.ConfigError, match="the pool could not start"):
        pynox.Pool(workers=1, binary=_stand_in(tmp_path, '{"event": "error", "error": {"type": "ConfigError"}}'))


def test_a_first_line_that_is_no_ready_event_is_a_pool_error(tmp_path: Path) -> None:
    with pytest.raises(pynox.PoolError, match="first line was not its ready event"):
        pynox.Pool(workers=1, binary=_stand_in(tmp_path, '[1]'))


def _answering_stand_in(tmp_path: Path, answer: str) -> Path:
    """A pool binary that is ready, then answers every request with ``answer`` (``ID`` is its id)."""
    script = tmp_path / "answering.py"
    script.write_text("import json, sys\nprint(json.dumps({'event': 'ready', 'workers': 1}), flush=True)\n"
                      f"for line in sys.stdin:\n    print({answer!r}.replace('ID', json.loads(line)['id']), "
                      "flush=True)\n")
    binary = tmp_path / "answering-pynox"
    binary.write_text(f"#!/bin/sh\nexec {sys.executable} {script} \"$@\"\n")
    binary.chmod(0o755)
    return binary


def test_an_answer_the_client_cannot_read_fails_its_run_at_once(tmp_path: Path) -> None:
    binary = _answering_stand_in(tmp_path, '{"id": "ID", "exit": "zero"}')
    with pynox.Pool(workers=1, binary=binary) as pool:
        started = time.monotonic()
        with pytest.raises(PoolError, match="could not be read"):
            pool.run("print(1)", timeout="60s")
        assert time.monotonic() - started < 5
        pool.close(timeout=1)


def test_a_stats_request_answered_with_a_result_is_a_pool_error(tmp_path: Path) -> None:
    binary = _answering_stand_in(tmp_path, '{"id": "ID", "exit": 0}')
    with pynox.Pool(workers=1, binary=binary) as pool:
        with pytest.raises(PoolError, match="answered a stats request"):
            pool.stats()
        pool.close(timeout=1)


def test_pool_ready_is_the_line_the_pool_wrote(tmp_path: Path) -> None:
    line = '{"event": "ready", "workers": 1, "runtime": "pynox", "preloaded_modules": [], "newer_field": 5}'
    with pynox.Pool(workers=1, binary=_stand_in(tmp_path, line)) as pool:
        assert pool.ready == {"event": "ready", "workers": 1, "runtime": "pynox", "preloaded_modules": [],
                              "newer_field": 5}
        pool.close(timeout=1)


def test_relative_grants_resolve_where_the_pool_runs_whatever_the_caller_does_later(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A tool describes, and the pool grants, the same directory: the pool's, fixed when it started. Before,
    a caller that changed directory got a description naming its new one, while the pool granted the old."""
    home, elsewhere = tmp_path / "home", tmp_path / "elsewhere"
    for base in (home, elsewhere):
        (base / "data").mkdir(parents=True)
        (base / "data" / "orders.csv").write_text(f"{base.name}\n")
    monkeypatch.chdir(home)
    with Pool(workers=1) as own:
        monkeypatch.chdir(elsewhere)
        run_python = own.tool(allow_read=["data"])
        assert f"Read files: {home / 'data'} " in (run_python.__doc__ or "")
        assert run_python("print(open('data/orders.csv').read())").strip() == "home"
        assert own.cwd == str(home)


def test_the_client_waits_as_long_as_the_ready_event_says_without_reading_the_config(tmp_path: Path) -> None:
    """A run that names no timeout may get a profile's or the ceiling's: the pool's ready event says the
    longest, and the client waits that long, even once the config file it started with is gone."""
    from pynox.protocol import Request

    config = tmp_path / "pynox.toml"
    config.write_text('[pool.limits]\ntimeout = "15m"\n\n[profiles.slow]\ntimeout = "10m"\n')
    with Pool(workers=1, config=config) as configured:
        assert configured.ready["longest_timeout"] == 900.0
        config.unlink()  # the client must not need it: the pool read it once, at start
        assert configured._patience(Request(code="1", profile="slow"), 1) >= 900.0
        assert configured.run("print(1)", profile="slow").stdout == "1\n"
    # Control: without a config the longest is the pool's default, and so is the wait.
    with Pool(workers=1) as plain:
        assert plain.ready["longest_timeout"] == 30.0
        assert 30.0 <= plain._patience(Request(code="1"), 1) < 900.0


def test_a_session_that_cannot_be_opened_again_says_its_state_was_gone_then_and_later(tmp_path: Path) -> None:
    # The pool closed the session (session_idle) and has no room for it now (max_sessions): the run is refused.
    # The refusal said only "max_sessions", and once there was room the next run said nothing of the lost state.
    config = tmp_path / "pynox.toml"
    config.write_text('[pool]\nsession_idle = "1s"\nmax_sessions = 1\n')
    with Pool(workers=1, config=config) as pool, pool.session() as first:
        first.run("x = 1").raise_for_error()
        time.sleep(2.5)  # closed by the pool after 1s without a step
        with pool.session() as other:
            other.run("y = 2").raise_for_error()  # takes the only room
            with pytest.raises(RequestError, match=r"max_sessions.*earlier process was gone"):
                first.run("print('x' in globals())")
        fresh = first.run("print('x' in globals())")
        assert fresh.stdout == "False\n" and fresh.session_reopened is not None, fresh
        assert "gone" in fresh.text
