"""Host-function calls between a confined job and the client, relayed by the pool.

The job sends a call frame on its channel; the pool checks it (declared name,
size, count), gives it a pool-wide ``call_id``, writes a ``call`` event for the
client and remembers where the answer goes. The client's ``reply`` line comes
back through intake (decoded once, straight into its struct: ``protocol.parse_line``)
and its value is encoded once, into the answer's frame for the job's channel. Both
frames are typed (``wire/host_channel.py``). A call still pending
when its job (or session step) ends is dropped, and answered in the job with an
error (a session's background thread gets a ``HostError`` at the next step); a
reply to it is then a ``RequestError``. Once
intake has stopped (EOF or SIGTERM), no reply can arrive: pending and later
calls fail at once in the job rather than wait out its timeout.

The pool, not ``pynox_host``, enforces the limits: a job can write any frame
on its channel. Per job, at most :data:`MAX_IN_FLIGHT` calls and
:data:`MAX_IN_FLIGHT_BYTES` of their arguments wait for the host at once;
calls beyond are refused to the job and never reach the client. Anything an
honest ``pynox_host`` never sends (a frame that does not decode, nests too
deep, carries a value that is not plain JSON, or is too large) is a
:class:`ProtocolViolation`: the job is killed, never the worker.
"""

from __future__ import annotations

import collections
import itertools
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec

from ..protocol import CallEvent, ReplyBody, RequestId, encode
from ..wire.frames import HEADER, FrameBuffer
from ..wire.host_channel import MAX_IN_FLIGHT, MAX_PAYLOAD, PIP_FUNCTION, HostAnswer, HostCall, encode_frame
from ..wire.host_values import NotPlainJSON, check_plain_json

__all__ = ["MAX_CALLS", "MAX_IN_FLIGHT", "MAX_IN_FLIGHT_BYTES", "CallRegistry", "JobCalls", "Outbox",
           "ProtocolViolation"]

MAX_CALLS = 1000
MAX_IN_FLIGHT_BYTES = 2 * MAX_PAYLOAD  # their arguments, as sent
# A call frame is what pynox_host measures against MAX_PAYLOAD before sending, plus its tag (`"tag":N,`,
# N at most 20 digits): anything larger was forged, and must not reach the client.
_FRAME_LIMIT = MAX_PAYLOAD + 32
# A job that takes none of the answers waiting for it for this long, while it runs, is not reading.
_STALL = 5.0
_STALL_NS = int(_STALL * 1e9)
# Answers waiting for a job to read them. An honest job's reader takes each as it comes, so it never has
# more than its calls in flight outstanding (at most 1 MB each); beyond this, it is not reading and is killed.
_OUTBOX_LIMIT = (MAX_IN_FLIGHT + 1) * (MAX_PAYLOAD + 4096)


# What a call still waiting when its step ended is answered (a session's next step reads it).
_STEP_ENDED = ("the step that made this host call ended before the host answered it, and the call was dropped; "
               "a call made from a background thread must be answered within the step that made it")


class ProtocolViolation(Exception):
    """The job sent something no honest ``pynox_host`` would: it is killed and its result says why."""


