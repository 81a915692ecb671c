"""Fixtures of the Monty suite: one real Pynox pool and one Monty worker pool per module."""

from __future__ import annotations

from collections.abc import Iterator

import pydantic_monty
import pytest

from tests.harness.fixtures import shared_pool

pool = shared_pool(workers=2)


@pytest.fixture(scope="module")
def monty() -> Iterator[pydantic_monty.Monty]:
    with pydantic_monty.Monty() as monty:
        yield monty
