"""The exit statuses Pynox gives a result itself; any other status is the job's own.

Shared by the pool (which sets them), the child (which reports a setup failure
with one), the wire (``protocol``), the client and ``pynox check``.
"""

from __future__ import annotations

__all__ = ["CANCELLED_EXIT", "REFUSED_EXIT", "SETUP_FAILED_EXIT", "TIMEOUT_EXIT", "WORKER_ERROR_EXIT"]

REFUSED_EXIT = 2  # the request was refused before anything ran (RequestError), as a usage error
WORKER_ERROR_EXIT = 70  # the pool's own failure under the job (EX_SOFTWARE), not the job's
TIMEOUT_EXIT = 124  # killed at its timeout, as timeout(1) reports it
SETUP_FAILED_EXIT = 125  # the policy could not be applied: the code never ran
CANCELLED_EXIT = 130  # the client cancelled it, as a shell reports a job interrupted with Ctrl-C
