"""Host-function calls between a confined job and the client, relayed by the pool.

The job sends a call frame on its channel; the pool checks it (declared name,
size, count), gives it a pool-wide ``call_id``, writes a ``call`` event for the
client and remembers where the answer goes. The client's ``reply`` line comes
back through intake and is written to the job's channel. A call still pending
when its job ends is dropped; a reply to it is then a ``RequestError``. Once
intake has stopped (EOF or SIGTERM), no reply can arrive: pending and later
calls fail at once in the job rather than wait out its timeout.
"""

from __future__ import annotations

import itertools
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec

from ..protocol import CallEvent, RequestId, encode
from .channel import FrameBuffer, pack
from .host_module import MAX_PAYLOAD

__all__ = ["MAX_CALLS", "CallRegistry", "JobCalls", "ProtocolViolation"]

MAX_CALLS = 1000
# A call frame is exactly what pynox_host measures against MAX_PAYLOAD before sending: anything larger
# was forged, and must not reach the client.
_FRAME_LIMIT = MAX_PAYLOAD
_SEND_TIMEOUT = 5.0


class ProtocolViolation(Exception):
    """The job sent something no honest ``pynox_host`` would: it is killed and its result says why."""


class _CallFrame(msgspec.Struct, forbid_unknown_fields=True):
    function: str
    args: list[Any]
    kwargs: dict[str, Any]


_call_decoder = msgspec.json.Decoder(_CallFrame)


@dataclass
class _Pending:
    channel: socket.socket
    job: JobCalls


class CallRegistry:
    """Pool-wide: call ids, and which job's channel each pending call answers to."""

    def __init__(self, emit: Callable[[bytes], None], on_call: Callable[[], None]) -> None:
        self._emit = emit
        self._on_call = on_call
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._pending: dict[int, _Pending] = {}
        self.closed: str | None = None  # why no reply can come any more

    def open(self, request_id: RequestId, functions: list[str], channel: socket.socket) -> JobCalls:
        return JobCalls(self, request_id, functions, channel)

    def _register(self, job: JobCalls) -> int | None:
        with self._lock:
            if self.closed is not None:
                return None
            call_id = next(self._ids)
            self._pending[call_id] = _Pending(job.channel, job)
        return call_id

    def drop(self, call_ids: set[int]) -> None:
        with self._lock:
            for call_id in call_ids:
                self._pending.pop(call_id, None)

    def close(self, reason: str) -> None:
        """Intake has stopped, so no reply will ever be read: fail every pending call, and every later one."""
        with self._lock:
            self.closed = reason
            pending, self._pending = self._pending, {}
        for call_id, waiting in pending.items():
            waiting.job.answered(call_id)
            waiting.job.answer({"error": reason})

    def reply(self, call_id: int, result: Any, error: str | None) -> str | None:
        """Deliver a client reply; returns an error message for the client if there is nothing to answer."""
        with self._lock:
            pending = self._pending.pop(call_id, None)
        if pending is None:
            return f"reply to call {call_id}: no such call is pending (unknown, already answered, or its job ended)"
        pending.job.answered(call_id)
        key, value = ("error", error) if error is not None else ("result", result)
        try:
            encoded = msgspec.json.encode(value)
        except (TypeError, msgspec.EncodeError):  # pragma: no cover - a decoded JSON value always encodes
            pending.job.answer({"error": "the host's result is not JSON"})
            return None
        # The limit is on the value itself, as it is on the job's arguments (1 MB each way).
        if len(encoded) > MAX_PAYLOAD:
            pending.job.answer({"error": f"the host's {key} of {len(encoded)} bytes exceeds the 1 MB limit"})
        else:
            pending.job.send(b'{"' + key.encode() + b'":' + encoded + b"}")
        return None


class JobCalls:
    """The pool's end of one job's channel: read call frames, check them, emit events, answer."""

    def __init__(self, registry: CallRegistry, request_id: RequestId, functions: list[str],
                 channel: socket.socket) -> None:
        self.registry = registry
        self.request_id = request_id
        self.functions = set(functions)
        self.channel = channel
        self.calls = 0
        self.violation: str | None = None
        # A job that stops reading must not block the intake thread delivering its answer.
        channel.settimeout(_SEND_TIMEOUT)
        self._buffer = FrameBuffer(_FRAME_LIMIT)
        self._outstanding: set[int] = set()
        self._lock = threading.Lock()

    def readable(self, chunk: bytes) -> None:
        """Handle bytes from the job. Raises :class:`ProtocolViolation` for garbage."""
        try:
            frames = self._buffer.feed(chunk)
        except ValueError as exc:
            raise ProtocolViolation(f"the job sent an oversized host-call frame: {exc}") from None
        for frame in frames:
            try:
                call = _call_decoder.decode(frame)
            except msgspec.DecodeError as exc:
                raise ProtocolViolation(f"the job sent an invalid host-call frame: {exc}") from None
            self._call(call)

    def _call(self, call: _CallFrame) -> None:
        if call.function not in self.functions:
            # Forged: pynox_host only has declared names. The client never sees this call.
            self.answer({"error": f"no host function named {call.function!r} was declared for this task"})
            return
        self.calls += 1
        if self.calls > MAX_CALLS:
            self.answer({"error": f"this task reached its limit of {MAX_CALLS} host calls"})
            return
        call_id = self.registry._register(self)
        if call_id is None:  # the pool no longer reads replies: waiting would only run into the timeout
            self.answer({"error": self.registry.closed})
            return
        with self._lock:
            self._outstanding.add(call_id)
        self.registry._on_call()
        self.registry._emit(encode(CallEvent(id=self.request_id, call_id=call_id, function=call.function,
                                             args=call.args, kwargs=call.kwargs)))

    def answered(self, call_id: int) -> None:
        with self._lock:
            self._outstanding.discard(call_id)

    def answer(self, message: dict[str, Any]) -> None:
        self.send(msgspec.json.encode(message))

    def send(self, payload: bytes) -> None:
        try:
            self.channel.sendall(pack(payload))
        except OSError:
            pass  # the job ended meanwhile; its result says how

    def close(self) -> None:
        """The job ended: calls it left unanswered are dropped."""
        with self._lock:
            outstanding, self._outstanding = self._outstanding, set()
        self.registry.drop(outstanding)
