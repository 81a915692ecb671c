"""``{"cancel": ID}``: a queued job never starts, a running one is killed, each gets its one result.

The harm a cancel prevents is checked from the host: each job writes a marker file after a pause,
and the file must be absent long after the job would have written it. The control (the same job
left alone) writes it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from .pool_driver import PoolProcess, new_id, pool_process

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def single(tmp_path: Path) -> Iterator[PoolProcess]:
    """One worker: a second job waits behind the first."""
    with pool_process("--workers=1", cwd=tmp_path) as pool:
        yield pool


def _writer(marker: Path, after: float) -> dict[str, object]:
    return {"code": f"import time\ntime.sleep({after})\nopen({str(marker)!r}, 'w').write('ran')",
            "allow_write": [str(marker.parent)], "timeout": "20s"}


def _answers(pool: PoolProcess, request_id: str) -> list[dict[str, object]]:
    return [m for m in pool.messages if m.get("id") == request_id and "exit" in m]


def test_the_control_writes_its_marker(single: PoolProcess, tmp_path: Path) -> None:
    marker = tmp_path / "control"
    assert single.run(**_writer(marker, 0.2))["exit"] == 0
    assert marker.read_text() == "ran"


def test_a_running_job_is_killed_and_answered_once(single: PoolProcess, tmp_path: Path) -> None:
    marker = tmp_path / "running"
    job = single.submit(**_writer(marker, 1.5))
    time.sleep(0.5)  # it is running now
    cancel = single.submit(cancel=job)
    answer = single.result(cancel)
    assert answer == {"id": cancel, "cancelled": job}
    result = single.result(job)
    assert (result["exit"], result["error"]["type"]) == (130, "CancelledError")
    # The worker is free at once: the next job waits for nothing.
    after = single.run("print('next')")
    assert after["stdout"] == "next\n" and after["queue_us"] < 100_000, after["queue_us"]
    time.sleep(2.5)  # well past when the job would have written
    assert not marker.exists(), "the cancelled job went on and wrote its file"
    assert len(_answers(single, job)) == 1


def test_a_queued_job_never_starts(single: PoolProcess, tmp_path: Path) -> None:
    first = single.submit(**_writer(tmp_path / "first", 1.0))
    marker = tmp_path / "queued"
    queued = single.submit(**_writer(marker, 0))
    cancel = single.submit(cancel=queued)
    result = single.result(queued)
    assert result["error"]["type"] == "CancelledError" and "before it started" in result["error"]["message"]
    assert single.result(cancel)["cancelled"] == queued
    assert single.result(first)["exit"] == 0  # the job ahead of it is untouched
    time.sleep(1.0)
    assert not marker.exists()
    assert len(_answers(single, queued)) == 1


@pytest.mark.parametrize("target", ["never-sent", 12345])
def test_cancelling_an_unknown_id_is_refused(single: PoolProcess, target: object) -> None:
    result = single.run(cancel=target)
    assert result["error"]["type"] == "RequestError" and "no queued or running job" in result["error"]["message"]


def test_cancelling_a_finished_job_is_refused(single: PoolProcess) -> None:
    done = single.run("print(1)")
    assert single.run(cancel=done["id"])["error"]["type"] == "RequestError"


def test_a_cancel_takes_only_its_id(single: PoolProcess) -> None:
    result = single.run(cancel="x", code="print(1)")
    assert "a cancel request takes only id and cancel" in result["error"]["message"]


def test_a_cancelled_session_step_ends_its_session(single: PoolProcess) -> None:
    name = new_id("session")
    assert single.run("x = 1", session=name)["exit"] == 0
    step = single.submit(code="import time\ntime.sleep(10)", session=name)
    time.sleep(0.5)
    single.result(single.submit(cancel=step))
    result = single.result(step)
    assert result["error"]["type"] == "CancelledError" and result["session_ended"] is True
    fresh = single.run("print(x)", session=name)
    assert fresh["error"]["type"] == "NameError"  # a new process: the cancelled one is gone


def test_stats_count_cancelled_jobs(single: PoolProcess, tmp_path: Path) -> None:
    before = single.stats()["cancelled"]
    job = single.submit(**_writer(tmp_path / "stats", 5))
    time.sleep(0.3)
    single.result(single.submit(cancel=job))
    single.result(job)
    stats = single.stats()
    assert stats["cancelled"] == before + 1 and stats["errors"].get("CancelledError", 0) >= 1
