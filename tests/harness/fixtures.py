"""The one factory for the pools a test module shares: a module states what pool it needs in one line,
``pool = shared_pool(workers=1)``, and borrows its making, closing and scope from here.

(The pool suite's own ``pool`` fixture over the JSON Lines driver is in tests/pool/conftest.py, on
``pool_driver.pool_process``; the adapter suite's, with its leftover check, in tests/adapters/conftest.py.)
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pynox import Pool
from tests.wheelhouse import make_wheelhouse, pool_config


def shared_pool(*, workers: int = 2, scope: Any = "module", **options: Any) -> Any:
    """A fixture named ``pool``: one :class:`pynox.Pool` with ``workers`` (and ``options``) shared by the
    tests of its ``scope``, closed after them."""

    @pytest.fixture(scope=scope, name="pool")
    def pool() -> Iterator[Pool]:
        with Pool(workers=workers, **options) as shared:
            yield shared

    return pool


def passable_run_dir(prefix: str) -> Any:
    """A fixture named ``run_dir``: a directory anyone may pass through (pytest's own are root's only), for a
    listening pool's socket another user reaches; who is served is the pool's decision. Removed after the test."""

    @pytest.fixture(name="run_dir")
    def run_dir() -> Iterator[Path]:
        path = Path(tempfile.mkdtemp(prefix=prefix))
        path.chmod(0o755)
        yield path
        shutil.rmtree(path, ignore_errors=True)

    return run_dir


def packages_config(prefix: str) -> Any:
    """A fixture named ``config``: a pynox.toml, in a directory of its own named from ``prefix``, whose pool
    installs ``tinypkg`` and ``tinydep`` (and nothing else) from a wheelhouse on this machine."""

    @pytest.fixture(scope="module", name="config")
    def config(tmp_path_factory: pytest.TempPathFactory) -> Path:
        root = tmp_path_factory.mktemp(prefix)
        house = make_wheelhouse(root)
        return pool_config(root / "pynox.toml", packages_dir=root / "packages", find_links=[str(house.dir)],
                           allowed=["tinypkg", "tinydep"])

    return config


def session_key_config(directory: Path, pool_keys: str = "") -> Path:
    """A pynox.toml in ``directory`` naming a random 32-byte ``session_key_file`` beside it (and ``pool_keys``, more
    ``[pool]`` lines): two pools started with it share the key saved sessions are signed with, as a pool
    restarted with its key file would."""
    (directory / "state.key").write_bytes(os.urandom(32))
    path = directory / "pynox.toml"
    path.write_text(f'[pool]\nsession_key_file = "state.key"\n{pool_keys}')
    return path
