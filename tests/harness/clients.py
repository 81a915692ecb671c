"""A client process a test starts beside a pool (a program that owns a pool, then is killed): started, ended and
unmarked in one place, however its test ended."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.pool.pool_driver import descendants, jobs_of, mark_live, unmark_live


@contextmanager
def owning_client(script: str, *args: str, cwd: Path) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """Run ``script`` (``python -c``) with ``args``: a client that starts its own pool and prints one line,
    ``{"pool": PID, "ready": EVENT}``. Yields the client and its pool's pid once the pool is ready; the client is
    ended however the test ends (:func:`end_client`)."""
    client = subprocess.Popen([sys.executable, "-c", script, *args], stdout=subprocess.PIPE, cwd=cwd)
    mark_live(client.pid)
    try:
        assert client.stdout is not None
        hello = json.loads(client.stdout.readline())
        assert hello["ready"]["event"] == "ready"
        yield client, hello["pool"]
    finally:
        end_client(client)


def wait_for_jobs(pool_pid: int, count: int, within: float, what: str) -> None:
    """Until ``count`` jobs run below the pool ``pool_pid``; fails, naming ``what`` never started, after
    ``within`` seconds."""
    end = time.monotonic() + within
    while len(jobs_of(pool_pid)) < count:
        assert time.monotonic() < end, f"{what} never started: {descendants(pool_pid)}"
        time.sleep(0.02)


def end_client(client: subprocess.Popen[bytes]) -> None:
    """Kill ``client`` if it still runs, close its stdout and take its pid off the live pools' marks."""
    if client.poll() is None:
        client.kill()
        client.wait(10)
    if client.stdout is not None:
        client.stdout.close()
    unmark_live(client.pid)


def in_background(run: Callable[[], object],
                  expected: type[BaseException]) -> tuple[threading.Thread, list[BaseException]]:
    """Start ``run`` (a call in flight, e.g. a long ``pool.run``) on a thread; the list holds what it raised of
    ``expected`` (anything else ends the thread unrecorded, and the test's check of the list fails)."""
    raised: list[BaseException] = []

    def call() -> None:
        try:
            run()
        except expected as exc:
            raised.append(exc)

    thread = threading.Thread(target=call)
    thread.start()
    return thread, raised
