"""A session fork, as the client sees it: :meth:`pynox.Session.fork` and its request.

The pool copies the session's live process (copy-on-write: every variable, picklable or not) into a new
session under a name this client chose, with the same grants and limits (see pynox.server.session_fork). The
copy is a :class:`~pynox.Session` of its own: its steps, its end and its close are its own, and the
original's are the original's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import SessionStateError
from ..protocol import Units
from .saved import pool_step

if TYPE_CHECKING:
    from .pool import Session

__all__ = ["fork"]


def fork(session: Session, timeout: Units | None) -> Session:
    """A new session whose process is a copy of ``session``'s; RequestError if the pool refused the fork (no
    process, a scratch directory, max_sessions ...), SessionStateError if the fork itself failed."""
    copy = type(session)(session.pool, session.functions, dict(session.grants), host_errors=session.host_errors)
    reply, opened_on = pool_step(session, "fork", timeout, fork=copy._name)
    if reply.error is not None or reply.forked != copy._name:
        error = reply.error
        detail = f"{error.type}: {error.message}" if error is not None else "no copy came back"
        raise SessionStateError(f"the session could not be forked: {detail}")
    with copy._lock:  # the pool holds the copy's process: its steps are later steps, never a first request
        copy._open, copy._opening, copy._opened_on, copy.steps = True, 1, opened_on, session.steps
    return copy
