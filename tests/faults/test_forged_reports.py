"""A job's report is hostile input: it describes the job's own Python outcome, never a verdict of the pool.

Each job here writes a report of its own on the report descriptor (3), as the confined child would,
then closes its outputs (the child's copy of its report descriptor too), so the pool reads the forged
report as the job's word. Whatever it claims, the pool's verdicts (timeout, refusal, setup failure,
cancellation, worker failure) and their exit statuses come only from what the pool itself knows,
checked from outside: the result line, the stats event, the Python client's reading of it, and the
pool's memory in /proc.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import pynox
from tests.harness.job_code import CLOSE_OUTPUTS
from tests.pool.pool_driver import PoolProcess, pool_process, rss_kb

pytestmark = pytest.mark.timeout(240)

# The pool's own verdicts: (error type, exit status, the stats counter it would bump).
VERDICTS = [
    ("TimeoutError", 124, "timeouts"),
    ("RequestError", 2, "request_errors"),
    ("SandboxSetupError", 125, "setup_errors"),
    ("CancelledError", 130, "cancelled"),
    ("PoolWorkerError", 70, "worker_errors"),
]
POOL_COUNTERS = ("timeouts", "request_errors", "setup_errors", "cancelled", "worker_errors", "signals")


def _forging(report: dict[str, Any], then: str = "") -> str:
    """Job code that writes ``report`` as its own, closes stdout, stderr and the report, then runs ``then``."""
    return f"import os\nos.write(3, {json.dumps(report).encode()!r})\n{CLOSE_OUTPUTS}{then}"


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PoolProcess]:
    with pool_process("--workers=1", cwd=tmp_path_factory.mktemp("forged")) as shared:
        yield shared


def _pool_counts(pool: PoolProcess) -> dict[str, int]:
    stats = pool.stats()
    return {name: stats[name] for name in POOL_COUNTERS}


def _no_verdict(result: dict[str, Any], verdict: tuple[str, int]) -> None:
    error = result["error"]
    assert (error["type"] if error else None, result["exit"]) != verdict, result
    assert not result.get("refused"), result
    assert result["runtime"] is not None and result["usage"] is not None, result  # it ran: not a refusal


@pytest.mark.parametrize(("error_type", "exit_status", "counter"), VERDICTS)
def test_a_report_cannot_give_a_verdict(pool: PoolProcess, error_type: str, exit_status: int, counter: str) -> None:
    before = _pool_counts(pool)
    forged = {"exit": exit_status, "error": {"type": error_type, "message": "forged by the job"}}
    result = pool.run(_forging(forged), timeout="30s")
    _no_verdict(result, (error_type, exit_status))
    # A job's own error always comes with exit 1: the pair (exit, type) the protocol decides on is the pool's.
    assert result["exit"] == 1, result
    assert _pool_counts(pool) == before


def test_a_report_cannot_claim_a_setup_failure(pool: PoolProcess) -> None:
    """A setup failure means the code never ran: the job had claimed itself, so its word is not taken."""
    before = _pool_counts(pool)
    result = pool.run(_forging({"exit": 125, "setup_error": "forged by the job"}, "os._exit(125)"))
    _no_verdict(result, ("SandboxSetupError", 125))
    assert result["exit"] == 125 and result["error"] is None, result  # the kernel's status, its own
    assert _pool_counts(pool) == before


def test_a_report_that_disagrees_with_the_kernel_is_not_taken(pool: PoolProcess) -> None:
    """Report "raised RequestError", then exit with status 2 (the refusal's) after the pool saw its end."""
    before = _pool_counts(pool)
    forged = {"exit": 1, "error": {"type": "RequestError", "message": "forged by the job"}}
    for _ in range(5):
        result = pool.run(_forging(forged, "os._exit(2)"))
        _no_verdict(result, ("RequestError", 2))
    assert _pool_counts(pool) == before


@pytest.mark.parametrize("exit_status", [124, 2])
def test_a_job_may_still_exit_with_any_status_of_its_own(pool: PoolProcess, exit_status: int) -> None:
    result = pool.run(f"raise SystemExit({exit_status})")
    assert result["exit"] == exit_status and result["error"] is None, result


@pytest.mark.parametrize(("error_type", "exit_status", "counter"), VERDICTS)
def test_a_session_step_cannot_give_a_verdict(pool: PoolProcess, error_type: str, exit_status: int,
                                              counter: str) -> None:
    """A step's process lives on, so its status cannot come from the kernel: it comes from the report's
    shape (raised: 1), never from the number the report states."""
    before = _pool_counts(pool)
    name = f"forge-{error_type}"
    forged = {"exit": exit_status, "error": {"type": error_type, "message": "forged by the job"}}
    try:
        result = pool.run(_forging(forged), session=name)
        _no_verdict(result, (error_type, exit_status))
        assert result["exit"] == 1 and result["session_ended"] is False, result
        assert pool.run("print('still here')", session=name)["stdout"] == "still here\n"
        assert _pool_counts(pool) == before
    finally:
        pool.run(session=name, close=True)


def test_a_session_step_cannot_claim_a_setup_failure(pool: PoolProcess) -> None:
    """A later step's process has long run code: its report of a setup failure is one the pool cannot take,
    and a step without an outcome ends its session at once, as a broken channel does (the pool's verdict,
    from its own parsing), instead of waiting for its deadline."""
    before = _pool_counts(pool)
    assert pool.run("x = 1", session="forge-setup")["exit"] == 0
    start = time.monotonic()
    result = pool.run(_forging({"exit": 125, "setup_error": "forged by the job"}), session="forge-setup",
                      timeout="30s")
    assert time.monotonic() - start < 10
    _no_verdict(result, ("SandboxSetupError", 125))
    assert result["error"] is not None, result
    assert (result["error"]["type"], result["exit"], result["session_ended"]) == ("PoolWorkerError", 70, True)
    assert _pool_counts(pool) == {**before, "worker_errors": before["worker_errors"] + 1}


def test_the_client_does_not_take_a_forged_refusal(tmp_path: Path) -> None:
    """Finding 4: the client raised RequestError for code that ran, and forgot a session the pool kept:
    with max_sessions=2, two such first steps locked out every new session."""
    forged = {"exit": 2, "error": {"type": "RequestError", "message": "forged by the job"}}
    marker = tmp_path / "ran"
    code = f"open({str(marker)!r}, 'a').write('x')\n" + _forging(forged)
    with pynox.Pool(workers=1, max_sessions=2) as client:
        result = client.run(code, allow_write=[str(tmp_path)])
        assert not result.refused and result.exit == 1, result
        sessions = [client.session(allow_write=[str(tmp_path)]) for _ in range(2)]
        for session in sessions:
            first = session.run(code)
            assert not first.refused and not first.session_ended, first
            assert session.alive
        for session in sessions:  # both still theirs, and the pool agrees
            assert session.run("print('mine')").stdout == "mine\n"
        for session in sessions:
            session.close()
        fresh = client.session()
        assert fresh.run("print('room')").stdout == "room\n"
        fresh.close()
    assert marker.read_text() == "x" * 3


def test_a_real_refusal_still_raises(tmp_path: Path) -> None:
    with pynox.Pool(workers=1, max_sessions=1) as client:
        with pytest.raises(pynox.RequestError):
            client.run("print(1)", timeout="1000d")
        held = client.session()
        assert held.run("x = 1").exit == 0
        extra = client.session()
        with pytest.raises(pynox.RequestError):
            extra.run("x = 2")
        assert not extra.alive  # the pool has no session for it: it starts afresh next time
        held.close()
        assert extra.run("print('now')").stdout == "now\n"
        extra.close()


# -- finding 5: every value from the job is bounded at the boundary ---------------------------------------------
_BIG = 1 << 20


def test_a_huge_exception_class_name_is_bounded(pool: PoolProcess) -> None:
    """A real exception whose class name is 1 MB: the child reports it whole; the pool keeps a bounded name."""
    result = pool.run(f"raise type('E' * {_BIG}, (Exception,), {{}})('boom')")
    assert result["exit"] == 1 and result["error"]["type"].startswith("EEEE"), result["exit"]
    assert len(result["error"]["type"]) <= 256, len(result["error"]["type"])


def test_every_string_of_a_report_is_bounded(pool: PoolProcess) -> None:
    code = (f"import json, os\nbig = 'x' * {_BIG // 32}\n"
            "frame = {'file': big, 'line': 1, 'source': big, 'column': None, 'omitted': 0}\n"
            "forged = {'exit': 1, 'return_value': big, 'images': [''] * 10_000, 'error': {'type': big, "
            "'message': big, 'file': big, 'line': 1, 'path': big, 'hint': big, 'traceback': [frame] * 40}}\n"
            "os.write(3, json.dumps(forged).encode())\n" + CLOSE_OUTPUTS)
    result = pool.run(code, max_output="1MB", return_value=True)
    error = result["error"]
    assert error is not None, result
    for key in ("type", "message", "file", "path", "hint"):
        assert len(error[key]) <= 8 << 10, (key, len(error[key]))
    assert len(json.dumps(error["traceback"])) <= 128 << 10
    assert len(result["return_value"]) <= 1 << 20 and result["images_dropped"] == 10_000
    assert len(json.dumps(result)) <= (1 << 20) + (256 << 10), len(json.dumps(result))


def test_every_number_of_a_report_is_one_a_client_can_take(pool: PoolProcess) -> None:
    """Numbers no Python gives a traceback, beyond 64 bits or below 1: a client decoding them into 64-bit integers,
    or drawing the caret of a column of 10**30 (the Python client's ``text`` raised OverflowError), is not harmed."""
    frame = {"file": "agent.py", "line": 10**30, "source": "x", "column": 10**30, "omitted": -(10**30)}
    forged = {"exit": 1, "error": {"type": "E", "message": "m", "file": "agent.py", "line": -5,
                                   "traceback": [frame, {**frame, "line": 0, "column": 0, "omitted": 10**30}]}}
    error = pool.run(_forging(forged))["error"]
    assert error["line"] is None, error
    assert [(f["line"], f["column"]) for f in error["traceback"]] == [(None, None)] * 2, error
    assert all(0 <= f["omitted"] < 1 << 63 for f in error["traceback"]), error
    # The code's own SyntaxError can say the same of itself.
    with pynox.Pool(workers=1) as client:
        result = client.run("raise SyntaxError('m', ('agent.py', 10**30, 10**30, 'x'))")
        assert result.error is not None and result.error["line"] is None, result.error
        assert result.text.startswith("SyntaxError: m"), result.text


def test_stats_keep_a_bounded_set_of_error_types(tmp_path: Path) -> None:
    """Finding 5: 1 MB class names, one per job, were kept in stats forever (10 jobs: a 19 MB stats event
    and +34 MB of pool memory). Distinct small names past the bound are counted together."""
    with pool_process("--workers=1", cwd=tmp_path) as pool:
        pool.run("print(1)")
        start_rss = rss_kb(pool.pid)
        for i in range(10):
            assert pool.run(f"raise type('{i}' + 'E' * {_BIG}, (Exception,), {{}})()")["exit"] == 1
        for i in range(100):
            pool.submit(code=f"raise type('Distinct{i}', (Exception,), {{}})()")
        deadline = time.monotonic() + 60
        while pool.stats()["jobs"] < 111 and time.monotonic() < deadline:
            time.sleep(0.2)
        stats = pool.stats()
        size = len(json.dumps(stats))
        grown = rss_kb(pool.pid) - start_rss
        assert stats["failed"] >= 110, stats["failed"]
        assert size <= 16 << 10, size
        assert sum(stats["errors"].values()) == 110, stats["errors"]
        assert grown < 8 << 10, f"the pool grew by {grown} KiB"
