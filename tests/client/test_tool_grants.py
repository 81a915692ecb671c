"""A tool refuses, when it is made, a grant the pool would refuse at every run: the model could not mend it.

The rule is the pool's own (``grants.refuse_write_grant``): a write grant may never overlap where the
interpreter and its packages live. The control: the same grant given to a run is refused by the pool, and a
write grant elsewhere makes a tool that writes.
"""

from __future__ import annotations

import sysconfig
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import pynox
from pynox import Pool, RequestError
from pynox_langchain import python_tool as langchain_tool
from pynox_strands import python_tool as strands_tool
from tests.harness.fixtures import shared_pool

pytestmark = pytest.mark.timeout(120)

SITE = sysconfig.get_paths()["purelib"]  # where the pool's packages live (the same interpreter)


pool = shared_pool(workers=1)


MAKERS: dict[str, Callable[..., Any]] = {
    "CodeTool": pynox.CodeTool,
    "Pool.tool": lambda pool, **grants: pool.tool(**grants),
    "langchain": langchain_tool,
    "strands": strands_tool,
}


@pytest.mark.parametrize("maker", MAKERS)
def test_a_write_grant_over_the_runtime_is_refused_when_the_tool_is_made(pool: Pool, maker: str) -> None:
    with pytest.raises(RequestError, match=r"^allow_write: .* overlaps the runtime path"):
        MAKERS[maker](pool, allow_write=[SITE])


def test_the_control_the_pool_refuses_the_same_grant_at_a_run_and_a_good_one_writes(pool: Pool,
                                                                                     tmp_path: Path) -> None:
    with pytest.raises(RequestError, match="overlaps the runtime path"):  # the pool's own refusal, at the run
        pool.run("print(1)", allow_write=[SITE])
    tool = pynox.CodeTool(pool, allow_write=[str(tmp_path)])
    assert tool.run(f"open({str(tmp_path / 'out')!r}, 'w').write('x')").ok
    assert (tmp_path / "out").read_text() == "x"
