"""A run's wait for a worker has a deadline in the Python client too: ``queue_timeout`` bounds the wait for one
of the client's slots, then the pool's queue, and past it the run raises ``RequestError`` and nothing ran.

Seen from outside: the jobs that fill the pool wait for a gate file the test creates, and the refused run
would have written a file of its own.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from pathlib import Path

import pytest

from pynox import Pool, RequestError

pytestmark = pytest.mark.timeout(120)


def _hold(gate: Path) -> str:
    return f"import os, time\nwhile not os.path.exists({str(gate)!r}):\n    time.sleep(0.01)\n"


def test_a_run_waiting_for_a_slot_gives_up_at_its_queue_timeout(tmp_path: Path) -> None:
    gate = tmp_path / "open"
    marker = tmp_path / "ran"
    with Pool(workers=1) as pool, concurrent.futures.ThreadPoolExecutor(4) as threads:
        # Three per worker fill the client's slots: one runs, two wait in the pool.
        holders = [threads.submit(pool.run, _hold(gate), allow_read=[str(tmp_path)], timeout="60s")
                   for _ in range(3)]
        end = time.monotonic() + 20
        while pool.stats()["in_flight"] < 3:
            assert time.monotonic() < end, "the holders never reached the pool"
            time.sleep(0.05)
        write = f"open({str(marker)!r}, 'w').write('ran')"
        started = time.monotonic()
        with pytest.raises(RequestError, match="the pool is saturated"):
            pool.run(write, allow_write=[str(tmp_path)], queue_timeout="300ms")
        waited = time.monotonic() - started
        assert 0.28 <= waited < 3.0, waited

        async def in_a_loop() -> None:
            with pytest.raises(RequestError, match="the pool is saturated"):
                await pool.arun(write, allow_write=[str(tmp_path)], queue_timeout="300ms")

        asyncio.run(in_a_loop())
        assert not any(holder.done() for holder in holders), "a holder ended: the refusal proves nothing"
        gate.touch()
        assert all(holder.result(timeout=30).ok for holder in holders)
        assert not marker.exists()  # seen from outside: the refused runs never ran
        # The control: with slots free, the same run goes through, and its deadline is sent to the pool.
        assert pool.run(write, allow_write=[str(tmp_path)], queue_timeout="5s").ok
        assert marker.read_text() == "ran"


def test_the_pool_refuses_a_sent_run_past_its_queue_timeout(tmp_path: Path) -> None:
    gate = tmp_path / "open"
    with Pool(workers=1) as pool, concurrent.futures.ThreadPoolExecutor(2) as threads:
        holder = threads.submit(pool.run, _hold(gate), allow_read=[str(tmp_path)], timeout="60s")
        end = time.monotonic() + 20
        while pool.stats()["busy_workers"] < 1:
            assert time.monotonic() < end, "the holder never started"
            time.sleep(0.05)
        started = time.monotonic()
        with pytest.raises(RequestError, match=r"for a worker .* the pool is saturated"):
            pool.run("print(1)", queue_timeout="400ms")  # a slot is free: the pool's queue refuses it
        assert 0.38 <= time.monotonic() - started < 3.0
        gate.touch()
        assert holder.result(timeout=30).ok


def test_a_bad_queue_timeout_is_a_request_error() -> None:
    with Pool(workers=1) as pool, pytest.raises(RequestError, match="queue_timeout"):
        pool.run("print(1)", queue_timeout="soon")


def test_the_pools_queue_timeout_bounds_a_run_that_names_none(tmp_path: Path) -> None:
    gate = tmp_path / "open"
    config = tmp_path / "pynox.toml"
    config.write_text('[pool]\nqueue_timeout = "300ms"\n')
    with Pool(workers=1, config=config) as pool, concurrent.futures.ThreadPoolExecutor(4) as threads:
        assert pool.ready["queue_timeout"] == 0.3
        holders = [threads.submit(pool.run, _hold(gate), allow_read=[str(tmp_path)], timeout="60s",
                                  queue_timeout="60s") for _ in range(3)]
        end = time.monotonic() + 20
        while pool.stats()["in_flight"] < 3:
            assert time.monotonic() < end, "the holders never reached the pool"
            time.sleep(0.05)
        started = time.monotonic()
        with pytest.raises(RequestError, match="the pool is saturated"):
            pool.run("print(1)")  # no slot within the pool's 300 ms
        assert 0.28 <= time.monotonic() - started < 3.0
        gate.touch()
        assert all(holder.result(timeout=30).ok for holder in holders)
