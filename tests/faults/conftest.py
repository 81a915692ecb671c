"""Faults are injected into real pools: the test process is a child subreaper, so anything orphaned is found."""

from __future__ import annotations

import pytest

from tests.pool.pool_driver import leftover_guard

# Only while this package's tests run: other suites' processes are none of its business.
_subreaper = pytest.fixture(scope="package", autouse=True, name="_subreaper")(leftover_guard)
