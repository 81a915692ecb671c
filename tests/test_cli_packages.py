"""``pynox run --package``: the packages are installed (from the wheelhouse ``--config`` names, under its
ceiling) before the one job runs; the hints speak in flags."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.wheelhouse import make_wheelhouse, pool_config

pytestmark = pytest.mark.timeout(120)


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pynox", "run", *args], capture_output=True, text=True, timeout=60,
                          check=False, cwd=cwd)


def test_pynox_run_installs_its_package_flags(tmp_path: Path) -> None:
    house = make_wheelhouse(tmp_path)
    config = pool_config(tmp_path / "pynox.toml", packages_dir=tmp_path / "packages", find_links=[str(house.dir)],
                         allowed=["tinypkg", "tinydep"])
    done = _run("--config", str(config), "--package", "tinypkg", "-c", "import tinypkg\nprint(tinypkg.VALUE)",
                cwd=tmp_path)
    assert done.returncode == 0 and done.stdout == "42\n", done.stderr
    refused = _run("--config", str(config), "--package", "scipy", "-c", "print(1)", cwd=tmp_path)
    assert refused.returncode == 2 and "scipy is not among the packages" in refused.stderr, refused.stderr
    # The control: without the flag the module is missing, and the hint names the flag that would add it.
    missing = _run("--config", str(config), "-c", "import tinypkg", cwd=tmp_path)
    assert missing.returncode == 1 and "hint: tinypkg is not installed" in missing.stderr, missing.stderr
    assert "--package tinypkg" in missing.stderr


def test_pynox_run_without_an_index_refuses_a_package(tmp_path: Path) -> None:
    done = _run("--package", "tinypkg", "-c", "print(1)", cwd=tmp_path)
    assert done.returncode == 2 and "installs no packages" in done.stderr, done.stderr
