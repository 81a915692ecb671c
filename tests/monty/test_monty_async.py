"""pynox-monty under ``AsyncMonty``: ``run_python`` is awaited, and calls gathered together run at once."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pydantic_monty
import pytest

import pynox
from pynox_monty import async_external_lookup, external_lookup, type_stubs

from .glue import spec_glue

pytestmark = pytest.mark.timeout(90)

SLEEP = "import time\ntime.sleep(1)\nprint({n})"
GATHERED = f"""
import asyncio
first, second = await asyncio.gather(run_python({SLEEP.format(n=1)!r}), run_python({SLEEP.format(n=2)!r}))
[first['stdout'], second['stdout']]
"""
ONE_AFTER_THE_OTHER = f"""
first = await run_python({SLEEP.format(n=1)!r})
second = await run_python({SLEEP.format(n=2)!r})
[first['stdout'], second['stdout']]
"""


async def feed_async(code: str, lookup: dict[str, Any], **checkout: Any) -> Any:
    async with pydantic_monty.AsyncMonty() as monty, monty.checkout(script_name="agent.py", **checkout) as session:
        return await session.feed_run(code, external_lookup=lookup)


async def timed(run: Callable[[], Awaitable[Any]]) -> tuple[Any, float]:
    started = time.monotonic()
    value = await run()
    return value, time.monotonic() - started


def test_gathered_calls_overlap(pool: pynox.Pool) -> None:
    lookup = async_external_lookup(pool, timeout="10s")
    stubs = type_stubs(lookup)

    async def both() -> tuple[tuple[Any, float], tuple[Any, float]]:
        gathered = await timed(lambda: feed_async(GATHERED, lookup, type_check=True, type_check_stubs=stubs))
        serial = await timed(lambda: feed_async(ONE_AFTER_THE_OTHER, lookup, type_check=True,
                                                type_check_stubs=stubs))
        return gathered, serial

    (gathered, together), (serial, apart) = asyncio.run(both())
    assert gathered == serial == ["1\n", "2\n"]
    assert apart >= 2.0  # the control: two 1 s jobs, one after the other
    assert 1.0 <= together < 1.6, f"gathered: {together:.2f}s, one after the other: {apart:.2f}s"


def test_the_event_loop_runs_while_a_job_does(pool: pynox.Pool) -> None:
    lookup = async_external_lookup(pool)
    ticks: list[float] = []

    async def ticking() -> Any:
        async def tick() -> None:
            while True:
                ticks.append(time.monotonic())
                await asyncio.sleep(0.05)

        ticker = asyncio.create_task(tick())
        try:
            return await feed_async(f"(await run_python({SLEEP.format(n=7)!r}))['stdout']", lookup)
        finally:
            ticker.cancel()

    assert asyncio.run(ticking()) == "7\n"
    assert len(ticks) >= 10 and max(b - a for a, b in itertools.pairwise(ticks)) < 0.5


def test_the_spec_glue_code_runs_awaited(pool: pynox.Pool, tmp_path: Path) -> None:
    lookup = async_external_lookup(pool, allow_read=[tmp_path], allow_write=[tmp_path])
    glue = spec_glue(tmp_path).replace("job = run_python(", "job = await run_python(")
    assert asyncio.run(feed_async(glue, lookup, type_check=True, type_check_stubs=type_stubs(lookup))) == 13
    # Not awaited, it is a coroutine, and the checker says so before anything runs.
    with pytest.raises(pydantic_monty.MontyTypingError, match="Cannot subscript object of type `CoroutineType"):
        asyncio.run(feed_async(spec_glue(tmp_path), lookup, type_check=True, type_check_stubs=type_stubs(lookup)))


def test_host_functions_sync_and_async_serve_both_sandboxes(pool: pynox.Pool) -> None:
    class CatalogError(Exception):
        pass

    async def price(product: str) -> float:
        await asyncio.sleep(0)
        if product != "lamp":
            raise CatalogError(f"no product named {product!r}")
        return 25.0

    def quantity(product: str) -> int:
        return 3

    lookup = async_external_lookup(pool, functions={"price": price, "quantity": quantity})
    heavy = 'from pynox_host import price, quantity\nprint(price("lamp") * quantity("lamp"))'
    glue = f"heavy = await run_python({heavy!r})\n[await price('lamp'), quantity('lamp'), heavy['stdout']]"
    stubs = type_stubs(lookup)
    assert "\nasync def price(product: str) -> float: ..." in stubs
    assert "\ndef quantity(product: str) -> int: ..." in stubs
    assert asyncio.run(feed_async(glue, lookup, type_check=True, type_check_stubs=stubs)) == [25.0, 3, "75.0\n"]
    with pytest.raises(pydantic_monty.MontyRuntimeError, match="price\\(\\) failed: CatalogError: no product named"):
        asyncio.run(feed_async("await price('sofa')", lookup))


def test_a_sync_lookup_refuses_an_async_host_function(pool: pynox.Pool) -> None:
    async def price(product: str) -> float:
        return 25.0

    with pytest.raises(TypeError, match="price is an async function: Monty calls external_lookup's functions "
                                        "without an event loop; use async_external_lookup with AsyncMonty"):
        external_lookup(pool, functions={"price": price})


def test_bad_arguments_and_refusals_as_in_the_sync_bridge(pool: pynox.Pool, tmp_path: Path) -> None:
    lookup = async_external_lookup(pool)
    with pytest.raises(pydantic_monty.MontyRuntimeError, match="ValueError: timeout: 'soon' is not a duration"):
        asyncio.run(feed_async("await run_python('print(1)', timeout='soon')", lookup))
    with pytest.raises(pydantic_monty.MontyRuntimeError, match="TypeError: run_python\\(\\) code must be a str"):
        asyncio.run(feed_async("await run_python(42)", lookup))
    refused = async_external_lookup(pool, allow_read=[tmp_path / "missing"])
    job = asyncio.run(feed_async("await run_python('print(1)')", refused))
    assert job["exit"] == 2 and job["error"]["type"] == "RequestError" and "missing" in job["error"]["message"]
    with pytest.raises(ValueError, match="run_python"):
        async_external_lookup(pool, functions={"run_python": print})
