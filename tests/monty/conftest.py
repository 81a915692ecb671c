"""Fixtures of the Monty suite: one real Pynox pool and one Monty worker pool per module."""

from __future__ import annotations

from collections.abc import Iterator

import pydantic_monty
import pytest

import pynox


@pytest.fixture(scope="module")
def pool() -> Iterator[pynox.Pool]:
    with pynox.Pool(workers=2) as pool:
        yield pool


@pytest.fixture(scope="module")
def monty() -> Iterator[pydantic_monty.Monty]:
    with pydantic_monty.Monty() as monty:
        yield monty
