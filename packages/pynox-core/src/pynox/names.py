"""The names a request may give: host functions and environment variables.

One rule each, used wherever a name arrives: the request line (``resolve``),
the config file (``config``), a tool made in Python (``code_tool``) and the
smolagents executor (through ``CodeTool``). Each caller raises its own
error type, with this wording.
"""

from __future__ import annotations

import keyword

__all__ = ["ENV_RULE", "FUNCTION_RULE", "is_env_variable", "is_function_name"]

FUNCTION_RULE = "is not a public Python identifier that code can import (not a keyword, not HostError)"
ENV_RULE = "names must be non-empty without '=' or NUL, values strings without NUL"


def is_function_name(name: object) -> bool:
    """A host function is imported by name from ``pynox_host``: a public identifier, no keyword (no code could name
    it), and not ``HostError``, which ``pynox_host`` has for the code to catch."""
    return (isinstance(name, str) and name.isidentifier() and not name.startswith("_") and not keyword.iskeyword(name)
            and name != "HostError")


def is_env_variable(key: object, value: object) -> bool:
    """What ``execve`` and ``os.environ`` can hold: a non-empty name without '=' or NUL, a string without NUL."""
    return (isinstance(key, str) and isinstance(value, str) and bool(key) and "=" not in key and "\0" not in key
            and "\0" not in value)
