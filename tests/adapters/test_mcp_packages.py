"""``pynox-mcp --package``: the server's pool installs the packages its command line names, under the config's
ceiling; the model reads them in the tool's description. The packages are the test's own wheels, from a
wheelhouse directory: no network beyond this machine.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import anyio
import mcp_types as types
import pytest

from tests.harness.fixtures import packages_config

from .test_mcp import SERVER, connect, text_of

pytestmark = pytest.mark.timeout(120)


config = packages_config("mcp-packages")


def _mcp(args: list[str], code: str) -> tuple[str, types.CallToolResult]:
    async def main() -> tuple[str, types.CallToolResult]:
        async with connect(*args) as client:
            [tool] = (await client.list_tools()).tools
            return tool.description or "", await client.call_tool("run_python", {"code": code})

    return anyio.run(main)


def test_pynox_mcp_installs_its_package_flags(config: Path, earlier_pools: frozenset[int]) -> None:
    description, result = _mcp(["--config", str(config), "--package", "tinypkg==1.0", "--workers", "1"],
                               "import tinypkg\nprint(tinypkg.VALUE)")
    assert result.is_error is False and text_of(result) == "41", text_of(result)
    assert "Installed for this tool: tinypkg==1.0." in description
    # The control: the same server without the flag; the model reads why, and what to ask for.
    description, result = _mcp(["--config", str(config), "--workers", "1"], "import tinypkg")
    assert result.is_error is True and "--package tinypkg" not in text_of(result)
    assert 'packages=["tinypkg"]' in text_of(result)


def test_pynox_mcp_refuses_a_package_outside_the_ceiling_at_start(config: Path, earlier_pools: frozenset[int]) -> None:
    done = subprocess.run([SERVER, "--config", str(config), "--package", "scipy"], capture_output=True, text=True,
                          timeout=60, check=False, stdin=subprocess.PIPE)
    assert done.returncode == 2 and "scipy is not among the packages" in done.stderr, done.stderr
