"""The core's one native part: the child's confinement in one call (src/pynox/policy/_confine.c, bound by
policy/native.py). Everything else about the package is in pyproject.toml.

Optional: where it cannot be built (no C compiler, no Python headers), the package installs without it and
children confine through the Python steps, the same rules (`pynox check` says which path a pool takes)."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("pynox.policy._confine", ["src/pynox/policy/_confine.c"],
                             extra_compile_args=["-O2", "-Wall", "-Werror=implicit-function-declaration"],
                             optional=True)])
