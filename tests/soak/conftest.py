"""The soak drives real pools: the test process is a child subreaper, so anything a pool orphans is found."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.pool.pool_driver import assert_no_leftovers, reap_adopted_zombies, set_child_subreaper


@pytest.fixture(scope="package", autouse=True)
def _subreaper() -> Iterator[None]:
    set_child_subreaper(True)
    try:
        yield
        assert_no_leftovers()
    finally:
        set_child_subreaper(False)
        reap_adopted_zombies()
