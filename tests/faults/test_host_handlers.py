"""Host functions that fail in the client (``pynox.Pool(functions=...)``): they raise, or never answer.

A handler's failure is the job's ``HostError``, never the pool's or the client's problem; a handler
that never answers costs its own job its timeout and nothing else, and its reply, if it ever comes,
is refused by the pool without harm.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

import pynox
from tests.pool.pool_driver import assert_no_leftovers

pytestmark = pytest.mark.timeout(120)

CALL = "from pynox_host import lookup\nprint(lookup('k'))"
CAUGHT = ("from pynox_host import HostError, lookup\ntry:\n    lookup('k')\nexcept HostError as exc:\n"
          "    print('caught:', exc)")


@pytest.fixture
def pool() -> Iterator[pynox.Pool]:
    with pynox.Pool(workers=2) as started:
        yield started
    assert_no_leftovers()


def test_a_handler_that_raises_is_a_host_error_in_the_job(pool: pynox.Pool) -> None:
    def lookup(key: str) -> str:
        raise KeyError(key)

    caught = pool.run(CAUGHT, functions={"lookup": lookup})
    assert caught.ok and caught.stdout == "caught: lookup() failed (KeyError); the host logged the details\n", caught
    uncaught = pool.run(CALL, functions={"lookup": lookup})
    assert uncaught.error is not None and uncaught.error["type"] == "HostError", uncaught
    assert "KeyError" in uncaught.error["message"]
    assert pool.run("print('next')").stdout == "next\n"
    stats = pool.stats()
    assert (stats["ok"], stats["failed"], stats["worker_errors"]) == (2, 1, 0)


def test_a_handler_that_never_answers_costs_only_its_own_job(pool: pynox.Pool) -> None:
    release = threading.Event()
    calls: list[str] = []

    def lookup(key: str) -> str:
        calls.append(key)
        release.wait(60)  # "never", as far as the job is concerned; released before the test ends
        return "too late"

    try:
        with concurrent.futures.ThreadPoolExecutor(1) as background:
            hung = background.submit(pool.run, CALL, functions={"lookup": lookup}, timeout="2s")
            while not calls:
                time.sleep(0.01)
            # Meanwhile the pool and the client serve everything else, host functions included.
            others = [pool.run(f"from pynox_host import echo\nprint(echo({i}))", functions={"echo": lambda v: v})
                      for i in range(4)]
            assert [r.stdout for r in others] == [f"{i}\n" for i in range(4)]
            result = hung.result(30)
        assert result.error is not None and result.error["type"] == "TimeoutError", result
        before = pool.stats()
    finally:
        release.set()
    # The late reply reaches the pool, which refuses it (a RequestError with a null id, that the client
    # ignores) and goes on serving.
    end = time.monotonic() + 20
    while pool.stats()["request_errors"] == before["request_errors"]:
        assert time.monotonic() < end, "the late reply never reached the pool"
        time.sleep(0.05)
    assert pool.stats()["request_errors"] == before["request_errors"] + 1
    assert pool.run("print('served')").stdout == "served\n"


def _cycle() -> list[object]:
    value: list[object] = []
    value.append(value)
    return value


@pytest.mark.parametrize("behaviour", ["SystemExit", "KeyboardInterrupt", "cycle", "long-int"])
def test_a_handler_that_fails_in_any_way_still_answers(pool: pynox.Pool, behaviour: str) -> None:
    """Finding 4: the client caught only Exception from the handler, and only TypeError and EncodeError from
    encoding its value; anything else sent no reply at all and the job waited out its timeout."""
    def lookup(key: str) -> Any:
        if behaviour == "SystemExit":
            raise SystemExit(2)  # what argparse does in a tool given bad arguments
        if behaviour == "KeyboardInterrupt":
            raise KeyboardInterrupt
        return _cycle() if behaviour == "cycle" else 10**5000

    started = time.monotonic()
    result = pool.run(CALL, functions={"lookup": lookup}, timeout="30s")
    assert result.error is not None and result.error["type"] == "HostError", result
    assert time.monotonic() - started < 15, "the job waited for a reply that never came"
    assert pool.run("print('next')").stdout == "next\n"
