"""What a pool that carries pynox's API over another transport builds on (``pynox_ray.RayPool`` is one).

Such a pool runs each job on a ``pynox pool`` somewhere else and answers its
host calls in the caller's process; it offers ``pynox.Pool``'s API, so it is a
:class:`pynox.Runner` and gets its tool from :func:`make_tool`. Everything here
is the core's own code, as the local pool uses it: host calls are checked and
answered by :func:`answer_call` (signature binding, strict conversion, the size
bound, what an exception may tell the job), whichever transport brought them.
The names are pinned by the public-surface test, as ``pynox.__all__`` is.
"""

from __future__ import annotations

from .client.host_functions import HostErrors, HostLoop, answer_call, awaiting_on, step_functions
from .client.model_tool import make_tool
from .client.result import Result
from .grant_types import RUN_GRANT_NAMES, SESSION_GRANT_NAMES
from .protocol import ErrorInfo, SessionResult, StatsEvent
from .wire.exits import WORKER_ERROR_EXIT

__all__ = ["RUN_GRANT_NAMES", "SESSION_GRANT_NAMES", "STATS_FIELDS", "HostErrors", "HostLoop", "answer_call",
           "awaiting_on", "lost_result", "make_tool", "step_functions"]

# The counters and gauges of a pool's stats event (docs/protocol.md), for a transport that adds up several.
STATS_FIELDS: tuple[str, ...] = StatsEvent.__struct_fields__


def lost_result(message: str, *, id: str | int | None = None, session: str | None = None,
                session_ended: bool = False) -> Result:
    """The one result of a run whose pool was lost under it (``PoolWorkerError``, exit 70), as a local pool
    reports a worker that died under its job: it may have run, and is not retried."""
    wire = SessionResult(id=id, exit=WORKER_ERROR_EXIT, error=ErrorInfo(type="PoolWorkerError", message=message),
                         session=session, session_ended=session_ended)
    return Result.from_wire(wire)