_call_decoder = msgspec.json.Decoder(HostCall)


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
        # `%pip install` of a session opened with pip_install: (the session's directory, the line's words)
        # -> what to tell the job, or raises with why not; the pool's own, on a thread of its own per call.
        self.pip: Callable[[str, list[str]], str] | None = None
        # Sessions (by their pip directory) with an install running: one at a time per session, not per step.
        # An install goes on after the step that asked for it ends, so a flag of the step's let each later step
        # start one more: a thread of the pool's each, and past max_installs a wait for a slot that every other
        # session's and job's install queued behind.
        self._pip_busy: set[str] = set()

    def open(self, request_id: RequestId, functions: list[str], outbox: Outbox,
             pip_dir: str | None = None) -> JobCalls:
        return JobCalls(self, request_id, functions, outbox, pip_dir)

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
            waiting.job.answer(waiting.job.answered(call_id), reason)

    def fail(self, call_id: int, reason: str) -> bool:
        """Answer a pending call with an error of the pool's own (its reply could not be read)."""
        with self._lock:
            pending = self._pending.pop(call_id, None)
        if pending is None:
            return False
        pending.job.answer(pending.job.answered(call_id), reason)
        return True

    def answer(self, reply: ReplyBody) -> str | None:
        """The client's reply line (exactly one of its result and error set); an error message for the client
        if there is nothing to answer."""
        return self.reply(reply.call_id, None if reply.result is msgspec.UNSET else reply.result,
                          None if reply.error is msgspec.UNSET else reply.error)

    def reply(self, call_id: int, result: Any, error: str | None) -> str | None:
        """Deliver a client reply; returns an error message for the client if there is nothing to answer."""
        with self._lock:
            pending = self._pending.pop(call_id, None)
        if pending is None:
            return f"reply to call {call_id}: no such call is pending (unknown, already answered, or its job ended)"
        tag = pending.job.answered(call_id)
        key = "error" if error is not None else "result"
        try:  # the one encoding of the value: straight into the job's frame
            frame = encode_frame(HostAnswer(tag=tag, error=error) if error is not None else
                                 HostAnswer(tag=tag, result=result))
        except (TypeError, msgspec.EncodeError):  # pragma: no cover - a decoded JSON value always encodes
            pending.job.answer(tag, "the host's result is not JSON")
            return None
        # The limit is on the value itself, as it is on the job's arguments (1 MB each way): the frame less
        # its header and its `{"tag":N,"key":...}` around the value.
        size = len(frame) - HEADER.size - len(f'{{"tag":{tag},"{key}":}}')
        if size > MAX_PAYLOAD:
            pending.job.answer(tag, f"the host's {key} of {size} bytes exceeds the 1 MB limit")
        else:
            pending.job.send(frame)
        return None


class Outbox:
    """Answers on their way to the job at the other end of one channel, written without ever blocking.

    The outbox belongs to the channel, not to one job's calls: a session's steps share their channel,
    and two writers would interleave their frames. Nobody ever waits for it, and no thread is started
    for it: an answer is written at once, by whoever queued it (intake, for the client's replies),
    as far as the socket's buffer takes it without blocking, which for an honest job is all of it (it
    reads each answer as it comes). What the buffer does not take waits here, and the job's worker
    writes it as the channel becomes writable (:meth:`wants_to_write`, :meth:`flush`); :attr:`wakeup`
    becomes readable when answers start to wait, so that a worker asleep until the deadline looks again.
    A job that stops reading so blocks nobody: not intake (delivering every job's replies), nor its
    worker (whose loop enforces the deadline and answers forged calls). The worker judges it instead:
    answers that wait beyond :data:`_OUTBOX_LIMIT`, or that the job has not taken for :data:`_STALL`
    while it ran, condemn the job (:attr:`violation`). Every write is made under the lock and only
    while the outbox is open, so none can reach a descriptor number reused after :meth:`close`."""

    def __init__(self, channel: socket.socket) -> None:
        self.channel = channel
        channel.setblocking(True)  # the worker reads it only once it is readable; writes say MSG_DONTWAIT
        self.violation: str | None = None
        self._lock = threading.Lock()
        self._waiting: collections.deque[memoryview] = collections.deque()  # what the socket has not taken
        self._bytes = 0  # waiting, not yet taken by the job
        self._since: int | None = None  # monotonic ns: since when answers wait with no progress
        self._closed = False
        # Replies are queued by intake, while the worker may sleep until the deadline.
        self.wakeup = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)

    def put(self, frame: bytes | bytearray) -> None:
        """Send one answer frame, or as much of it as the socket takes now, and keep the rest; never blocks."""
        with self._lock:
            if self.violation is not None or self._closed:
                return
            if self._bytes + len(frame) > _OUTBOX_LIMIT:
                self._condemn("the job does not read the answers to its host calls")
                return
            was_waiting = bool(self._bytes)
            self._waiting.append(memoryview(frame))
            self._bytes += len(frame)
            self._write()
            if self._bytes and not was_waiting:
                self._since = time.monotonic_ns()
                os.eventfd_write(self.wakeup, 1)  # the worker now watches for the channel to take the rest

    def _write(self) -> None:
        """With the lock held: write what waits, in order, until the socket would block."""
        try:
            while self._waiting:
                view = self._waiting[0]
                sent = self.channel.send(view, socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL)
                self._bytes -= sent
                self._since = time.monotonic_ns()
                if sent < len(view):
                    self._waiting[0] = view[sent:]
                    return
                self._waiting.popleft()
        except BlockingIOError:
            return
        except OSError:  # shut down (the job ended, or was condemned) or the job is gone: its result says how
            self._waiting.clear()
            self._bytes = 0
        finally:
            if not self._bytes:
                self._since = None

    def wants_to_write(self) -> bool:
        """Whether answers wait for the channel to become writable (the worker then watches for it)."""
        with self._lock:
            return bool(self._bytes) and not self._closed

    def flush(self) -> None:
        """The worker saw the channel writable: write what waits, as far as it goes without blocking."""
        with self._lock:
            if not self._closed:
                self._write()

    def judge(self, now: int) -> str | None:
        """The worker's check while the job runs: condemn a job that has not taken its answers for
        :data:`_STALL`. Returns the violation, if any."""
        with self._lock:
            if self.violation is None and self._since is not None and now - self._since >= _STALL_NS:
                self._condemn(f"the job did not read the answers to its host calls for {_STALL:.0f}s")
            return self.violation

    def stall_deadline(self) -> int | None:
        """When (monotonic ns) the answers now waiting condemn the job if it takes none of them."""
        with self._lock:
            return None if self._since is None else self._since + _STALL_NS

    def resume(self) -> None:
        """The job was frozen (a session between steps) and runs again: its time to read starts now."""
        with self._lock:
            if self._since is not None:
                self._since = time.monotonic_ns()

    def _condemn(self, reason: str) -> None:
        """With the lock held: mark the job for killing, and wake its worker, which may be waiting for
        anything but this (the job's deadline): shutting the channel down makes it readable, at EOF."""
        if self.violation is None:
            self.violation = reason
        self._waiting.clear()
        self._bytes, self._since = 0, None
        self._shut_down()

    def _shut_down(self) -> None:
        if not self._closed:  # before close() the owner has not closed the channel: the descriptor is ours
            try:
                self.channel.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def woken(self) -> None:
        """The worker saw :attr:`wakeup`."""
        try:
            os.eventfd_read(self.wakeup)
        except BlockingIOError:
            pass

    def close(self) -> None:
        """The channel's job is over: what waits is dropped, and the channel is closed. Returns at once."""
        with self._lock:
            if self._closed:
                return
            self._shut_down()
            self._closed = True
            self._waiting.clear()
            self._bytes, self._since = 0, None
            os.close(self.wakeup)
            self.channel.close()


