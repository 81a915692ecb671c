"""Cancelling an ``arun`` cancels the job: asyncio cancellation reaches the pool, which kills it.

Checked from the host: the job would write a file after a pause; after the cancel the file never
appears, and the next run starts at once (one worker: it would wait for the old job otherwise).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pynox import Pool

pytestmark = pytest.mark.timeout(90)


@pytest.fixture(scope="module")
def pool() -> Iterator[Pool]:
    with Pool(workers=1) as shared:
        yield shared


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


def test_a_cancelled_session_step_starts_a_fresh_session_next(pool: Pool) -> None:
    async def scenario() -> str:
        session = pool.session()
        await session.arun("x = 1")
        task = asyncio.ensure_future(session.arun("import time\ntime.sleep(5)"))
        await asyncio.sleep(0.5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        after = await session.arun("print('x' in dir())")
        await session.aclose()
        return after.stdout

    assert asyncio.run(scenario()) == "False\n"
