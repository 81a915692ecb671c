"""A session fork, as the client sees it: :meth:`pynox.Session.fork` and its request.

The pool copies the session's live process (copy-on-write: every variable, picklable or not) into a new
session under a name this client chose, with the same grants and limits (see pynox.server.session_fork). The
copy is a :class:`~pynox.Session` of its own: its steps, its end and its close are its own, and the
original's are the original's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import PoolError, RequestError, SessionStateError
from ..protocol import Request, SessionResult, Units
from .saved import answer_margin, seconds

if TYPE_CHECKING:
    from .pool import Session

__all__ = ["fork"]


def fork(session: Session, timeout: Units | None) -> Session:
    """A new session whose process is a copy of ``session``'s; RequestError if the pool refused the fork (no
    process, a scratch directory, max_sessions ...), SessionStateError if the fork itself failed."""
    with session._lock:
        name, opened, opening, opened_on = session._name, session._open, session._opening, session._opened_on
    if not opened:
        raise RequestError("fork: the session has no process yet (or its last one ended): run a step first")
    copy = type(session)(session.pool, session.functions, dict(session.grants), host_errors=session.host_errors)
    patience = seconds(timeout if timeout is not None else session.grants.get("timeout"))
    request = Request(session=name, fork=copy._name, timeout=timeout)
    reply = session.pool._wait_for(session.pool._submit(request), float(patience) + answer_margin, hang=False)
    if not isinstance(reply, SessionResult):
        raise PoolError(f"the pool answered a fork with {type(reply).__name__}")
    session._ended_with(reply, opening)
    if reply.refused:
        raise RequestError(reply.error.message if reply.error else "the pool refused the fork")
    if reply.error is not None or reply.forked != copy._name:
        error = reply.error
        detail = f"{error.type}: {error.message}" if error is not None else "no copy came back"
        raise SessionStateError(f"the session could not be forked: {detail}")
    with copy._lock:  # the pool holds the copy's process: its steps are later steps, never a first request
        copy._open, copy._opening, copy._opened_on, copy.steps = True, 1, opened_on, session.steps
    return copy
