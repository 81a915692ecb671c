"""The ``packages`` grant from Python: ``Pool.run``, ``Pool.session``, ``pynox.tool`` and ``CodeTool``.

The packages are the test's own, from a wheelhouse directory (tests/wheelhouse.py): no network beyond this
machine. A tool names what its code can import and what the pool installs for it, so the model knows before
its first call.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import pynox
from pynox import Pool, RequestError
from tests.wheelhouse import make_wheelhouse, pool_config

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pool]:
    root = tmp_path_factory.mktemp("client-packages")
    house = make_wheelhouse(root)
    config = pool_config(root / "pynox.toml", packages_dir=root / "packages", find_links=[str(house.dir)],
                         allowed=["tinypkg<2"])
    with Pool(workers=1, config=config) as started:
        yield started


def test_a_run_imports_the_packages_it_names(pool: Pool) -> None:
    result = pool.run("import tinypkg\nprint(tinypkg.VALUE)", packages=["tinypkg"])
    assert result.ok and result.stdout == "41\n", result  # 1.0: the ceiling's bound
    missing = pool.run("import tinypkg")  # the control: without the grant it is not there
    assert missing.error is not None and missing.error["type"] == "ModuleNotFoundError"
    assert 'packages=["tinypkg"]' in missing.error["hint"]


def test_a_package_outside_the_ceiling_raises_request_error(pool: Pool) -> None:
    with pytest.raises(RequestError, match=r"packages: scipy is not among the packages the \[pool.limits\] ceiling"):
        pool.run("import scipy", packages=["scipy"])
    with pytest.raises(TypeError, match="packages must be a list"):
        pool.run("print(1)", packages="tinypkg")


def test_a_session_keeps_its_packages(pool: Pool) -> None:
    with pool.session(packages=["tinypkg"]) as session:
        assert session.run("import tinypkg\nx = tinypkg.VALUE").ok
        assert session.run("print(x + 1)").stdout == "42\n"


def test_a_session_with_pip_install_installs_what_a_pip_line_names(pool: Pool) -> None:
    with pool.session(pip_install=True) as session:
        installed = session.run("%pip install tinypkg\nimport tinypkg\nprint(tinypkg.VALUE)")
        assert installed.stdout == "Installed for this session: tinypkg 1.0\n41\n", installed  # the ceiling's 1.0
    with pool.session() as plain:  # the control: without the opt-in the line is not Python
        assert plain.run("%pip install tinypkg").error["type"] == "SyntaxError"


def test_a_tool_tells_the_model_what_it_can_import_and_what_is_installed_for_it(pool: Pool) -> None:
    tool = pool.tool(packages=["tinypkg"])
    permissions = tool.__doc__ or ""
    assert "Installed for this tool: tinypkg." in permissions, permissions
    assert "Importable packages beyond the standard library: numpy, pandas" in permissions
    assert "Code cannot install packages" in permissions
    assert tool("import tinypkg\nprint(tinypkg.VALUE)") == "41"
    plain = pynox.CodeTool(pool)
    assert "Installed for this tool" not in plain.doc  # the control: a tool without the grant says nothing of it
    with pytest.raises(RequestError, match="scipy"):
        pynox.CodeTool(pool, packages=["scipy"])  # refused when it is made, not at the model's first call


def test_the_default_pools_tool_lists_this_interpreters_packages(tmp_path: Path) -> None:
    tool = pynox.CodeTool()  # the default pool, not started: it will run this interpreter
    assert "Importable packages beyond the standard library: numpy, pandas" in tool.doc
