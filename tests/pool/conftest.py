"""Fixtures for the pool conformance suite: the real ``pynox pool`` over pipes, never a fake.

The test process becomes a child subreaper for the whole suite, so anything
a pool orphans is re-parented here and shows up in the leftover check that
ends every pool (see ``pool_driver.py``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from .pool_driver import HOST_SECRET, HOST_SECRET_NAME, PoolProcess, leftover_guard, pool_process

# Only while this package's tests run: other suites' processes are none of its business.
_subreaper = pytest.fixture(scope="package", autouse=True, name="_subreaper")(leftover_guard)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shared pool's working directory: relative request paths resolve here."""
    return tmp_path_factory.mktemp("pool")


@pytest.fixture(scope="module")
def pool(workdir: Path) -> Iterator[PoolProcess]:
    """One pool (2 workers) shared by the tests of a module that do not disturb each other."""
    env = {**os.environ, HOST_SECRET_NAME: HOST_SECRET}
    with pool_process("--workers=2", cwd=workdir, env=env) as shared:
        yield shared
