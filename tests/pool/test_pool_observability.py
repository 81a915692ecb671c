"""Observability: the stats answer and ``--log=json``."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from .pool_driver import PoolProcess, new_id, pool_process

pytestmark = pytest.mark.timeout(90)

STATS_FIELDS = {"id", "event", "uptime_ms", "workers", "sessions_active", "jobs", "ok", "failed", "timeouts",
                "signals", "request_errors", "worker_errors", "duration_ms_total", "queue_us_total", "errors",
                "host_calls"}
# Disjoint outcome counters: every finished request is exactly one of them.
OUTCOMES = ("ok", "failed", "timeouts", "signals", "request_errors", "worker_errors")
SECRET = "s3cr3t-" + new_id("log")


@pytest.fixture(scope="module")
def logged(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PoolProcess]:
    with pool_process("--workers=2", "--log=json", cwd=tmp_path_factory.mktemp("logged")) as pool:
        yield pool


def _outcome_sum(stats: dict[str, object]) -> int:
    extra = [k for k in stats if k.endswith("_errors") and k not in OUTCOMES]  # e.g. setup_errors
    return sum(int(stats[k]) for k in (*OUTCOMES, *extra))  # type: ignore[call-overload]


def test_stats_of_a_fresh_pool(tmp_path: Path) -> None:
    with pool_process("--workers=3", cwd=tmp_path) as pool:
        stats = pool.stats()
        assert set(stats) >= STATS_FIELDS, STATS_FIELDS - set(stats)
        assert stats["event"] == "stats" and stats["workers"] == 3
        assert {k: stats[k] for k in ("jobs", *OUTCOMES, "sessions_active", "host_calls")} == dict.fromkeys(
            ("jobs", *OUTCOMES, "sessions_active", "host_calls"), 0)
        assert stats["errors"] == {}
        assert isinstance(stats["uptime_ms"], int) and stats["uptime_ms"] >= 0


def test_every_counter_after_a_known_mix_of_jobs(logged: PoolProcess) -> None:
    before = logged.stats()
    ok = [logged.run("print(1)") for _ in range(3)]
    name_error = logged.run("undefined_name")
    exit_non_zero = logged.run("raise SystemExit(4)")
    permission = logged.run("open('/etc/passwd').read()")
    timeout = logged.run("while True:\n    pass", timeout="300ms")
    signalled = logged.run("import os\nos.abort()")
    refused = [logged.run("print(1)", bogus=True), logged.run(script="missing.py")]
    assert [r["error"]["type"] for r in refused] == ["RequestError", "RequestError"]
    host = logged.run("from pynox_host import f\nf()\nf()", host={"f": lambda: None})
    assert [r["error"] for r in ok] == [None] * 3 and host["exit"] == 0
    assert (name_error["error"]["type"], exit_non_zero["exit"], permission["error"]["type"]) == (
        "NameError", 4, "PermissionError")
    assert (timeout["error"]["type"], signalled["error"]["type"]) == ("TimeoutError", "SignalError")
    logged.run(session="counted", code="x = 1")
    stats = logged.stats()
    delta = {k: stats[k] - before[k] for k in ("jobs", *OUTCOMES, "host_calls")}
    assert delta == {"jobs": 11 + 1, "ok": 4 + 1, "failed": 3, "timeouts": 1, "signals": 1, "request_errors": 2,
                     "worker_errors": 0, "host_calls": 2}
    assert stats["sessions_active"] == before["sessions_active"] + 1
    assert _outcome_sum(stats) == stats["jobs"]
    errors_delta = {k: v - before["errors"].get(k, 0) for k, v in stats["errors"].items()
                    if v != before["errors"].get(k, 0)}
    assert errors_delta == {"NameError": 1, "PermissionError": 1, "TimeoutError": 1, "SignalError": 1,
                            "RequestError": 2}
    assert stats["duration_ms_total"] - before["duration_ms_total"] >= 300  # the timeout alone
    assert stats["queue_us_total"] >= before["queue_us_total"]
    assert stats["uptime_ms"] >= before["uptime_ms"]
    logged.run(session="counted", close=True)
    assert logged.stats()["sessions_active"] == before["sessions_active"]


def test_stats_answers_at_once_and_runs_nothing(logged: PoolProcess) -> None:
    busy = [logged.submit(code="import time\ntime.sleep(2)") for _ in range(2)]
    before = logged.stats()
    started = time.monotonic()
    stats = logged.stats()
    assert time.monotonic() - started < 1.0
    assert logged.responses(busy[0]) == [] and logged.responses(busy[1]) == []
    assert stats["jobs"] == before["jobs"]  # a stats request is not a job
    for request_id in busy:
        logged.result(request_id)


def test_stats_echoes_its_id(logged: PoolProcess) -> None:
    for request_id in ("s1", 17, 2.5):
        logged.send({"id": request_id, "stats": True})
        answer = logged.result(request_id)
        assert answer["event"] == "stats" and type(answer["id"]) is type(request_id)


def test_stats_with_other_fields_is_a_request_error(logged: PoolProcess) -> None:
    result = logged.run("print(1)", stats=True)
    assert result["error"]["type"] == "RequestError"


# --- --log=json -----------------------------------------------------------------------------------------

LOG_FIELDS = {"ts_ms", "event", "id", "session", "step", "exit", "error", "message", "duration_ms", "queue_us",
              "network", "truncated"}


def _log_for(pool: PoolProcess, request_id: object, deadline: float = 5.0) -> dict[str, object]:
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        lines = [line for line in pool.log_lines() if line.get("event") == "job" and line.get("id") == request_id]
        if lines:
            assert len(lines) == 1, lines
            return lines[0]
        time.sleep(0.02)
    raise AssertionError(f"no log line for {request_id}: {bytes(pool.stderr[-1000:])!r}")


def test_log_json_writes_one_line_per_finished_job_without_output_or_code(logged: PoolProcess) -> None:
    code = f"import sys\nprint({SECRET!r})\nprint({SECRET!r}, file=sys.stderr)\nopen('/etc/passwd')"
    result = logged.run(code, allow_network=True)
    assert SECRET in result["stdout"] and SECRET in result["stderr"]
    line = _log_for(logged, result["id"])
    assert set(line) >= LOG_FIELDS, LOG_FIELDS - set(line)
    assert line["event"] == "job"
    assert (line["session"], line["step"]) == (None, None)
    assert (line["exit"], line["error"]) == (1, "PermissionError")
    assert "/etc/passwd" in str(line["message"])
    assert line["duration_ms"] == result["duration_ms"] and line["queue_us"] == result["queue_us"]
    assert line["network"] == "allow" and line["truncated"] is False
    assert isinstance(line["ts_ms"], int) and abs(line["ts_ms"] / 1000 - time.time()) < 60
    assert SECRET.encode() not in bytes(logged.stderr), "captured output or code reached the log"


def test_log_json_never_carries_host_call_arguments_or_results(logged: PoolProcess) -> None:
    result = logged.run(f"from pynox_host import lookup\nlookup({SECRET!r}, key={SECRET!r})",
                        host={"lookup": lambda *a, **k: SECRET})
    assert result["exit"] == 0, result
    _log_for(logged, result["id"])
    assert SECRET.encode() not in bytes(logged.stderr)


def test_log_lines_for_ok_truncated_and_refused_jobs(logged: PoolProcess) -> None:
    ok = logged.run("print(1)")
    truncated = logged.run("print('x' * 100)", max_output=10)
    refused = logged.run("print(1)", bogus=1)
    assert _log_for(logged, ok["id"])["error"] is None
    assert _log_for(logged, ok["id"])["exit"] == 0
    assert _log_for(logged, truncated["id"])["truncated"] is True
    assert _log_for(logged, refused["id"])["error"] == "RequestError"


def test_log_lines_of_session_steps_carry_session_and_step(logged: PoolProcess) -> None:
    first = logged.run(session="logged-notebook", code=f"x = {SECRET!r}")
    second = logged.run(session="logged-notebook", code="print(x)")
    assert second["stdout"] == SECRET + "\n"
    assert (_log_for(logged, first["id"])["session"], _log_for(logged, first["id"])["step"]) == ("logged-notebook", 1)
    assert (_log_for(logged, second["id"])["session"], _log_for(logged, second["id"])["step"]) == ("logged-notebook", 2)
    logged.run(session="logged-notebook", close=True)
    assert SECRET.encode() not in bytes(logged.stderr)


def test_without_log_json_stderr_has_no_job_lines(pool: PoolProcess) -> None:
    pool.run("print(1)")
    assert [line for line in pool.log_lines() if line.get("event") == "job"] == []
