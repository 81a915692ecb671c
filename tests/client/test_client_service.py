"""The client in a service: a pre-fork server, sessions that outlive their process, a stopped pool, a request
the pool refuses before reading it.

Each test runs a real pool and looks at what it did from here: which process answered, what the job was
confined with (its result's policy), how long a call took to come back.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from pynox import Pool, PoolError, RequestError
from tests.harness.clients import in_background

pytestmark = pytest.mark.timeout(120)


def _fork() -> int:
    # A pre-fork server (gunicorn) forks a process that already has threads: the client's reader threads.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # 3.12+: "use of fork() may lead to deadlocks"
        return os.fork()


def _in_child(work: str, write_fd: int, pool: Pool) -> None:
    """In the forked child: run ``work`` on the parent's pool object, report what came back, exit."""
    report: dict[str, object] = {}
    try:
        started = time.monotonic()
        result = pool.run(work, timeout="5s")
        report = {"stdout": result.stdout, "seconds": time.monotonic() - started,
                  "pool_pid": pool._process.popen.pid if pool._process else None}
    except BaseException as exc:  # anything: it is reported to the parent, which judges it
        report = {"error": f"{type(exc).__name__}: {exc}", "seconds": time.monotonic() - started}
    finally:
        try:
            os.write(write_fd, json.dumps(report).encode())
            pool.close(timeout=5)
        finally:
            os._exit(0)


def test_a_pool_made_before_a_fork_gives_parent_and_child_each_their_own_output() -> None:
    with Pool(workers=2) as pool:
        assert pool.run("print('warm')").ok
        assert pool._process is not None
        parent_pool_pid = pool._process.popen.pid
        read_fd, write_fd = os.pipe()
        # Both sides run at once: the parent's job is in flight when the child sends its own.
        parent_results: list[str] = []

        def parent_jobs() -> None:
            for _ in range(3):
                parent_results.append(pool.run("import time\ntime.sleep(0.3)\nprint('parent')").stdout)

        runner = threading.Thread(target=parent_jobs)
        runner.start()
        time.sleep(0.1)
        child = _fork()
        if child == 0:
            _in_child("print('child')", write_fd, pool)
        os.close(write_fd)
        try:
            runner.join(timeout=60)
            with os.fdopen(read_fd, "rb") as reader:
                report = json.loads(reader.read() or b"{}")
        finally:
            os.waitpid(child, 0)
        assert parent_results == ["parent\n"] * 3
        assert report.get("stdout") == "child\n", report
        assert report["pool_pid"] not in (None, parent_pool_pid), report  # a pool of its own
        assert pool.run("print('parent again')").stdout == "parent again\n"
        assert pool._process is not None and pool._process.popen.pid == parent_pool_pid


def _stopped(pool: Pool) -> Iterator[int]:
    assert pool._process is not None
    pid = pool._process.popen.pid
    os.kill(pid, signal.SIGSTOP)
    try:
        yield pid
    finally:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _gone(pid: int, deadline: float = 10.0) -> bool:
    """Whether ``pid`` has ended and been reaped (by the client, whose child it was)."""
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def test_stats_of_a_stopped_pool_times_out_answers_what_was_pending_and_restarts_it() -> None:
    with Pool(workers=1) as pool:
        assert pool.run("print(1)").ok
        errors: list[BaseException] = []

        def pending() -> None:
            try:
                pool.run("print('never')", timeout="1s")
            except PoolError as exc:
                errors.append(exc)

        for pid in _stopped(pool):
            waiter = threading.Thread(target=pending)
            waiter.start()
            started = time.monotonic()
            with pytest.raises(PoolError, match="answered nothing"):
                pool.stats(timeout=2)
            assert time.monotonic() - started < 6
            # The run waiting on the hung pool is answered now, not at its patience (33 s).
            waiter.join(timeout=5)
            assert not waiter.is_alive() and errors and "answered nothing" in str(errors[0])
            assert _gone(pid)  # the hung pool was stopped for good
            assert pool.run("print('again')").stdout == "again\n"
            assert pool._process is not None and pool._process.popen.pid != pid


def test_close_of_a_stopped_pool_returns_within_its_timeout() -> None:
    pool = Pool(workers=1)
    assert pool.run("print(1)").ok
    busy, errors = in_background(lambda: pool.run("import time\ntime.sleep(60)"), PoolError)
    time.sleep(0.5)
    for pid in _stopped(pool):
        started = time.monotonic()
        pool.close(timeout=2)
        assert time.monotonic() - started < 3.5
        assert _gone(pid)
    busy.join(timeout=10)
    assert not busy.is_alive() and errors  # the run in flight ended with the pool, and said so


def test_a_session_close_on_a_stopped_pool_returns_within_its_timeout() -> None:
    with Pool(workers=1) as pool:
        session = pool.session()
        session.run("x = 1")
        for _ in _stopped(pool):
            started = time.monotonic()
            session.close(timeout=2)
            assert time.monotonic() - started < 3.5


def test_a_request_over_the_line_limit_fails_at_once_with_the_reason() -> None:
    with Pool(workers=1) as pool:
        code = "# padding\n" * (2 * 1024 * 1024 // 10) + "print(1)"
        started = time.monotonic()
        with pytest.raises(RequestError, match="1 MiB"):
            pool.run(code, timeout="1s")
        assert time.monotonic() - started < 2
        assert pool.run("print('still')").stdout == "still\n"


def _data(tmp_path: Path) -> tuple[Path, Path]:
    data = tmp_path / "data"
    data.mkdir()
    (data / "secret.txt").write_text("granted")
    return data, data / "secret.txt"


def _confined_as_first(result_policy: dict[str, object], data: Path) -> None:
    assert result_policy["allow_read"] == [str(data)]
    assert result_policy["memory_bytes"] == 256 * 1024 * 1024 and result_policy["timeout_ms"] == 5000


def test_a_session_closed_for_idleness_comes_back_with_its_own_grants_and_says_its_state_is_gone(
        tmp_path: Path) -> None:
    data, secret = _data(tmp_path)
    with Pool(workers=1, session_idle="1s") as pool:
        session = pool.session(allow_read=[data], memory="256m", timeout="5s")
        first = session.run(f"x = open({str(secret)!r}).read()\nprint(x)")
        assert first.stdout == "granted\n" and not first.session_reopened
        time.sleep(3)  # past session_idle and the reaper's next look
        after = session.run(f"print(open({str(secret)!r}).read())\nprint('x' in globals())")
        assert after.stdout == "granted\nFalse\n", after.text
        _confined_as_first(after.policy, data)
        assert after.session_reopened and "gone" in after.text
        assert session.run("print('next')").session_reopened is None


def test_a_session_after_a_pool_restart_comes_back_with_its_own_grants(tmp_path: Path) -> None:
    data, secret = _data(tmp_path)
    with Pool(workers=1) as pool:
        run_python = pool.tool(session=True, allow_read=[data], memory="256m", timeout="5s")
        assert run_python("x = 41") == "(The code ran without printing anything. Use print() to show results.)"
        assert pool._process is not None
        os.kill(pool._process.popen.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while not pool._process.dead and time.monotonic() < deadline:
            time.sleep(0.05)
        text = run_python(f"print(open({str(secret)!r}).read())")
        note, _, printed = text.partition("\n")
        assert printed == "granted" and "gone" in note and "restarted" in note, text
        assert run_python("x = 42\nprint(x)") == "42"
