"""Fixtures for the adapter suite: one real pool per module, and no Pynox process outliving its test.

Pools that were already running when a module started (another module's
default pool, closed only at exit) are left out of every check.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from _pytest.mark.expression import Expression

from pynox import Pool
from tests.pool.pool_driver import reap_adopted_zombies, set_child_subreaper

from .procs import running_pools, wait_for_none

WORKERS = 2
T = TypeVar("T")


@pytest.fixture(scope="module")
def earlier_pools() -> Iterator[frozenset[int]]:
    """Pools running before this module: every leftover check ignores them. Ours must all be gone after it."""
    set_child_subreaper(True)
    before = running_pools()
    try:
        yield before
        wait_for_none(before)
    finally:
        set_child_subreaper(False)
        reap_adopted_zombies()


@pytest.fixture(scope="module")
def pool(earlier_pools: frozenset[int]) -> Iterator[Pool]:
    """A pool shared by the tests of a module; closed, and proven gone, when the module ends."""
    with Pool(workers=WORKERS) as shared:
        yield shared
    wait_for_none(earlier_pools)


def run_async(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine on a loop of its own, closed after, leaving the thread's current loop alone.

    Not ``asyncio.run``: that unsets the current loop, and pydantic-ai's ``run_sync`` keeps one there that
    it never closes, so dropping it would surface as an unclosed-loop ResourceWarning at shutdown.
    """
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(coroutine)
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


@pytest.fixture(autouse=True, scope="module")
def _close_the_loop_run_sync_left() -> Iterator[None]:
    """pydantic-ai's ``run_sync`` leaves an event loop set as this thread's current one and never closes
    it; unclosed, it warns whenever it is collected, in whichever module that happens. Close it here."""
    yield
    policy = asyncio.get_event_loop_policy()
    # The policy keeps the current loop in a private slot; reading it does not create one, as
    # get_event_loop() would.
    loop = getattr(getattr(policy, "_local", None), "_loop", None)
    if isinstance(loop, asyncio.AbstractEventLoop) and not loop.is_running() and not loop.is_closed():
        loop.close()
        policy.set_event_loop(None)


# The adapters whose frameworks conflict with requirements.txt: their modules import those frameworks, so they
# are collected only where they are selected (`-m separate_env`, in .venv-separate); the main run's marker
# expression deselects them, and .ci/run runs them in their environment.
SEPARATE_ENV = {"test_openai_agents.py", "test_autogen.py", "test_adk.py"}


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    if collection_path.name not in SEPARATE_ENV:
        return None
    expression = config.getoption("markexpr") or ""
    # pytest's own evaluator of `-m` (it has no public one), so the expression is read exactly as pytest reads it.
    selected = not expression or Expression.compile(expression).evaluate(lambda name, **_: name == "separate_env")
    return None if selected else True
