"""The core's native parts: the child's confinement in one call (src/pynox/policy/_confine.c, bound by
policy/native.py) and a job's relay loop (src/pynox/server/_relay.c, bound by server/capture.py). Everything
else about the package is in pyproject.toml.

Optional: where they cannot be built (no C compiler, no Python headers), the package installs without them:
children confine through the Python steps and the pool reads a job's pipes in Python, the same rules (`pynox
check` says which path a pool takes)."""

from setuptools import Extension, setup

_FLAGS = ["-O2", "-Wall", "-Werror=implicit-function-declaration"]
setup(ext_modules=[Extension("pynox.policy._confine", ["src/pynox/policy/_confine.c"], extra_compile_args=_FLAGS,
                             optional=True),
                   Extension("pynox.server._relay", ["src/pynox/server/_relay.c"], extra_compile_args=_FLAGS,
                             optional=True)])
