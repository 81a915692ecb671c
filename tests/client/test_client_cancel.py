"""Cancelling an ``arun`` cancels the job: asyncio cancellation reaches the pool, which kills it (a session
step: interrupts it first, and kills it only past the grace).

Checked from the host: the job would write a file after a pause; after the cancel the file never
appears, and the next run starts at once (one worker: it would wait for the old job otherwise).
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest

from pynox import Pool, Result
from tests.harness.fixtures import shared_pool

pytestmark = pytest.mark.timeout(90)


pool = shared_pool(workers=1)


def _writer(marker: Path) -> str:
    return f"import time\ntime.sleep(3)\nopen({str(marker)!r}, 'w').write('ran')"


def test_wait_for_cancels_the_job(pool: Pool, tmp_path: Path) -> None:
    marker = tmp_path / "wait_for"

    async def scenario() -> float:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(pool.arun(_writer(marker), allow_write=[str(tmp_path)]), 0.7)
        started = time.monotonic()
        result = await pool.arun("print('next')")
        assert result.stdout == "next\n"
        return time.monotonic() - started

    next_took = asyncio.run(scenario())
    assert next_took < 1.0, f"the next run waited {next_took:.2f}s for the cancelled one"
    time.sleep(3.5)
    assert not marker.exists(), "the cancelled job went on and wrote its file"


def test_the_control_run_writes_its_file(pool: Pool, tmp_path: Path) -> None:
    marker = tmp_path / "control"
    assert asyncio.run(pool.arun(_writer(marker), allow_write=[str(tmp_path)])).ok
    assert marker.exists()


def test_a_cancelled_session_step_is_interrupted_and_the_session_keeps_its_state(pool: Pool) -> None:
    """As a notebook's interrupt: the step raises KeyboardInterrupt, and the next run sees the variables."""
    async def scenario() -> tuple[str, bool, str | None]:
        session = pool.session()
        await session.arun("x = 1")
        task = asyncio.ensure_future(session.arun("x = 2\nimport time\ntime.sleep(5)\nx = 3"))
        await asyncio.sleep(0.5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        after = await session.arun("print(x)")
        alive = session.alive
        await session.aclose()
        return after.stdout, alive, after.session_reopened

    assert asyncio.run(scenario()) == ("2\n", True, None)


def test_a_cancelled_session_step_that_will_not_stop_starts_a_fresh_session_that_says_so(pool: Pool) -> None:
    async def scenario() -> Result:
        session = pool.session()
        await session.arun("x = 1")
        task = asyncio.ensure_future(session.arun(
            "import time\nwhile True:\n    try:\n        time.sleep(5)\n    except KeyboardInterrupt:\n        pass"))
        await asyncio.sleep(0.5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        after = await session.arun("print('x' in dir())")
        await session.aclose()
        return after

    after = asyncio.run(scenario())
    assert after.stdout == "False\n"
    assert after.session_reopened is not None and "cancelled" in after.session_reopened, after
    assert "earlier process was gone" in after.text


def test_session_interrupt_interrupts_the_running_step_from_another_thread(pool: Pool) -> None:
    with pool.session() as session:
        session.run("x = 1")
        assert session.interrupt() is False  # nothing runs
        timer = threading.Timer(0.5, session.interrupt)
        timer.start()
        result = session.run("x = 2\nimport time\ntime.sleep(10)\nx = 3")
        timer.join()
        assert result.interrupted and result.error is not None and result.error["type"] == "KeyboardInterrupt"
        assert "interrupted (KeyboardInterrupt)" in result.text and not result.session_ended
        assert session.run("print(x)").stdout == "2\n"


def test_a_step_interrupted_while_it_waits_for_a_host_function_keeps_the_session_and_its_channel(pool: Pool) -> None:
    def slow() -> int:
        time.sleep(2)
        return 1

    with pool.session(functions={"slow": slow, "fast": lambda: 2}) as session:
        session.run("x = 5")
        timer = threading.Timer(0.5, session.interrupt)
        timer.start()
        interrupted = session.run("from pynox_host import slow\ny = slow()")
        timer.join()
        assert interrupted.interrupted and interrupted.error is not None
        assert interrupted.error["type"] == "KeyboardInterrupt", interrupted
        time.sleep(2)  # the late answer to the interrupted call arrives, and is dropped
        assert session.run("from pynox_host import fast\nprint(x, fast())").stdout == "5 2\n"
