"""``--log=json``: every line the pool writes on stderr is a JSON object, from start to exit, start-up
errors and what a template prints included; ``--log-redact`` leaves the jobs' error messages out."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest

from .pool_driver import PoolProcess


def _every_line_json(stderr: bytes) -> list[dict[str, Any]]:
    lines = [raw for raw in stderr.splitlines() if raw.strip()]
    parsed = []
    for raw in lines:
        try:
            value = json.loads(raw)
        except ValueError:
            raise AssertionError(f"a stderr line is not JSON: {raw!r}") from None
        assert isinstance(value, dict), raw
        parsed.append(value)
    return parsed


def test_every_stderr_line_is_json_from_start_to_exit(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "chatty.py").write_text("import sys\nprint('chatty preload says hello', file=sys.stderr)\n")
    config = tmp_path / "pynox.toml"
    # A profile wider than the ceiling: a config warning at start.
    config.write_text('[pool.limits]\ntimeout = "10s"\n[profiles.wide]\ntimeout = "20s"\n')
    with PoolProcess("--workers=1", "--log=json", f"--config={config}", f"--package-dir={site}",
                       "--preload=chatty", cwd=tmp_path) as pool:
        assert pool.run("print(1)")["stdout"] == "1\n"
        pool.proc.send_signal(signal.SIGHUP)
        pool.proc.send_signal(signal.SIGTERM)
        assert pool.wait_exit() == 0
    lines = _every_line_json(bytes(pool.stderr))
    events = [line.get("event") for line in lines]
    for event in ("start", "config_warning", "ready", "signal", "drain", "exit"):
        assert event in events, (event, lines)
    assert events.index("start") < events.index("ready") < events.index("drain") < events.index("exit")
    (exit_line,) = [line for line in lines if line.get("event") == "exit"]
    assert exit_line["status"] == 0 and exit_line["pid"] == pool.pid
    assert any("chatty preload says hello" in line.get("message", "") for line in lines), lines
    assert any(line.get("exit") == 0 and "id" in line for line in lines)  # the job's own line


@pytest.mark.parametrize("args", [["--config=/nonexistent/pynox.toml"], ["--workers=0"],
                                  ["--preload=no_such_module_anywhere"]])
def test_a_start_up_error_is_json_too(tmp_path: Path, args: list[str]) -> None:
    with PoolProcess("--log=json", *args, cwd=tmp_path, expect_ready=False) as pool:
        assert pool.wait_exit() == 1
    lines = _every_line_json(bytes(pool.stderr))
    errors = [line for line in lines if line.get("event") == "start_error"]
    assert len(errors) == 1 and errors[0]["message"], lines


@pytest.mark.parametrize("redact", [False, True])
def test_log_redact_leaves_the_jobs_messages_out(tmp_path: Path, redact: bool) -> None:
    secret = "the-customer-number-4711"
    with PoolProcess("--workers=1", "--log=json", *(["--log-redact"] if redact else []), cwd=tmp_path) as pool:
        result = pool.run(f"raise ValueError({secret!r})")
        assert result["error"]["message"] == secret  # the result itself is the client's: it is whole
    lines = _every_line_json(bytes(pool.stderr))
    (job,) = [line for line in lines if line.get("id") == result["id"]]
    assert job["error"] == "ValueError"
    assert (secret in bytes(pool.stderr).decode()) is not redact, lines
