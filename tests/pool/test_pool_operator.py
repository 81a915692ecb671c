"""What an operator sees: a log event, with its cause, for every template that dies and the one that replaces
it; and the pool process's own ``process_*`` metrics, checked against /proc from outside."""

from __future__ import annotations

import os
import re
import signal
import tempfile
import time
from pathlib import Path

import pytest

from tests.harness import procfs
from tests.harness.scrape import metrics_text

from .pool_driver import DEADLINE, pool_process

pytestmark = pytest.mark.timeout(120)


def test_a_template_death_is_logged_with_its_cause(tmp_path: Path) -> None:
    with pool_process("--workers=1", "--log=json", cwd=tmp_path) as pool:
        [template] = pool.templates()
        os.kill(template, signal.SIGKILL)
        assert pool.run("print(1)")["stdout"] == "1\n"  # on a replacement
        [replacement] = pool.templates()
        os.kill(replacement, signal.SIGKILL)  # the replacement dies too: each death has its own line
        assert pool.run("print(2)")["stdout"] == "2\n"
        assert pool.finish() == 0
    events = [line for line in pool.log_lines() if line.get("event") in ("template_died", "template_replaced")]
    died = [line["message"] for line in events if line["event"] == "template_died"]
    replaced = [line["message"] for line in events if line["event"] == "template_replaced"]
    assert len(died) == 2 and len(replaced) == 2, events
    assert f"template {template} was killed by SIGKILL" in died[0], died
    assert f"template {replacement} was killed by SIGKILL" in died[1], died
    assert f"template {replacement} started" in replaced[0], replaced
    assert [line["event"] for line in events] == ["template_died", "template_replaced"] * 2


def _scrape(path: Path) -> str:
    return metrics_text(path, DEADLINE)


def test_process_metrics_are_the_pools_own(tmp_path: Path) -> None:
    run = Path(tempfile.mkdtemp(prefix="pynox-metrics-", dir=tmp_path))
    path = run / "metrics.sock"
    with pool_process("--workers=1", f"--metrics-socket={path}", cwd=tmp_path) as pool:
        assert pool.run("print(1)")["exit"] == 0
        # Once its result has left, the pool makes the next job's descriptors (ten at once, see
        # templates.after_result): counted from outside before and by the pool after, they differed by nine.
        settled, end = -1, time.monotonic() + DEADLINE
        while (now := len(procfs.fds(pool.pid))) != settled and time.monotonic() < end:
            settled = now
            time.sleep(0.2)
        text = _scrape(path)
        values = {name: float(value) for name, value in re.findall(r"^(process_[a-z_]+) (\S+)$", text, re.M)}
        for name in ("process_cpu_seconds_total", "process_resident_memory_bytes", "process_virtual_memory_bytes",
                     "process_open_fds", "process_max_fds", "process_start_time_seconds"):
            assert f"# TYPE {name} " in text and name in values, name
        # From outside: the same process's figures, as /proc shows them to anyone.
        resident = procfs.statm_pages(pool.pid)[1] * os.sysconf("SC_PAGE_SIZE")
        assert 0.7 * resident <= values["process_resident_memory_bytes"] <= 1.3 * resident, (values, resident)
        fds = len(procfs.fds(pool.pid))
        assert abs(values["process_open_fds"] - fds) <= 3, (values, fds)
        started = procfs.started(pool.pid)  # about when the process started
        assert abs(values["process_start_time_seconds"] - time.time()) < 600
        assert values["process_start_time_seconds"] <= started + 5
        assert pool.finish() == 0


def test_traceparent_is_carried_into_the_log_line(tmp_path: Path) -> None:
    trace = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    with pool_process("--workers=1", "--log=json", cwd=tmp_path) as pool:
        assert pool.run("print(1)", id="traced", traceparent=trace)["exit"] == 0
        assert pool.run("print(2)", id="plain")["exit"] == 0  # the control: no trace, no field
        bad = pool.run("print(3)", id="bad", traceparent="00-" + "0" * 32 + "-00f067aa0ba902b7-01")
        assert bad["error"]["type"] == "RequestError" and "traceparent" in bad["error"]["message"], bad
        assert pool.finish() == 0
    jobs = {line["id"]: line for line in pool.log_lines() if line.get("event") == "job"}
    assert jobs["traced"]["traceparent"] == trace
    assert jobs["plain"]["traceparent"] is None and jobs["plain"]["tenant"] is None


def test_sessions_opened_closed_and_expired_are_counted(tmp_path: Path) -> None:
    with pool_process("--workers=1", "--session-idle=1s", cwd=tmp_path) as pool:
        assert pool.run("x = 1", session="kept")["exit"] == 0
        assert pool.run("x = 2", session="idle")["exit"] == 0
        assert pool.run(session="kept", close=True)["closed"] is True
        end = time.monotonic() + DEADLINE
        while (stats := pool.stats())["sessions_active"]:  # the idle one is closed by the pool, seen from outside
            assert time.monotonic() < end, stats
            time.sleep(0.2)
        assert (stats["sessions_opened"], stats["sessions_closed"], stats["sessions_expired"]) == (2, 2, 1), stats
        assert pool.finish() == 0


def test_spans_when_the_operator_asks_for_them(tmp_path: Path) -> None:
    """OTEL_TRACES_EXPORTER=console: one span per result on stderr, a child of the request's traceparent (a root
    without one), with its labels and error; the control, the same pool without the variable, writes none."""
    pytest.importorskip("opentelemetry.sdk", reason="opentelemetry-sdk is not installed")
    trace = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    runs = {}
    for asked in (True, False):
        env = {**os.environ, "OTEL_TRACES_EXPORTER": "console"} if asked else {
            k: v for k, v in os.environ.items() if k != "OTEL_TRACES_EXPORTER"}
        with pool_process("--workers=1", cwd=tmp_path, env=env) as pool:
            seen = pool.run("import os\nprint(os.environ.get('OTEL_TRACES_EXPORTER'))", id="traced",
                            traceparent=trace)
            assert seen["stdout"] == "None\n"  # the pool's environment never reaches a job
            assert pool.run("raise ValueError('no')", id="plain")["exit"] == 1
            assert pool.run("x = 1", id="step", session="nb")["exit"] == 0
            assert pool.finish() == 0
        runs[asked] = {line["attributes"]["pynox.id"]: line for line in pool.log_lines()
                       if str(line.get("name", "")).startswith("pynox.")}
    assert runs[False] == {}
    spans = runs[True]
    assert set(spans) == {"traced", "plain", "step"}, spans
    traced, plain, step = spans["traced"], spans["plain"], spans["step"]
    assert (traced["name"], traced["context"]["trace_id"], traced["parent_id"]) == (
        "pynox.job", "0x4bf92f3577b34da6a3ce929d0e0e4736", "0x00f067aa0ba902b7")
    assert traced["attributes"]["pynox.exit"] == 0 and traced["attributes"]["pynox.tenant"] == "default"
    assert plain["parent_id"] is None and plain["context"]["trace_id"] != traced["context"]["trace_id"]
    assert plain["status"]["status_code"] == "ERROR" and plain["attributes"]["error.type"] == "ValueError"
    assert (step["name"], step["attributes"]["pynox.session"], step["attributes"]["pynox.step"]) == (
        "pynox.session.step", "nb", 1)
    assert traced["resource"]["attributes"]["service.name"] == "pynox"
