"""A job that never ran never fails; deadlines never wait on a stopped process; input is strict.

Templates are killed and stopped from outside, as an operator's fault test would. A job is proven to
have run (or not) from the host: each writes a marker file.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from tests.harness.job_code import CLOSE_OUTPUTS
from tests.pool.pool_driver import PoolProcess, descendants, pool_process, proc_table, wait_gone, zygotes

pytestmark = pytest.mark.timeout(120)


def _templates(pool: PoolProcess) -> list[int]:
    table = proc_table()
    return sorted(pid for pid, depth in descendants(pool.pid, table).items()
                  if depth == 1 and table[pid][3] == "pynox-template")


def _prepared_children(pool: PoolProcess) -> list[int]:
    table = proc_table()
    return [pid for pid, depth in descendants(pool.pid, table).items() if depth == 2 and table[pid][3] == "pynox-ready"]


def _marker_job(directory: Path, name: str) -> dict[str, object]:
    return {"code": f"open({str(directory / name)!r}, 'w').write('ran')\nprint('ran')",
            "allow_write": [str(directory)]}


def test_a_job_sent_to_a_template_killed_while_idle_runs_once_on_a_fresh_one(tmp_path: Path) -> None:
    markers = tmp_path / "markers"
    markers.mkdir()
    # A template with pandas loaded takes long enough to die that the job is often already sent to it.
    with pool_process("--workers=2", "--preload=pandas", cwd=tmp_path) as pool:
        for round_ in range(5):
            assert pool.run("pass")["exit"] == 0
            victim = _templates(pool)[0]
            os.kill(victim, signal.SIGKILL)
            ids = [pool.submit(**_marker_job(markers, f"{round_}-{i}")) for i in range(4)]
            results = [pool.result(request_id, timeout=60) for request_id in ids]
            for i, result in enumerate(results):
                assert result["exit"] == 0, result["error"]  # none of them had run: none may fail
                assert (markers / f"{round_}-{i}").read_text() == "ran"
            end = time.monotonic() + 10
            while victim in _templates(pool):
                assert time.monotonic() < end
                time.sleep(0.02)


def test_a_replacement_template_killed_while_it_starts_costs_no_job(tmp_path: Path) -> None:
    markers = tmp_path / "markers"
    markers.mkdir()
    with pool_process("--workers=1", "--preload=pandas", cwd=tmp_path) as pool:
        (first,) = _templates(pool)
        # The zygote too: a template forked from it starts in milliseconds, one from a new zygote imports pandas.
        (zygote,) = zygotes(pool.pid)
        os.kill(first, signal.SIGKILL)
        os.kill(zygote, signal.SIGKILL)
        assert wait_gone([first, zygote], 5) == []
        request_id = pool.submit(**_marker_job(markers, "job"))
        # The worker starts a replacement for the job (a new zygote, named a template until it is ready, to fork
        # it from): kill it while it imports pandas.
        end = time.monotonic() + 20
        while not [pid for pid in _templates(pool) if pid != first]:
            assert time.monotonic() < end, "no replacement template started"
            time.sleep(0.005)
        (replacement,) = [pid for pid in _templates(pool) if pid != first]
        os.kill(replacement, signal.SIGKILL)
        result = pool.result(request_id, timeout=60)
        assert result["exit"] == 0, result
        assert (markers / "job").read_text() == "ran"


def test_a_template_dying_during_the_first_preload_is_replaced(tmp_path: Path) -> None:
    pool = PoolProcess("--workers=1", "--preload=pandas", cwd=tmp_path, expect_ready=False)
    try:
        end = time.monotonic() + 20
        while not _templates(pool):
            assert time.monotonic() < end, "no template started"
            time.sleep(0.005)
        os.kill(_templates(pool)[0], signal.SIGKILL)
        ready = pool.wait_for(lambda m: True, timeout=60)
        assert ready["event"] == "ready", ready
        assert pool.run("import pandas; print('ok')")["stdout"] == "ok\n"
        assert pool.finish() == 0
    finally:
        pool.kill()


def test_a_timeout_is_answered_at_its_deadline_even_if_the_template_is_stopped(tmp_path: Path) -> None:
    with pool_process("--workers=1", cwd=tmp_path) as pool:
        (template,) = _templates(pool)
        start = time.monotonic()
        request_id = pool.submit(code="import time\nprint('started', flush=True)\ntime.sleep(20)", timeout="2s")
        time.sleep(0.5)
        os.kill(template, signal.SIGSTOP)
        try:
            result = pool.result(request_id, timeout=15)
            elapsed = time.monotonic() - start
        finally:
            time.sleep(3.5)  # the template stays stopped for 4 s in all
            os.kill(template, signal.SIGCONT)
        assert result["error"]["type"] == "TimeoutError", result
        assert elapsed < 3.5, f"the timeout was answered after {elapsed:.1f}s"
        assert pool.run("print('after')")["stdout"] == "after\n"


def test_a_session_killed_while_idle_does_not_blame_the_next_step(tmp_path: Path) -> None:
    with pool_process("--workers=1", "--max-sessions=1", cwd=tmp_path) as pool:
        assert pool.run("x = 1", session="idle")["exit"] == 0
        table = proc_table()
        (child,) = [pid for pid in descendants(pool.pid, table) if table[pid][3] == "pynox-session"]
        os.kill(child, signal.SIGKILL)
        time.sleep(0.3)
        result = pool.run("print('step')", session="idle")
        assert result["error"]["type"] != "SignalError" and "memory" not in (result["error"]["hint"] or ""), result
        assert "did not run" in result["error"]["message"] and result["session_ended"] is True, result
        # Its slot is free: a new session starts, under this name or another.
        assert pool.run("print('new')", session="other")["stdout"] == "new\n"


# -- strict input -------------------------------------------------------------------------------------------


def test_a_reply_with_neither_result_nor_error_is_refused_and_the_call_stays_pending(tmp_path: Path) -> None:
    with pool_process("--workers=1", cwd=tmp_path) as pool:
        request_id = pool.submit(code="from pynox_host import f\nprint(f())", functions=["f"])
        call = pool.wait_for(lambda m: m.get("event") == "call" and m.get("id") == request_id)
        pool.send({"reply": {"call_id": call["call_id"]}})
        refused = pool.wait_for(lambda m: m.get("id") is None and m.get("error", {}).get("type") == "RequestError")
        assert "give a result or an error" in refused["error"]["message"], refused
        pool.reply(call["call_id"], result="answered")
        assert pool.result(request_id)["stdout"] == "answered\n"


@pytest.mark.parametrize("line", [
    b'{"id": "d1", "code": "print(1)", "allow_network": false, "allow_network": true}\n',
    b'{"id": "d2", "code": "print(1)", "env": {"A": "1", "A": "2"}}\n',
])
def test_a_duplicated_key_is_refused(tmp_path: Path, line: bytes) -> None:
    with pool_process("--workers=1", cwd=tmp_path) as pool:
        pool.send(line)
        request_id = "d1" if b'"d1"' in line else "d2"
        result = pool.result(request_id)
        assert result["error"]["type"] == "RequestError" and "duplicate" in result["error"]["message"], result


def test_runs_from_many_threads_are_served_in_turn() -> None:
    import threading

    import pynox

    totals: dict[int, float] = {}
    longest: list[float] = []
    lock = threading.Lock()

    def worker(index: int) -> None:
        spent, worst = 0.0, 0.0
        for _ in range(15):
            start = time.monotonic()
            assert pool.run("pass").ok
            took = time.monotonic() - start
            spent, worst = spent + took, max(worst, took)
        with lock:
            totals[index] = spent
            longest.append(worst)

    with pynox.Pool(workers=1) as pool:
        threads = [threading.Thread(target=worker, args=(i,)) for i in range(24)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(90)
    assert len(totals) == 24
    # First come, first served: no run waits while later ones go ahead, so no thread falls far behind.
    assert max(longest) < 1.5, f"a run waited {max(longest):.2f}s"
    assert max(totals.values()) < 2.5 * min(totals.values()), sorted(totals.values())


def test_a_message_quotes_the_input_boundedly(tmp_path: Path) -> None:
    with pool_process("--workers=1", cwd=tmp_path) as pool:
        result = pool.run("pass", timeout="9" * 1_000_000 + "s")
        assert result["error"]["type"] == "RequestError", result["error"]["message"][:200]
        assert len(result["error"]["message"]) < 300, len(result["error"]["message"])


def test_a_job_killed_with_its_template_says_how_long_it_ran(tmp_path: Path) -> None:
    with pool_process("--workers=1", cwd=tmp_path) as pool:
        (template,) = _templates(pool)
        request_id = pool.submit(code="import time\ntime.sleep(5)")
        time.sleep(0.6)
        os.kill(template, signal.SIGKILL)
        result = pool.result(request_id)
        assert result["error"]["type"] == "PoolWorkerError", result
        assert result["duration_ms"] >= 500, result["duration_ms"]


def test_a_job_that_reports_early_and_goes_on_is_stopped_at_its_report(tmp_path: Path) -> None:
    """A job can write a report of its own and close its outputs: its result then comes at once, and
    nothing it does afterwards may happen (the host reads the grant as final)."""
    out = tmp_path / "out"
    out.mkdir()
    early = f"os.write(3, b'{{\"exit\": 0}}')\n{CLOSE_OUTPUTS}"
    code = (f"import os, time\n{early}"
            f"time.sleep(1)\nopen({str(out / 'after')!r}, 'w').write('too late')")
    with pool_process("--workers=1", cwd=tmp_path) as pool:
        result = pool.run(code, allow_write=[str(out)], timeout="10s")
        assert result["exit"] == 0, result
        time.sleep(2)
        assert not (out / "after").exists(), "the job went on after its result"
        assert pool.run("print('next')")["stdout"] == "next\n"
    # Control: the same code without the early report writes the file.
    with pool_process("--workers=1", cwd=tmp_path) as pool:
        honest = code.replace(early, "")
        assert honest != code
        assert pool.run(honest, allow_write=[str(out)], timeout="10s")["exit"] == 0
        assert (out / "after").read_text() == "too late"


def test_a_job_for_the_child_prepared_by_a_template_just_killed_runs_once_on_a_fresh_one(tmp_path: Path) -> None:
    """The server hands a job to the child its template confined ahead; that child dies with its template,
    but only once the template's exit has torn down its memory (milliseconds with pandas loaded). A job
    handed to it in between would begin, then die: it must go to a fresh template instead, and run once."""
    markers = tmp_path / "markers"
    markers.mkdir()
    with pool_process("--workers=1", "--preload=pandas", cwd=tmp_path) as pool:
        for round_ in range(5):
            assert pool.run(**_marker_job(markers, f"warm-{round_}"))["exit"] == 0  # prepares a child like it
            end = time.monotonic() + 10
            while not _prepared_children(pool):
                assert time.monotonic() < end, "no child was prepared"
                time.sleep(0.005)
            (victim,) = _templates(pool)
            os.kill(victim, signal.SIGKILL)
            result = pool.result(pool.submit(**_marker_job(markers, f"job-{round_}")), timeout=60)
            assert result["exit"] == 0, result["error"]
            assert (markers / f"job-{round_}").read_text() == "ran"
