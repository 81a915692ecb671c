"""Host calls that overlap: from threads of one job, from ``pynox_host.aio``, and to ``async def`` host functions.

Each timing is the job's own clock around its calls, against what one call at a time would take
(4 x 1 s); concurrency on the host side is counted by the host function itself.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from pynox import Pool
from tests.harness.fixtures import shared_pool

pytestmark = pytest.mark.timeout(90)

_THREADS = ("import threading, time\nfrom pynox_host import {name}\nout = []\nstart = time.monotonic()\n"
            "threads = [threading.Thread(target=lambda i=i: out.append({name}(i))) for i in range({count})]\n"
            "[t.start() for t in threads]\n[t.join() for t in threads]\n"
            "print(round(time.monotonic() - start, 2), sorted(out))")


pool = shared_pool(workers=2)


class _Counter:
    """A host function that takes ``seconds`` and records how many calls ran at once."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.now = self.most = 0
        self.lock = threading.Lock()

    def __call__(self, i: int) -> int:
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)
        time.sleep(self.seconds)
        with self.lock:
            self.now -= 1
        return i


def test_four_threads_calling_a_one_second_function_overlap(pool: Pool) -> None:
    slow = _Counter(1.0)
    result = pool.run(_THREADS.format(name="slow", count=4), functions={"slow": slow})
    took, values = result.stdout.split(" ", 1)
    assert values.strip() == "[0, 1, 2, 3]", result.text
    assert float(took) < 1.6, f"four 1 s calls took {took}s in the job: they did not overlap"
    assert slow.most == 4


def test_at_most_eight_calls_of_one_job_wait_at_once_and_none_fails(pool: Pool) -> None:
    slow = _Counter(0.3)
    result = pool.run(_THREADS.format(name="slow", count=12), functions={"slow": slow})
    assert result.ok and result.stdout.endswith(f"{list(range(12))}\n"), result.text
    assert slow.most == 8


def test_aio_functions_gather_into_overlapping_calls(pool: Pool) -> None:
    slow = _Counter(1.0)
    code = ("import asyncio, time\nfrom pynox_host.aio import slow\nstart = time.monotonic()\n"
            "a, b = await asyncio.gather(slow(1), slow(2))\n"
            "{'a': a, 'b': b, 'overlapped': time.monotonic() - start < 1.6}")
    result = pool.run(code, functions={"slow": slow})
    assert result.return_value == "{'a': 1, 'b': 2, 'overlapped': True}", result.text
    assert slow.most == 2


def test_an_async_host_function_is_awaited_from_run(pool: Pool) -> None:
    async def search(query: str) -> str:
        await asyncio.sleep(0.05)
        return query.upper()

    result = pool.run("from pynox_host import search\nsearch('pynox')", functions={"search": search})
    assert result.return_value == "'PYNOX'", result.text


def test_an_async_host_function_of_arun_runs_on_the_callers_loop() -> None:
    seen: list[asyncio.AbstractEventLoop] = []

    async def where() -> str:
        seen.append(asyncio.get_running_loop())
        return "here"

    async def scenario() -> tuple[str | None, asyncio.AbstractEventLoop]:
        with Pool(workers=1) as pool:
            result = await pool.arun("from pynox_host import where\nwhere()", functions={"where": where})
        return result.return_value, asyncio.get_running_loop()

    value, loop = asyncio.run(scenario())
    assert value == "'here'" and seen == [loop]


def test_an_async_host_functions_error_reaches_the_job(pool: Pool) -> None:
    from pynox import HostError

    async def refuse() -> None:
        raise HostError("no such city")

    result = pool.run("from pynox_host import refuse, HostError\ntry:\n    refuse()\nexcept HostError as e:\n"
                      "    print('job saw:', e)", functions={"refuse": refuse})
    assert result.stdout == "job saw: no such city\n"


@pytest.mark.parametrize("escape", [KeyboardInterrupt, SystemExit])
def test_an_async_host_function_that_raises_past_exception_is_answered(escape: type[BaseException]) -> None:
    async def leave() -> None:
        raise escape

    async def search(query: str) -> str:
        return query.upper()

    # It ended the pool's event loop: the job waited until its timeout, later async calls for ever, and the
    # pool's close raised "Event loop is closed".
    with Pool(workers=1) as own:
        code = "from pynox_host import leave, HostError\ntry:\n    leave()\nexcept HostError as e:\n    print(e)"
        result = own.run(code, functions={"leave": leave}, timeout=5)
        assert result.stdout == f"leave() failed ({escape.__name__}); the host logged the details\n", result.text
        after = own.run("from pynox_host import search\nsearch('x')", functions={"search": search}, timeout=5)
        assert after.return_value == "'X'", after.text


@pytest.mark.parametrize("first_answered", ["first", "last"])
def test_each_thread_gets_its_own_answer_whatever_order_they_come_in(pool: Pool, first_answered: str) -> None:
    """One waiting caller reads the channel for all and passes the reading on when its own answer comes:
    answered last, the first caller delivers every other answer; answered first, it must pass the reading
    on, or the others wait forever. Each thread checks that it got its own answer."""
    def late_first(i: int) -> int:
        time.sleep((i if first_answered == "first" else max(6 - i, 0)) * 0.05)
        return i * 10

    code = ("import threading\nfrom pynox_host import f\npairs = []\n"
            "threads = [threading.Thread(target=lambda i=i: pairs.append((i, f(i)))) for i in range(6)]\n"
            "[t.start() for t in threads]\n[t.join() for t in threads]\n"
            "print(all(got == i * 10 for i, got in pairs), len(pairs))\n"
            "print(f(7))")  # a call after the threads' reader has gone: this thread reads for itself
    result = pool.run(code, functions={"f": late_first})
    assert result.stdout == "True 6\n70\n", result.text
