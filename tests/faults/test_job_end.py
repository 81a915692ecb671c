"""How a job's end is read: measured while stopped at its end, then killed; never waiting on a stop.

A job's process stops itself after its report (so the pool can measure it before the exit teardown)
and is killed once measured. Each test here is a job that breaks that hand-over from inside (closes
its report, stops itself, exits on its own) and must still get its own exit status promptly, with its
figures from the kernel; the deadline is far away, so waiting for it would show.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tests.harness.job_code import CLOSE_OUTPUTS
from tests.pool.pool_driver import PoolProcess, pool_process, proc_table

pytestmark = pytest.mark.timeout(120)

_FAR = "30s"


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PoolProcess]:
    with pool_process("--workers=1", cwd=tmp_path_factory.mktemp("end")) as shared:
        yield shared


def _timed(pool: PoolProcess, code: str) -> tuple[dict[str, object], float]:
    start = time.monotonic()
    result = pool.run(code, timeout=_FAR)
    return result, time.monotonic() - start


def test_a_job_that_closed_its_report_gets_its_exit_status(pool: PoolProcess) -> None:
    result, took = _timed(pool, "import os\nos.closerange(3, 4)\nraise SystemExit(7)")
    assert result["exit"] == 7 and took < 5, (result, took)


def test_a_job_that_stops_itself_after_closing_its_pipes_is_let_go_on(pool: PoolProcess) -> None:
    code = f"import os, signal\n{CLOSE_OUTPUTS}os.kill(os.getpid(), signal.SIGSTOP)\nos._exit(5)"
    result, took = _timed(pool, code)
    assert result["exit"] == 5 and took < 5, (result, took)


def test_a_job_that_exits_on_its_own_is_measured_by_the_template(pool: PoolProcess) -> None:
    result, took = _timed(pool, "import os\nb = bytearray(64 << 20)\nb[::4096] = b'x' * len(b[::4096])\nos._exit(0)")
    usage = result["usage"]
    assert isinstance(usage, dict) and result["exit"] == 0 and took < 5
    assert usage["max_rss_kb"] >= 60 * 1024, usage


def test_no_job_is_left_stopped(pool: PoolProcess) -> None:
    for _ in range(20):
        assert pool.run("print(1)")["exit"] == 0
    time.sleep(0.5)
    stopped = [pid for pid, (_, state, _, name) in proc_table().items() if name == "pynox-job" and state == "T"]
    assert not stopped, f"jobs left stopped: {stopped}"