class JobCalls:
    """The pool's end of one job's (or one session step's) calls: read call frames, check them, emit
    events, answer through the channel's :class:`Outbox`."""

    def __init__(self, registry: CallRegistry, request_id: RequestId, functions: list[str], outbox: Outbox,
                 pip_dir: str | None = None) -> None:
        self.registry = registry
        self.pip_dir = pip_dir
        self.request_id = request_id
        self.functions = set(functions)
        self.outbox = outbox
        self.channel = outbox.channel
        self.calls = 0  # calls counted against MAX_CALLS
        self.sent = 0  # calls that reached the client (its call events)
        self.violation: str | None = None
        self._buffer = FrameBuffer(_FRAME_LIMIT)
        self._outstanding: dict[int, tuple[int, int]] = {}  # call id -> (bytes of its frame, the job's tag)
        self._lock = threading.Lock()
        self._closed = False

    def readable(self, chunk: bytes) -> None:
        """Handle bytes from the job. Raises :class:`ProtocolViolation` for garbage."""
        try:
            frames = self._buffer.feed(chunk)
        except ValueError as exc:
            raise ProtocolViolation(f"the job sent an oversized host-call frame: {exc}") from None
        for frame in frames:
            try:
                call = _call_decoder.decode(frame)
                check_plain_json(call.args, "args")
                check_plain_json(call.kwargs, "kwargs")
            except NotPlainJSON as exc:
                raise ProtocolViolation(f"the job sent a host call that is not plain JSON: {exc}") from None
            except msgspec.DecodeError as exc:
                raise ProtocolViolation(f"the job sent an invalid host-call frame: {exc}") from None
            except RecursionError:  # msgspec recurses per nesting level
                raise ProtocolViolation("the job sent a host-call frame nested too deeply") from None
            except Exception as exc:  # whatever else decoding a hostile frame raises, it is the job's fault
                raise ProtocolViolation(f"the job sent a host-call frame that could not be read: "
                                        f"{type(exc).__name__}: {exc}") from None
            self._call(call, len(frame))

    def _call(self, call: HostCall, size: int) -> None:
        if call.function == PIP_FUNCTION and self.pip_dir is not None and self.registry.pip is not None:
            self.calls += 1
            if self.calls > MAX_CALLS:
                self.answer(call.tag, f"this task reached its limit of {MAX_CALLS} host calls")
                return
            with self.registry._lock:
                busy = self.pip_dir in self.registry._pip_busy
                self.registry._pip_busy.add(self.pip_dir)
            if busy:  # one at a time per session: a session cannot pile up the pool's threads nor its installs
                self.answer(call.tag, "%pip install: another install of this session is still running (one "
                                      "started by an earlier step goes on after it); try again when it is over")
                return
            # Answered by the pool itself, never the client; off the thread that reads the job (and keeps
            # its deadline). The wait counts against the step's timeout, as any host call's does.
            try:
                threading.Thread(target=self._pip, args=(call,), name="pynox-pip", daemon=True).start()
            except RuntimeError:  # no thread to be had: the session's next install must not find this one running
                with self.registry._lock:
                    self.registry._pip_busy.discard(self.pip_dir)
                self.answer(call.tag, "%pip install: the pool could not start the install now; try again")
            return
        if call.function not in self.functions:
            # Forged: pynox_host only has declared names. The client never sees this call.
            self.answer(call.tag, f"no host function named {call.function!r} was declared for this task")
            return
        self.calls += 1
        if self.calls > MAX_CALLS:
            self.answer(call.tag, f"this task reached its limit of {MAX_CALLS} host calls")
            return
        with self._lock:
            waiting, waiting_bytes = len(self._outstanding), sum(size for size, _ in self._outstanding.values())
        if waiting >= MAX_IN_FLIGHT or waiting_bytes + size > MAX_IN_FLIGHT_BYTES:
            self.answer(call.tag, f"this task already has {waiting} host calls ({waiting_bytes} bytes) waiting "
                                  f"for the host; at most {MAX_IN_FLIGHT} calls and {MAX_IN_FLIGHT_BYTES} bytes "
                                  "may wait at once")
            return
        call_id = self.registry._register(self)
        if call_id is None:  # the pool no longer reads replies: waiting would only run into the timeout
            self.answer(call.tag, self.registry.closed or "the pool no longer reads replies")
            return
        with self._lock:
            self._outstanding[call_id] = (size, call.tag)
        self.registry._on_call()
        self.sent += 1
        self.registry._emit(encode(CallEvent(id=self.request_id, call_id=call_id, function=call.function,
                                             args=call.args, kwargs=call.kwargs)))

    def _pip(self, call: HostCall) -> None:
        assert self.pip_dir is not None and self.registry.pip is not None
        words = call.args[0].split() if len(call.args) == 1 and isinstance(call.args[0], str) else []
        try:
            self.send(encode_frame(HostAnswer(tag=call.tag, result=self.registry.pip(self.pip_dir, words))))
        except Exception as exc:  # its message is for the model: why not, and what to do
            self.answer(call.tag, str(exc))
        finally:
            with self.registry._lock:
                self.registry._pip_busy.discard(self.pip_dir)

    def answered(self, call_id: int) -> int:
        """The call is answered (or failed): its tag, for the answer."""
        with self._lock:
            _, tag = self._outstanding.pop(call_id, (0, 0))
        return tag

    def answer(self, tag: int, error: str) -> None:
        """Answer the call ``tag`` with an error of the pool's own."""
        self.send(encode_frame(HostAnswer(tag=tag, error=error)))

    def send(self, frame: bytearray) -> None:
        """Queue one answer frame for the job; never blocks. Once its job (or step) is over, its answers are
        dropped, as its pending calls are."""
        with self._lock:
            if self._closed:
                return
        self.outbox.put(frame)

    def close(self) -> None:
        """The job (or the session step) ended: calls it left unanswered are dropped, and each is answered
        with an error, so that a session's thread still waiting for one (a background thread's call) gets a
        HostError when the session's next step runs, rather than waiting for ever. Never waits: the channel
        and its outbox belong to whoever made them (the job's worker, or the session)."""
        with self._lock:
            outstanding, self._outstanding = self._outstanding, {}
        self.registry.drop(set(outstanding))
        for _, tag in outstanding.values():
            self.answer(tag, _STEP_ENDED)
        with self._lock:
            self._closed = True
