"""Grants are typed keyword arguments, one definition for the core and every adapter (issue 32, types).

A user's script is checked by ``mypy --strict`` as a user runs it (the packages installed, ``py.typed`` in
each): the correct one passes, each misspelt grant is an error on its own line. At run time the same typo is a
``TypeError`` that names the grant, the likeliest meant one and the valid ones, from every entry point.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import pynox
from pynox.grant_types import GRANT_NAMES
from pynox_langchain import PynoxEval
from pynox_langchain import python_tool as langchain_tool
from pynox_mcp._cli import build_parser as mcp_parser
from pynox_monty import python_function
from pynox_pydantic_ai import PynoxCodeMode, PynoxToolset
from pynox_smolagents import PynoxExecutor
from pynox_smolagents import python_tool as smolagents_tool
from pynox_strands import PynoxSandbox
from pynox_strands import python_tool as strands_tool

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ["pynox", "pynox_pydantic_ai", "pynox_strands", "pynox_smolagents", "pynox_monty", "pynox_ray",
            "pynox_langchain", "pynox_mcp"]

USER_SCRIPT = '''\
import pynox
from pynox_langchain import PynoxEval
from pynox_langchain import python_tool as langchain_tool
from pynox_pydantic_ai import PynoxCodeMode, PynoxToolset
from pynox_smolagents import PynoxExecutor
from pynox_smolagents import python_tool as smolagents_tool
from pynox_strands import python_tool as strands_tool


def build(pool: pynox.Pool) -> None:
    pool.run("print(1)", allow_read=["data"], timeout="5s", name="job.py")
    pool.session(allow_write=["out"], profile="analysis")
    pynox.run("print(1)", memory="256MB")
    pynox.tool(allow_network=False, env={"MODE": "test"})
    PynoxToolset(pool, session=True, allow_read=["data"])
    PynoxCodeMode(pool, max_output="1MB")
    strands_tool(pool, max_file_size="10MB")
    smolagents_tool(pool, package_dirs=["vendor"])
    PynoxExecutor(pool, timeout_seconds=5, allow_read=["data"])
    langchain_tool(pool, session=True, memory="256MB")
    PynoxEval(pool, profile="analysis", allow_write=["out"])
'''

TYPOS = {  # line of the script -> the call with a misspelt grant
    11: 'pool.run("print(1)", allow_reed=["data"])',
    12: 'pool.session(alow_write=["out"])',
    13: 'pynox.run("print(1)", memroy="256MB")',
    14: "pynox.tool(allow_netwrk=True)",
    15: 'PynoxToolset(pool, allow_reed=["data"])',
    16: 'PynoxCodeMode(pool, time_out="5s")',
    17: 'strands_tool(pool, allow_reed=["data"])',
    18: 'smolagents_tool(pool, allow_reed=["data"])',
    19: 'PynoxExecutor(pool, allow_reed=["data"])',
    20: 'langchain_tool(pool, memroy="256MB")',
    21: 'PynoxEval(pool, alow_write=["out"])',
}


def _mypy(script: Path) -> subprocess.CompletedProcess[str]:
    # From the checkout, so mypy's cache of the frameworks (warm from `python -m mypy`) is reused.
    return subprocess.run([sys.executable, "-m", "mypy", "--strict", "--no-error-summary", str(script)], cwd=ROOT,
                          capture_output=True, text=True, timeout=600, check=False)


@pytest.mark.timeout(600)
def test_mypy_strict_passes_a_users_script_and_names_each_misspelt_grant(tmp_path: Path) -> None:
    good = tmp_path / "good.py"
    good.write_text(USER_SCRIPT)
    checked = _mypy(good)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    lines = USER_SCRIPT.splitlines()
    for number, call in TYPOS.items():
        lines[number - 1] = f"    {call}"
    bad = tmp_path / "bad.py"
    bad.write_text("\n".join(lines) + "\n")
    checked = _mypy(bad)
    errors = {int(found.group(1)) for found in re.finditer(r"bad\.py:(\d+): error: Unexpected keyword argument",
                                                           checked.stdout)}
    assert errors == set(TYPOS), checked.stdout


def test_every_package_ships_its_py_typed_marker() -> None:
    import importlib

    for package in PACKAGES:
        module = importlib.import_module(package)
        assert module.__file__ is not None
        assert (Path(module.__file__).parent / "py.typed").is_file(), package


MAKERS: dict[str, tuple[str, Callable[..., Any]]] = {  # test id -> (the owner its message names, the maker)
    "CodeTool()": ("CodeTool()", pynox.CodeTool),
    "PynoxToolset()": ("PynoxToolset()", PynoxToolset),
    "PynoxCodeMode()": ("PynoxCodeMode()", PynoxCodeMode),
    "strands python_tool()": ("python_tool()", strands_tool),
    "PynoxSandbox()": ("PynoxSandbox()", PynoxSandbox),
    "PynoxExecutor()": ("PynoxExecutor()", PynoxExecutor),
    "python_function()": ("python_function()", lambda **grants: python_function(None, **grants)),  # type: ignore[arg-type]
    "langchain python_tool()": ("python_tool()", langchain_tool),
    "PynoxEval()": ("PynoxEval()", PynoxEval),
}


@pytest.mark.pure
@pytest.mark.parametrize("maker", MAKERS)
def test_a_misspelt_grant_is_named_with_the_valid_ones(maker: str) -> None:
    owner, make = MAKERS[maker]
    with pytest.raises(TypeError) as refused:
        make(allow_reed=["data"])
    message = str(refused.value)
    assert message.startswith(f"{owner} got an unknown grant 'allow_reed' (did you mean 'allow_read'?)")
    assert "allow_write" in message and "max_file_size" in message and "build_request" not in message
    with pytest.raises(TypeError, match=r"^python_tool\(\) got an unknown grant 'alow_read'"):
        smolagents_tool(alow_read=["data"])  # type: ignore[call-arg]  # the misspelt keyword is the case


def test_the_pools_own_entry_points_name_a_misspelt_grant() -> None:
    with pynox.Pool(workers=1) as pool:
        with pytest.raises(TypeError, match=r"^Pool\.run\(\) got an unknown grant 'allow_reed' \(did you mean "
                                            r"'allow_read'\?\); the grants are: allow_hosts, allow_network, "
                                            r"allow_read"):
            pool.run("print(1)", allow_reed=["data"])  # type: ignore[call-arg]
        with pytest.raises(TypeError, match=r"^Pool\.session\(\) got an unknown grant 'scrip'"):
            pool.session(scrip="job.py")  # type: ignore[call-arg]
        assert pool.run("print(6 * 7)", name="ok.py").stdout == "42\n"  # the control: a right grant runs


@pytest.mark.pure
def test_pynox_mcps_grant_flags_are_the_grants_names() -> None:
    """pynox-mcp takes its grants from its command line (the core's grant flags, which pynox-jupyter's kernelspec
    takes too): each flag of that group is a grant of the same name, and reads back as that grant."""
    parser = mcp_parser()
    [group] = [group for group in parser._action_groups if group.title and group.title.startswith("what the code")]
    flags = {action.dest for action in group._group_actions} - {"config", "profile"}  # the pool's, not a grant
    args = parser.parse_args(["--allow-read", "data", "--allow-write", "out", "--allow-network", "--allow-host",
                              "index.example.com", "--timeout", "5s", "--memory", "256m", "--max-output", "1m",
                              "--max-file-size", "1m", "--env", "A=1", "--package", "numpy"])
    assert set(pynox.grants_from_arguments(args)) == flags
    assert pynox.grants_from_arguments(mcp_parser().parse_args(pynox.grant_argv(pynox.grants_from_arguments(args)))) \
        == pynox.grants_from_arguments(args)  # written back as flags (a kernelspec's), they read as the same grants
    assert flags <= GRANT_NAMES, flags - GRANT_NAMES


def test_the_tool_makers_name_a_pool_given_as_a_keyword() -> None:
    """``pynox.tool`` runs on the default pool and ``Pool.tool`` on its own: a ``pool=`` keyword is refused with
    what to call instead, not as CodeTool's own parameter given twice."""
    with pytest.raises(TypeError, match=r"^pynox\.tool\(\) takes no pool: it runs on the default pool; for another "
                                        r"pool call that pool's \.tool\(\.\.\.\)"):
        pynox.tool(pool=None)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match=r"^pynox\.tool\(\) got an unknown grant 'allow_reed'"):
        pynox.tool(allow_reed=["data"])  # type: ignore[call-arg]
    with pynox.Pool(workers=1) as pool:
        with pytest.raises(TypeError, match=r"^Pool\.tool\(\) takes no pool: it runs on its own"):
            pool.tool(pool=pool)  # type: ignore[call-arg]
        assert pool.tool()("print(6 * 7)") == "42"  # the control: the same maker without it
