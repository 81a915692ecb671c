"""W3C trace context on requests: ``traceparent`` checked, and kept until the request's result so that its job
log line carries it. Nothing is kept for a request without one (the common case costs one ``if``).

OpenTelemetry spans, when the operator asks for them, are made in spans.py; the log lines carry the
``traceparent`` either way, which every tracing backend's log pipeline can join on.
"""

from __future__ import annotations

import re
import threading

from ..errors import RequestError, quoted
from ..protocol import Request, RequestId

__all__ = ["Traces", "valid_traceparent"]

# version 00: trace id (not all zero), parent id (not all zero), flags; lower-case hex, as the spec requires.
_TRACEPARENT = re.compile(r"00-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}")


def valid_traceparent(value: str) -> bool:
    return _TRACEPARENT.fullmatch(value) is not None


def _key(request_id: RequestId) -> tuple[str, object]:
    return type(request_id).__name__, request_id  # 1, 1.0 and "1" are three ids


class Traces:
    """The trace context of each request that carried one and is not answered yet (a reused id: in order)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_id: dict[tuple[str, object], list[str]] = {}

    def __bool__(self) -> bool:
        return bool(self._by_id)

    def arrived(self, request: Request) -> None:
        """Keep ``request``'s trace context, if it carries one, until its result; RequestError (refused, nothing
        ran) if it is not a W3C trace context."""
        traceparent = request.traceparent
        if traceparent is None:
            return
        if not valid_traceparent(traceparent):
            raise RequestError(f"traceparent: {quoted(traceparent[:80])} is not a W3C trace context "
                               '("00-" 32 hex digits "-" 16 hex digits "-" 2 hex digits)')
        if not (request.stats or request.cancel is not None or request.close):  # answered by a result
            self.add(request.id, traceparent)

    def add(self, request_id: RequestId, traceparent: str) -> None:
        with self._lock:
            self._by_id.setdefault(_key(request_id), []).append(traceparent)

    def pop(self, request_id: RequestId) -> str | None:
        with self._lock:
            waiting = self._by_id.get(_key(request_id))
            if not waiting:
                return None
            trace = waiting.pop(0)
            if not waiting:
                del self._by_id[_key(request_id)]
            return trace
