"""The host channel's bounds, shared by the job's ``pynox_host``, the pool's relay and the client.

The pool enforces them (a job can write any frame); ``pynox_host`` checks them
only to give the model a clear error sooner, and the client to refuse an
answer the pool would refuse.
"""

from __future__ import annotations

__all__ = ["MAX_ANSWER", "MAX_IN_FLIGHT", "MAX_PAYLOAD", "PIP_FUNCTION"]

# The pool's own host function in a session opened with pip_install: a `%pip install NAME` line of a step
# calls it, and the pool (never the client) installs NAME for the session (see pynox.server.packages). A
# leading underscore: no declared host function can have this name.
PIP_FUNCTION = "_pynox_pip"

MAX_PAYLOAD = 1_000_000  # bytes of JSON each way
MAX_IN_FLIGHT = 8  # calls of one job waiting for the host at once (the pool refuses more)
MAX_ANSWER = MAX_PAYLOAD + 4096  # the answer wraps the result in a small object
