"""The core's one native part: the child's confinement in one call (src/pynox/policy/_confine.c, bound by
policy/native.py). Everything else about the package is in pyproject.toml.

Optional: where it cannot be built (no C compiler, no Python headers), the package installs without it and
children confine through the Python steps, the same rules (`pynox check` says which path a pool takes)."""

import hashlib
from pathlib import Path

from setuptools import Extension, setup

SOURCE = "src/pynox/policy/_confine.c"
# The digest of the source it was built from, which policy/native.py compares with the source beside it (an
# editable install whose _confine.c changed since its last build would otherwise pass the new Python's arguments
# to the old C: see native.py's _stale).
DIGEST = hashlib.sha256(Path(__file__).with_name("src").joinpath("pynox/policy/_confine.c").read_bytes()).hexdigest()

setup(ext_modules=[Extension("pynox.policy._confine", [SOURCE],
                             define_macros=[("PYNOX_CONFINE_SOURCE", f'"{DIGEST}"')],
                             extra_compile_args=["-O2", "-Wall", "-Werror=implicit-function-declaration"],
                             optional=True)])
