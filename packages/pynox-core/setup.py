"""The core's native parts: the child's confinement in one call (src/pynox/policy/_confine.c, bound by
policy/native.py) and the template's steady-state cycle (src/pynox/template/_fork_loop.c, entered by
template/fork_server.py). Everything else about the package is in pyproject.toml.

Optional: where they cannot be built (no C compiler, no Python headers), the package installs without them:
children confine through the Python steps, the same rules (`pynox check` says which path a pool takes), and the
template serves every cycle in Python."""

import hashlib
import os
from pathlib import Path

from setuptools import Extension, setup

_FLAGS = ["-O2", "-Wall", "-Werror=implicit-function-declaration"]
_SOURCES = Path(__file__).with_name("src")


def _extension(name: str, source: str) -> Extension:
    """``source`` built as ``name``, its SHA-256 compiled in (``SOURCE``): pynox/extensions.py loads it only if the
    source beside it is the one it was built from. Its file's identity too (``SOURCE_FILE``: device, inode, size,
    change time): while the file beside it is still that one, unchanged (any write, and any setting of its times,
    moves the change time, which nothing but the clock sets), the loader need not read and hash it."""
    path = _SOURCES.joinpath(source)
    held = os.stat(path)  # before it is read: a write after this moves the change time
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    identity = f"{held.st_dev}:{held.st_ino}:{held.st_size}:{held.st_ctime_ns}"
    return Extension(name, [f"src/{source}"], define_macros=[("PYNOX_SOURCE", f'"{digest}"'),
                                                             ("PYNOX_SOURCE_FILE", f'"{identity}"')],
                     extra_compile_args=_FLAGS, optional=True)


setup(ext_modules=[_extension("pynox.policy._confine", "pynox/policy/_confine.c"),
                   _extension("pynox.template._fork_loop", "pynox/template/_fork_loop.c")])
