"""Settings a pool takes when neither its command line nor its config file names them.

A leaf module: the client, the CLI and the server all read it, and the client must not load the
config and policy machinery (libseccomp among it) just to know a number.
"""

from __future__ import annotations

__all__ = ["DEFAULT_WORKERS"]

DEFAULT_WORKERS = 2  # concurrent jobs
