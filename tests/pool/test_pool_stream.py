"""Output as it happens over the protocol: a request with ``"stream": true`` gets stream and display_data
events in order, while the code runs, before its complete result; they count against max_output."""

from __future__ import annotations

from pathlib import Path

import pytest

from .pool_driver import PoolProcess, new_id

pytestmark = pytest.mark.timeout(180)


def _waits_for(go: Path) -> str:
    """Code that prints, then waits (at most 30 s) until the test creates ``go``: output that arrives before
    then arrived while the code ran."""
    return (f"import os, time\nprint('started')\ndisplay({{'phase': 1}})\n"
            f"for _ in range(3000):\n    if os.path.exists({str(go)!r}): break\n    time.sleep(0.01)\n"
            f"print('went on', os.path.exists({str(go)!r}))")


def test_events_arrive_while_the_job_runs_and_before_its_result(pool: PoolProcess, tmp_path: Path) -> None:
    go = tmp_path / "go"
    request_id = pool.submit(code=_waits_for(go), stream=True, allow_read=[str(tmp_path)])
    pool.wait_for(lambda m: m.get("id") == request_id and m.get("event") == "display_data")
    started = pool.events(request_id)
    assert started == [{"event": "stream", "id": request_id, "name": "stdout", "text": "started\n"},
                       {"event": "display_data", "id": request_id, "data": {"text/plain": "{'phase': 1}"},
                        "metadata": {}}]
    assert not pool.responses(request_id), "the job waits for the file: no result yet"
    go.touch()
    result = pool.result(request_id)
    assert result["exit"] == 0 and result["stdout"] == "started\nwent on True\n", result
    events = pool.events(request_id)
    assert all(pool.index_of(e) < pool.index_of(result) for e in events)
    assert "".join(e["text"] for e in events if e["event"] == "stream") == result["stdout"]
    assert result["outputs"] == [{"output_type": "display_data", "data": {"text/plain": "{'phase': 1}"},
                                  "metadata": {}}], "the result stays complete"


def test_stderr_is_streamed_under_its_name(pool: PoolProcess) -> None:
    request_id = new_id()
    result = pool.run("import sys\nprint('out')\nprint('err', file=sys.stderr)", id=request_id, stream=True)
    assert result["exit"] == 0
    names = {e["name"]: e["text"] for e in pool.events(request_id)}
    assert names == {"stdout": "out\n", "stderr": "err\n"}


def test_streamed_output_counts_against_max_output(pool: PoolProcess) -> None:
    request_id = new_id()
    code = "for i in range(2000):\n    print('x' * 99)"
    result = pool.run(code, id=request_id, stream=True, max_output="10k")
    assert result["stdout_truncated"] is True
    streamed = "".join(e["text"] for e in pool.events(request_id))
    assert streamed == result["stdout"] and len(streamed) == 10 * 1024
    # Coalesced (4 KiB, or what came within 50 ms), not one event per line: the 10 KiB are 103 lines.
    assert len(pool.events(request_id)) <= 20


def test_a_session_step_streams_with_its_session(pool: PoolProcess, tmp_path: Path) -> None:
    pool.run("x = 1", session="streaming", allow_read=[str(tmp_path)])
    go = tmp_path / "go"
    request_id = pool.submit(code=_waits_for(go), session="streaming", stream=True)
    pool.wait_for(lambda m: m.get("id") == request_id and m.get("event") == "display_data")
    assert [e.get("session") for e in pool.events(request_id)] == ["streaming", "streaming"]
    go.touch()
    assert pool.result(request_id)["execution_count"] == 2
    pool.run(session="streaming", close=True)


def test_a_request_that_does_not_stream_gets_no_events(pool: PoolProcess) -> None:
    request_id = new_id()
    result = pool.run("print('quiet')\ndisplay(1)", id=request_id)
    assert result["stdout"] == "quiet\n" and result["outputs"][0]["data"] == {"text/plain": "1"}
    assert pool.events(request_id) == [], "it printed and displayed, and streamed nothing"


def test_a_timed_out_streaming_job_has_sent_what_it_printed(pool: PoolProcess) -> None:
    request_id = new_id()
    result = pool.run("import time\nprint('before', flush=False)\ntime.sleep(60)", id=request_id, stream=True,
                      timeout="2s")
    assert result["error"]["type"] == "TimeoutError"
    assert [e["text"] for e in pool.events(request_id)] == ["before\n"], "line-buffered: it left as it was printed"
