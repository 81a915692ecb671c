"""What a pool that carries pynox's API over another transport builds on (``pynox_ray.RayPool`` is one).

Such a pool runs each job on a ``pynox pool`` somewhere else and answers its
host calls in the caller's process; it offers ``pynox.Pool``'s API, so it is a
:class:`pynox.Runner` and gets its tool from :func:`make_tool`. Everything here
is the core's own code, as the local pool uses it: host calls are checked and
answered by :func:`answer_call` (signature binding, strict conversion, the size
bound, what an exception may tell the job), whichever transport brought them.
A transport of its own (``pynox_ray.fleet``) carries the protocol's lines under ``pynox.Pool(transport=...)``:
:class:`Transport` is what it offers, and the protocol's messages it routes are here as the core's own typed
structs (docs/protocol.md). The names are pinned by the public-surface test, as ``pynox.__all__`` is.
"""

from __future__ import annotations

from .client.host_functions import HostErrors, HostLoop, answer_call, awaiting_on, step_functions
from .client.model_tool import make_tool
from .client.pool import pool_argv
from .client.result import Result
from .client.transports import Transport, TransportFactory
from .grant_types import RUN_GRANT_NAMES, SESSION_GRANT_NAMES
from .protocol import (
    Answer,
    CallEvent,
    Closed,
    ErrorInfo,
    ReadyEvent,
    Reply,
    Request,
    SessionResult,
    StartErrorEvent,
    StatsEvent,
    decode_answer,
    encode,
    first_line_decoder,
)
from .wire.exits import WORKER_ERROR_EXIT

__all__ = ["RUN_GRANT_NAMES", "SESSION_GRANT_NAMES", "STATS_FIELDS", "Answer", "CallEvent", "Closed", "ErrorInfo",
           "HostErrors", "HostLoop", "ReadyEvent", "Reply", "Request", "SessionResult", "StartErrorEvent", "StatsEvent",
           "Transport", "TransportFactory", "answer_call", "awaiting_on", "decode_answer", "encode",
           "first_line_decoder", "lost_result", "lost_wire", "make_tool", "pool_argv", "step_functions"]

# The counters and gauges of a pool's stats event (docs/protocol.md), for a transport that adds up several.
STATS_FIELDS: tuple[str, ...] = StatsEvent.__struct_fields__


def lost_result(message: str, *, id: str | int | float | None = None, session: str | None = None,
                session_ended: bool = False) -> Result:
    """The one result of a run whose pool was lost under it (``PoolWorkerError``, exit 70), as a local pool
    reports a worker that died under its job: it may have run, and is not retried."""
    return Result.from_wire(lost_wire(message, id=id, session=session, session_ended=session_ended))


def lost_wire(message: str, *, id: str | int | float | None = None, session: str | None = None,
              session_ended: bool = False) -> SessionResult:
    """:func:`lost_result` as the protocol's line, for a transport that answers for a pool it lost."""
    return SessionResult(id=id, exit=WORKER_ERROR_EXIT, error=ErrorInfo(type="PoolWorkerError", message=message),
                         session=session, session_ended=session_ended)
