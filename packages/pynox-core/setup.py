"""The core's native parts: the child's confinement in one call (src/pynox/policy/_confine.c, bound by
policy/native.py) and the template's steady-state cycle (src/pynox/template/_fork_loop.c, entered by
template/fork_server.py). Everything else about the package is in pyproject.toml.

Optional: where they cannot be built (no C compiler, no Python headers), the package installs without them:
children confine through the Python steps, the same rules (`pynox check` says which path a pool takes), and the
template serves every cycle in Python."""

import hashlib
from pathlib import Path

from setuptools import Extension, setup

_FLAGS = ["-O2", "-Wall", "-Werror=implicit-function-declaration"]
_SOURCES = Path(__file__).with_name("src")


def _extension(name: str, source: str) -> Extension:
    """``source`` built as ``name``, its SHA-256 compiled in (``SOURCE``): pynox/extensions.py loads it only if the
    source beside it is the one it was built from."""
    digest = hashlib.sha256(_SOURCES.joinpath(source).read_bytes()).hexdigest()
    return Extension(name, [f"src/{source}"], define_macros=[("PYNOX_SOURCE", f'"{digest}"')],
                     extra_compile_args=_FLAGS, optional=True)


setup(ext_modules=[_extension("pynox.policy._confine", "pynox/policy/_confine.c"),
                   _extension("pynox.template._fork_loop", "pynox/template/_fork_loop.c")])
