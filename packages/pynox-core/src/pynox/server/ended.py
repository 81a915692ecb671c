"""The names of sessions the pool ended, and why: what the step that reopens such a name is told.

After a session ends (a timeout, a crash, an exit, ``session_idle``, a cancel
past its grace), the next request under its name opens a new process with the
permissions that request brings, as the protocol says. Its state is gone, and
the client and the model must hear it: the first result of the new session
carries ``session_reopened`` with the reason kept here. A client's own close
is not kept (it knows). The memory is bounded: the last :data:`REMEMBERED`
names, each for at most :data:`REMEMBERED_FOR` seconds; a name forgotten
since reopens without the field, as on a restarted pool.

With ``[pool] strict_session_reopen``, a code-only step to a name kept here is
refused instead (see serve.py): an operator's opt-in, stricter than the protocol.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict

__all__ = ["REMEMBERED", "REMEMBERED_FOR", "EndedSessions"]

REMEMBERED = 4096  # names
REMEMBERED_FOR = 24 * 3600.0  # seconds


class EndedSessions:
    def __init__(self, size: int = REMEMBERED, keep_for: float = REMEMBERED_FOR) -> None:
        self._size, self._keep_for = size, keep_for
        self._lock = threading.Lock()
        self._why: OrderedDict[str, tuple[float, str]] = OrderedDict()  # name -> (when, why), oldest first

    def remember(self, name: str, why: str) -> None:
        with self._lock:
            self._why.pop(name, None)
            self._why[name] = (time.monotonic(), why)
            while len(self._why) > self._size:
                self._why.popitem(last=False)

    def why(self, name: str) -> str | None:
        """Why the pool ended the session last held under ``name``, if it remembers."""
        with self._lock:
            self._expire()
            entry = self._why.get(name)
            return entry[1] if entry is not None else None

    def take(self, name: str) -> str | None:
        """:meth:`why`, forgotten now: a new session opens under the name."""
        with self._lock:
            self._expire()
            entry = self._why.pop(name, None)
            return entry[1] if entry is not None else None

    def _expire(self) -> None:
        oldest = time.monotonic() - self._keep_for
        while self._why and next(iter(self._why.values()))[0] < oldest:
            self._why.popitem(last=False)
