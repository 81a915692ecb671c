"""Fixtures of the escape suite: one warm template per module, a fresh world per test."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from .harness import SECRET, SECRET_NAME, Listener, Sandbox, World, build_world


@pytest.fixture(scope="module")
def sandbox() -> Iterator[Sandbox]:
    # The secret is in this process's environment before the template starts, as a host's would be.
    previous = os.environ.get(SECRET_NAME)
    os.environ[SECRET_NAME] = SECRET
    box = Sandbox()
    try:
        yield box
    finally:
        box.close()
        if previous is None:
            os.environ.pop(SECRET_NAME, None)
        else:
            os.environ[SECRET_NAME] = previous


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    yield from build_world(tmp_path)


@pytest.fixture
def listeners() -> Iterator[dict[str, Listener]]:
    """``listed`` on 127.0.0.1; ``other_address`` on 127.0.0.2, same port; ``other_port`` on 127.0.0.1."""
    listed = Listener("127.0.0.1")
    try:
        other_address = Listener("127.0.0.2", listed.port)
    except OSError:
        listed.close()
        pytest.skip("cannot listen on 127.0.0.2 with the same port here")
    made = {"listed": listed, "other_address": other_address, "other_port": Listener("127.0.0.1")}
    yield made
    for listener in made.values():
        listener.close()
