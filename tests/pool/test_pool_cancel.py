"""``{"cancel": ID}``: a queued job never starts, a running one is killed, each gets its one result.

The harm a cancel prevents is checked from the host: each job writes a marker file after a pause,
and the file must be absent long after the job would have written it. The control (the same job
left alone) writes it.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from .pool_driver import PoolProcess, new_id, pool_process, wait_gone, zygotes

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


def test_a_cancelled_session_step_that_will_not_stop_ends_its_session(single: PoolProcess) -> None:
    # A cancel interrupts a session step first (see test_pool_interrupts.py); one that swallows the
    # KeyboardInterrupt is killed once the grace is over, and its session ends with it.
    name = new_id("session")
    assert single.run("x = 1", session=name)["exit"] == 0
    step = single.submit(code="import time\nwhile True:\n    try:\n        time.sleep(10)\n"
                              "    except KeyboardInterrupt:\n        pass", session=name)
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


# A preload that holds each template's start until the test opens its gate: the n-th template to start
# says it arrived (arrived-n) and waits for go-n. It is trusted code of the template, not of any job.
_GATE = """\
import os, pathlib, time
here = pathlib.Path(__file__).parent
n = 0
while True:
    try:
        os.close(os.open(here / f"arrived-{n}", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        break
    except FileExistsError:
        n += 1
while not (here / f"go-{n}").exists():
    time.sleep(0.01)
"""


def _wait_for(path: Path, deadline: float = 30.0) -> None:
    end = time.monotonic() + deadline
    while not path.exists():
        assert time.monotonic() < end, f"{path.name} did not appear within {deadline}s"
        time.sleep(0.01)


@pytest.mark.parametrize("cancelled", [True, False], ids=["cancelled", "control"])
def test_a_cancel_between_the_jobs_start_and_its_hand_over_is_kept(tmp_path: Path, cancelled: bool) -> None:
    """The window is held open from outside: the template died while idle, and the zygote templates are
    forked from with it, so the worker that takes the job starts a replacement first, forked from a new
    zygote whose preload waits at a gate. A cancel sent then finds the job started and no process of it yet;
    it must still stop the job, which never runs."""
    gate = tmp_path / "gate"
    gate.mkdir()
    (gate / "pynox_gate.py").write_text(_GATE)
    (gate / "go-0").touch()  # the pool's first template starts freely
    marker = tmp_path / "out" / "ran"
    marker.parent.mkdir()
    with pool_process("--workers=1", "--preload=pynox_gate", f"--package-dir={gate}", cwd=tmp_path) as pool:
        killed = pool.templates() + zygotes(pool.pid)
        assert len(killed) == 2, killed
        for pid in killed:
            os.kill(pid, signal.SIGKILL)
        assert wait_gone(killed, 5) == []
        job = pool.submit(**_writer(marker, 0))
        _wait_for(gate / "arrived-1")  # the worker took the job and waits for its replacement template
        if cancelled:
            cancel = pool.submit(cancel=job)
            assert pool.result(cancel) == {"id": cancel, "cancelled": job}
        (gate / "go-1").touch()
        result = pool.result(job)
        time.sleep(0.5)  # room for a job that was handed over anyway to write
        if cancelled:
            assert (result["exit"], result["error"]["type"]) == (130, "CancelledError"), result
            assert not marker.exists(), "the cancelled job ran"
        else:
            assert result["exit"] == 0, result
            assert marker.read_text() == "ran"
        assert len(_answers(pool, job)) == 1
        assert pool.run("print('next')")["stdout"] == "next\n"  # the worker goes on serving
