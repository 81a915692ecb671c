"""A session's saved state, as the client sees it: :class:`SavedSession`, and the save and restore requests.

:meth:`pynox.Session.save` asks the pool to serialize the session's ``__main__`` inside its confined process
(see pynox.server.session_state); the answer is the state, signed with the pool's key, and the variables left
out with the reason. ``Pool.session(restore=saved)`` opens a session whose first request gives that state back:
the pool checks its HMAC and the new process unpickles it, under the grants the new session is given. This
process never unpickles it.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec

from ..errors import PoolError, RequestError, SessionStateError
from ..protocol import Request, SessionResult, Units
from ..units import parse_duration
from .requests import build_request

if TYPE_CHECKING:
    from .pool import Session, _Transport

__all__ = ["SavedSession", "pool_step", "restore", "save"]

_ANSWER_MARGIN = 30.0  # seconds past the step's own timeout before a save, restore or fork gives up on the pool


@dataclass(frozen=True)
class SavedSession:
    """A session's variables as the pool saved them: ``data`` (opaque bytes, signed by the pool; keep them
    anywhere and give them to ``Pool.session(restore=...)`` of a pool with the same key) and ``skipped``:
    each variable left out, by name, with the reason (an open file, a socket, a generator: what cannot be
    pickled)."""

    data: bytes
    skipped: dict[str, str] = field(default_factory=dict)

    def __bytes__(self) -> bytes:
        return self.data


def _state_error(result: SessionResult, what: str) -> SessionStateError:
    error = result.error
    if error is not None:
        detail = f"{error.type}: {error.message}"
    elif result.session_ended:
        detail = f"its process ended (exit status {result.exit})"
    else:
        detail = "no state came back"
    return SessionStateError(f"{what}: {detail}")


def _seconds(timeout: object) -> float:
    return parse_duration(timeout, "timeout") if isinstance(timeout, str | int | float) else 30.0


def pool_step(session: Session, what: str, timeout: Units | None,
              **fields: Any) -> tuple[SessionResult, _Transport | None]:
    """A request the pool runs as a step of the session's open process (``what``: a save, a fork; ``fields``
    say which): its answer, taken by the session (its end, if it ended), and the pool process the session was
    opened on. RequestError if the session has no process, or the pool refused the request."""
    with session._lock:
        name, opened, opening, opened_on = session._name, session._open, session._opening, session._opened_on
    if not opened:
        raise RequestError(f"{what}: the session has no process yet (or its last one ended): run a step first")
    patience = _seconds(timeout if timeout is not None else session.grants.get("timeout"))
    request = Request(session=name, timeout=timeout, **fields)
    reply = session.pool._wait_for(session.pool._submit(request), float(patience) + _ANSWER_MARGIN, hang=False)
    if not isinstance(reply, SessionResult):
        raise PoolError(f"the pool answered a {what} with {type(reply).__name__}")
    session._ended_with(reply, opening)
    if reply.refused:
        raise RequestError(reply.error.message if reply.error else f"the pool refused the {what}")
    return reply, opened_on


def save(session: Session, timeout: Units | None) -> SavedSession:
    """Serialize the session's variables in its process; SessionStateError if that did not work."""
    reply, _ = pool_step(session, "save", timeout, save=True)
    if reply.error is not None or not isinstance(reply.state, str):
        raise _state_error(reply, "the session's state could not be saved")
    skipped = reply.skipped if isinstance(reply.skipped, list) else []
    return SavedSession(data=base64.b64decode(reply.state), skipped={item.name: item.reason for item in skipped})


def restore(session: Session, state: bytes) -> None:
    """Open the session's process with ``state`` loaded into its ``__main__``, under the session's grants."""
    with session._lock:
        session._open, session._opening = True, session._opening + 1
        opening = -session._opening
    grants = dict(session.grants)
    first = build_request(None, functions=list(session.functions), **grants)
    request = msgspec.structs.replace(first, session=session._name, open=True,
                                      restore=base64.b64encode(state).decode())
    patience = _seconds(grants.get("timeout"))
    future = session._submit(request, opening, {})
    reply = session.pool._wait_for(future, patience + _ANSWER_MARGIN, hang=False)
    if not isinstance(reply, SessionResult):
        raise PoolError(f"the pool answered a restore with {type(reply).__name__}")
    session._ended_with(reply, opening)
    if reply.refused:
        raise RequestError(reply.error.message if reply.error else "the pool refused the restore")
    if reply.error is not None or reply.session_ended or reply.exit != 0:
        # The state's code may end the process as it loads (os._exit) with no Python error: failed all the same.
        session.close()  # a process without the state must not pass for the restored session
        raise _state_error(reply, "the session's state could not be restored")
