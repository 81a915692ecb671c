"""The names a request may give: host functions and environment variables.

One rule each, used wherever a name arrives: the request line (``resolve``),
the config file (``config``), a tool made in Python (``code_tool``) and the
smolagents executor (through ``CodeTool``). Each caller raises its own
error type, with this wording.
"""

from __future__ import annotations

__all__ = ["ENV_RULE", "FUNCTION_RULE", "is_env_variable", "is_function_name"]

FUNCTION_RULE = "is not a public Python identifier"
ENV_RULE = "names must be non-empty without '=' or NUL, values strings without NUL"


def is_function_name(name: object) -> bool:
    """A host function is imported by name from ``pynox_host``: a public identifier."""
    return isinstance(name, str) and name.isidentifier() and not name.startswith("_")


def is_env_variable(key: object, value: object) -> bool:
    """What ``execve`` and ``os.environ`` can hold: a non-empty name without '=' or NUL, a string without NUL."""
    return (isinstance(key, str) and isinstance(value, str) and bool(key) and "=" not in key and "\0" not in key
            and "\0" not in value)
