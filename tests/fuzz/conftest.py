"""One real pool per fuzz module, many examples through it; the test process is a child subreaper."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from tests.pool.pool_driver import PoolProcess, leftover_guard, pool_process

from .feeder import FED

# PYNOX_FUZZ_EXAMPLES scales every fuzz test (the figures in docs/reliability.md come from a larger run).
settings.register_profile(
    "pynox-fuzz",
    max_examples=int(os.environ.get("PYNOX_FUZZ_EXAMPLES", "150")),
    deadline=None,  # every example goes through a real process; load decides its duration, not the code
    database=None,  # nothing written into the checkout; a failure prints the example and the seed to rerun it
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@pytest.fixture(scope="package", autouse=True)
def _subreaper() -> Iterator[None]:
    yield from leftover_guard()
    # PYNOX_FUZZ_REPORT=path.json: how many inputs each module fed, for docs/reliability.md.
    target = os.environ.get("PYNOX_FUZZ_REPORT")
    if target:
        Path(target).write_text(json.dumps({**FED, "total": sum(FED.values())}, indent=1, sort_keys=True) + "\n")


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PoolProcess]:
    """The fuzzed pool. When it exits, its stderr must be empty: no traceback, nothing from our code."""
    with pool_process("--workers=2", cwd=tmp_path_factory.mktemp("fuzz")) as started:
        yield started
    assert bytes(started.stderr) == b"", f"the pool wrote to stderr: {bytes(started.stderr[-3000:])!r}"
