"""Packages through pydantic-ai: an agent (a scripted model) is told what to ask for, then uses it.

The model is told what it can import and what the host installed for it; a package it lacks comes back
with a hint naming the grant; a tool made with the grant imports it. Packages are the test's own wheels,
from a wheelhouse directory: no network beyond this machine.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from pynox import Pool
from pynox_pydantic_ai import PynoxToolset
from tests.harness.fixtures import packages_config

from .procs import wait_for_none
from .scripted import code_calls, run_pydantic_ai

pytestmark = pytest.mark.timeout(120)


config = packages_config("adapter-packages")


@pytest.fixture(scope="module")
def pool(config: Path, earlier_pools: frozenset[int]) -> Iterator[Pool]:
    with Pool(workers=1, config=config) as started:
        yield started
    wait_for_none(earlier_pools)


def test_a_pydantic_ai_agent_is_told_what_to_ask_for_and_then_uses_it(pool: Pool) -> None:
    code = "import tinypkg\nprint(tinypkg.VALUE)"
    without = run_pydantic_ai({"toolsets": [PynoxToolset(pool)]}, code_calls(code))
    assert without.results[0].startswith("ModuleNotFoundError: No module named 'tinypkg'"), without.results
    assert 'packages=["tinypkg"]' in without.results[0]
    description = without.tool("run_python").description
    assert "Importable packages beyond the standard library:" in description and "tinypkg" not in description
    granted = run_pydantic_ai({"toolsets": [PynoxToolset(pool, packages=["tinypkg"])]}, code_calls(code))
    assert granted.results == ["42"], granted.results
    assert "Installed for this tool: tinypkg." in granted.tool("run_python").description


def test_a_pydantic_ai_session_toolset_imports_its_packages_in_every_call(pool: Pool) -> None:
    toolset = PynoxToolset(pool, session=True, packages=["tinypkg"])
    transcript = run_pydantic_ai({"toolsets": [toolset]}, code_calls("import tinypkg", "print(tinypkg.VALUE - 1)"))
    assert transcript.results[-1] == "41", transcript.results
