"""What a pool and a job get when neither the request, the command line nor the config file says.

A leaf module: the client, the CLI, the config, the grants and the server all read it, and the
client must not load the config and policy machinery (libseccomp among it) just to know a number.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DEFAULTS", "DEFAULT_WORKERS", "Defaults"]

DEFAULT_WORKERS = 2  # concurrent jobs


@dataclass(frozen=True)
class Defaults:
    """A job's limits when its request, its profile and the ceiling set none."""

    timeout: float = 30.0  # seconds
    memory: int = 1 << 30  # bytes
    max_output: int = 1 << 20  # bytes of stdout and of stderr each
    name: str = "agent.py"  # the file name tracebacks show


DEFAULTS = Defaults()
