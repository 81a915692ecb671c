"""The core's native parts: the child's confinement in one call (src/pynox/policy/_confine.c, bound by
policy/native.py) and the template's steady-state cycle (src/pynox/template/_fork_loop.c, entered by
template/fork_server.py). Everything else about the package is in pyproject.toml.

Optional: where they cannot be built (no C compiler, no Python headers), the package installs without them:
children confine through the Python steps, the same rules (`pynox check` says which path a pool takes), and the
template serves every cycle in Python."""

from setuptools import Extension, setup

_FLAGS = ["-O2", "-Wall", "-Werror=implicit-function-declaration"]

setup(ext_modules=[Extension("pynox.policy._confine", ["src/pynox/policy/_confine.c"], extra_compile_args=_FLAGS,
                             optional=True),
                   Extension("pynox.template._fork_loop", ["src/pynox/template/_fork_loop.c"],
                             extra_compile_args=_FLAGS, optional=True)])
