"""A session step's outputs: the step is over at its report, whatever still holds its stdout, stderr or report."""

from __future__ import annotations

from typing import Any

import pytest

from .pool_driver import PoolProcess, new_id

pytestmark = pytest.mark.timeout(120)

# Code that keeps a copy of its stdout past its end: each once held the step open until its deadline.
_KEEPS = {
    "a copy of descriptor 1": "import os\nkeep = os.dup(1)\nprint('a')",
    "stdout on a copy": "import os, sys\nsys.stdout = os.fdopen(os.dup(1), 'w')\nprint('a', flush=True)",
    "a copy of every output": "import os\nkeep = [os.dup(fd) for fd in (1, 2, 3)]\nprint('a')",
}


def _ok(result: dict[str, Any]) -> dict[str, Any]:
    assert result["exit"] == 0 and result["error"] is None, result
    assert result["session_ended"] is False, result
    return result


@pytest.mark.parametrize("first", [True, False], ids=["first step", "later step"])
@pytest.mark.parametrize("code", list(_KEEPS.values()), ids=list(_KEEPS))
def test_a_step_that_keeps_a_copy_of_its_outputs_ends_at_its_report(pool: PoolProcess, code: str,
                                                                    first: bool) -> None:
    """Its code is over at once: its result comes then, not as a TimeoutError at its deadline, and the session
    goes on."""
    name = new_id("keeps")
    try:
        if not first:
            _ok(pool.run("x = 1", session=name))
        kept = _ok(pool.run(code, session=name, timeout="8s"))
        assert kept["stdout"] == "a\n", kept
        assert _ok(pool.run("import os\nos.write(1, b'next\\n')", session=name))["stdout"] == "next\n"
    finally:
        pool.run(session=name, close=True)
