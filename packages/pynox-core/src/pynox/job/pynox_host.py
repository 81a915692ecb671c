"""``pynox_host`` inside a confined job: the declared host functions, and nothing else.

Each function sends one call frame (a :class:`~pynox.wire.host_channel.HostCall`,
encoded once) on the job's channel descriptor, tagged with a number of the job's
own, and blocks until the pool answers that tag with the host's result or error
(a :class:`~pynox.wire.host_channel.HostAnswer`, decoded once, straight into it).
Calls from several threads overlap: at most
:data:`MAX_IN_FLIGHT` wait for the host at once (a further caller waits its
turn here). One waiting caller at a time reads the channel and hands each
answer to its caller; when its own arrives, or its caller is interrupted (a
session step's ``KeyboardInterrupt``, even as the reading is handed to it), it
passes the reading on to a caller still waiting. A job that calls from one thread thus starts no thread
of its own for it (in a freshly forked job, starting one costs a millisecond).
A reader interrupted after it took part of an answer frame (see :meth:`_Channel._take`) leaves the stream
out of step, which nothing here can mend: the channel is then broken for good, and every call, waiting or
later, raises ``HostError`` at once instead of reading garbage or waiting for an answer that never comes.
``pynox_host.aio`` has the same functions as coroutines, so that
``await asyncio.gather(search("x"), search("y"))`` makes two overlapping calls.

The pool checks the name again (a forged frame naming an undeclared function
gets an error and never reaches the client), counts calls and enforces the
size limits; the checks here only give the model a clear error sooner.
"""

from __future__ import annotations

import _thread
import itertools
import socket
import sys
import types
from typing import Any

import msgspec

from ..wire.frames import HEADER, recv_exact
from ..wire.host_channel import MAX_ANSWER, MAX_IN_FLIGHT, MAX_PAYLOAD, HostAnswer, HostCall, encode_frame, tag_size
from ..wire.host_values import NotPlainJSON, check_plain_json

__all__ = ["install_host_module", "renew_in_copy", "warm_up"]

# Calls of warm_up: enough for CPython's specializing interpreter to have quickened the path (it does so
# after a few runs of a function) and for msgspec to have built its encoder's and decoder's plans.
_WARM_CALLS = 16


class HostError(Exception):
    """Raised in the job when a host function failed, or a call could not be made."""


# The model imports it from pynox_host: tracebacks should name it so, not this module.
HostError.__module__ = "pynox_host"


def install_host_module(functions: list[str], channel_fd: int) -> None:
    """Create ``pynox_host`` (and ``pynox_host.aio``) with one callable per declared name; importing anything
    else fails."""
    global _installed
    _installed = _channel_of(channel_fd)
    _install(functions, _installed)


def renew_in_copy() -> None:
    """In a session fork's copy, whose channel descriptor now holds a channel of its own (job/session_fork.py):
    its ``pynox_host`` starts afresh on it. What the original's channel was doing is not the copy's: a call in
    flight there is a thread's the copy does not have (the copy's calls would wait for it to read their answers,
    until the step's deadline), a lock may have been held by such a thread at the fork, and a channel the
    original broke (a reading cut short, the pool's end seen closed) is not the one the copy holds."""
    if _installed is not None:
        _installed.__init__(_installed.sock)  # type: ignore[misc]  # a new channel's state, on the copy's socket


def _channel_of(fd: int) -> _Channel:
    # Its kind said, not asked of the kernel (a socket of a descriptor alone costs the job two getsockopt).
    return _Channel(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM, 0, fd))


def _install(functions: list[str], channel: _Channel) -> None:
    module = types.ModuleType("pynox_host", "Functions of the host application, callable from this job.")
    aio = types.ModuleType("pynox_host.aio", "The host functions as coroutines: await them, or gather several.")
    module.HostError = aio.HostError = HostError  # type: ignore[attr-defined]
    for name in functions:
        setattr(module, name, _bind(channel.call, name))
        setattr(aio, name, _bind_async(channel.call, name))
    module.__all__ = [*functions, "HostError"]  # type: ignore[attr-defined]
    aio.__all__ = [*functions, "HostError"]  # type: ignore[attr-defined]
    if "aio" not in functions:  # a host function of that name keeps it; `from pynox_host.aio import` still works
        module.aio = aio  # type: ignore[attr-defined]
    module.__path__ = []  # a package, so that `pynox_host.aio` imports
    sys.modules["pynox_host"] = module
    sys.modules["pynox_host.aio"] = aio


# The channel waits on _thread's locks, not on threading's Event, Lock and BoundedSemaphore: this module is loaded
# in the template, and a template that imports threading gives every child, host calls or not, threading's
# after-fork hook to run (~110 copy-on-write faults a child, see docs/performance.md). A job that uses threads
# imports threading itself.


class _Wake:
    """An event with one waiter, on one of _thread's locks: held while not set; ``set`` releases it, ``wait``
    takes it, and so clears it."""

    __slots__ = ("_lock",)

    def __init__(self) -> None:
        self._lock = _thread.allocate_lock()
        self._lock.acquire()

    def set(self) -> None:
        try:
            self._lock.release()
        except RuntimeError:  # set already (released, and not taken since)
            pass

    def wait(self) -> None:
        self._lock.acquire()


class _Turns:
    """At most ``count`` callers inside at once; a further one waits until a caller leaving hands it its turn
    (a bounded semaphore, first come first served)."""

    __slots__ = ("_free", "_lock", "_queue")

    def __init__(self, count: int) -> None:
        self._lock = _thread.allocate_lock()
        self._free = count
        self._queue: list[_Wake] = []

    def __enter__(self) -> None:
        with self._lock:
            if self._free:
                self._free -= 1
                return
            wake = _Wake()
            self._queue.append(wake)
        try:
            wake.wait()
        except BaseException:  # interrupted while waiting (a session step's KeyboardInterrupt)
            with self._lock:
                handed = wake not in self._queue
                if not handed:
                    self._queue.remove(wake)
            if handed:  # its turn came as it was interrupted: the turn goes on to the next caller
                self.__exit__()
            raise

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            if self._queue:
                self._queue.pop(0).set()
            else:
                self._free += 1


class _Waiting:
    """One call waiting for its answer. ``finished``: answered, or the channel failed. ``wake``: set when it
    is finished, or when the reading passes to it."""

    __slots__ = ("answer", "finished", "wake")

    def __init__(self) -> None:
        self.wake = _Wake()
        self.answer: HostAnswer | None = None
        self.finished = False


class _Channel:
    """The job's end of its host channel: tagged calls out, answers matched back by tag."""

    def __init__(self, sock: socket.socket) -> None:
        # No call made, none waiting, nobody reading, nothing broken: renew_in_copy runs this again (not a method
        # of its own called from here: each call of a function the template holds writes its pages in a job).
        self.sock = sock
        self._send_lock = _thread.allocate_lock()
        self._lock = _thread.allocate_lock()
        self._turns = _Turns(MAX_IN_FLIGHT)
        self._tags = itertools.count(1)
        self._waiting: dict[int, _Waiting] = {}
        self._reader: _Waiting | None = None  # the waiting call whose caller reads the channel for everyone
        self._broken: str | None = None
        # Where the reader is in the stream, for an interrupt to tell whether it left the stream in step (_take):
        self._head = bytearray(HEADER.size)  # the next frame's header; its first byte _UNWRITTEN until taken
        self._head[0] = _UNWRITTEN
        self._partway = False  # bytes of a frame were taken, and its answer is not yet held
        self._answer: HostAnswer | None = None  # a frame taken whole, whose answer may not be delivered yet

    def call(self, function: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        tag = next(self._tags)  # drawn first, so that the frame is encoded once (a tag left unused is harmless)
        try:
            check_plain_json(args, "args")
            check_plain_json(kwargs, "kwargs")
            frame = encode_frame(HostCall(tag=tag, function=function, args=list(args), kwargs=kwargs))
        except (NotPlainJSON, TypeError, msgspec.EncodeError) as exc:
            raise HostError(f"{function}(): arguments must be plain JSON values: {exc}") from None
        size = len(frame) - HEADER.size - tag_size(tag)  # the arguments' object, as the limit measures it
        if size > MAX_PAYLOAD:
            raise HostError(f"{function}(): arguments of {size} bytes exceed the 1 MB limit; "
                            "pass less data or write it to a granted file")
        with self._turns:
            waiting = _Waiting()
            with self._lock:
                if self._broken is not None:
                    raise HostError(f"{function}(): the host channel failed: {self._broken}")
                self._waiting[tag] = waiting
            try:
                with self._send_lock:
                    self.sock.sendall(frame)
            except OSError as exc:
                with self._lock:
                    self._waiting.pop(tag, None)
                raise HostError(f"{function}(): the host channel failed: {exc}") from None
            try:
                self._await(waiting)
            except BaseException:  # a session step's KeyboardInterrupt: this call is given up, its answer dropped
                with self._lock:
                    self._waiting.pop(tag, None)
                    # It may have been reading, or been handed the reading as it was interrupted: either way the
                    # reading passes to a caller still waiting, or nobody would read their answers.
                    if self._reader is waiting:
                        self._reader = None
                    self._pass_reading()
                raise
        answer = waiting.answer
        if answer is None:
            raise HostError(f"{function}(): the host channel failed: {self._broken}")
        if answer.error is not msgspec.UNSET:
            raise HostError(answer.error)
        return None if answer.result is msgspec.UNSET else answer.result

    def _await(self, waiting: _Waiting) -> None:
        """Until ``waiting`` is finished: read the channel if nobody does, else wait to be woken."""
        while True:
            with self._lock:
                if waiting.finished:
                    return
                reads = self._reader is None
                if reads:
                    self._reader = waiting
            if not reads:
                waiting.wake.wait()
                continue
            try:
                while not waiting.finished:
                    self._read()
            except OSError as exc:
                self._break(str(exc) or type(exc).__name__)
            except BaseException as exc:  # a session step's KeyboardInterrupt, as the reader reads
                self._interrupted(exc)
                raise
            finally:
                with self._lock:
                    self._reader = None
                    self._pass_reading()
            return

    def _pass_reading(self) -> None:
        """With the lock held: if nobody reads, wake a caller still waiting (it finds nobody reading, and reads).
        A caller woken in vain waits again."""
        if self._reader is None:
            following = next(iter(self._waiting.values()), None)
            if following is not None:
                following.wake.set()

    def _read(self) -> None:
        """Read one answer frame and deliver it."""
        answer = self._take()
        self._deliver(answer)
        self._answer = None

    def _take(self) -> HostAnswer:
        """Read one answer frame, keeping track of where the reading is, so that an exception raised anywhere
        in it (a signal's handler runs between two bytecodes, even right after ``recv`` returned, whose bytes
        are then lost) can tell whether the stream is still in step (:meth:`_interrupted`).

        No byte of a frame taken: the header's first byte is still :data:`_UNWRITTEN` (a real header's is 0:
        an answer is under 16 MiB), and nothing is ``_partway``. An interrupt inside that first ``recv_into``
        takes nothing (the call fails with EINTR before the handler raises); one after it returned finds the
        byte written. From then until the answer is decoded, ``_partway``; from then until it is delivered,
        ``_answer``, which an interrupted reader delivers itself. No system call beyond the reading's."""
        head = self._head
        taken = self.sock.recv_into(head)
        self._partway = True
        try:
            if not taken:
                raise EOFError("the pool closed the channel")
            if taken < HEADER.size:
                head[taken:] = recv_exact(self.sock, HEADER.size - taken, closed="the pool closed the channel")
            (size,) = HEADER.unpack(head)
            head[0] = _UNWRITTEN  # for the next frame: _partway covers this one
            if size > MAX_ANSWER:
                raise OSError(f"answer of {size} bytes is too large")
            answer = _decoder.decode(recv_exact(self.sock, size, closed="the pool closed the channel"))
        except EOFError as exc:
            raise OSError(str(exc)) from None
        except (msgspec.DecodeError, RecursionError) as exc:  # ValidationError is a DecodeError
            raise OSError(f"malformed answer: {exc}") from None
        self._answer = answer
        self._partway = False
        return answer

    def _interrupted(self, exc: BaseException) -> None:
        """The reader was interrupted (:meth:`_take` says what its state means): deliver the answer it held,
        or, if it left part of a frame taken, break the channel."""
        answer, self._answer = self._answer, None
        if answer is not None:
            self._deliver(answer)  # again, if it was already: a delivered answer's tag is gone
        elif self._partway or self._head[0] != _UNWRITTEN:
            self._break(f"reading an answer was interrupted ({type(exc).__name__}) partway through it, so the "
                        "channel is out of step and cannot be used again by this job or session")

    def _break(self, reason: str) -> None:
        """The channel cannot be read any more: every call waiting, and every later one, fails with ``reason``.
        It is shut down too, so that the pool's answers still to come fail to be sent, rather than wait unread
        (the pool kills a job that leaves its answers unread)."""
        with self._lock:
            if self._broken is None:
                self._broken = reason
            failed, self._waiting = self._waiting, {}
            for other in failed.values():
                other.finished = True
                other.wake.set()
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:  # the pool's end closed already
            pass

    def _deliver(self, answer: HostAnswer) -> None:
        with self._lock:
            waiting = self._waiting.get(answer.tag)
            if waiting is not None:  # taken off only once it is answered: an interrupt may deliver it again
                waiting.answer = answer
                waiting.finished = True
                waiting.wake.set()
                del self._waiting[answer.tag]


def warm_up(calls: int = _WARM_CALLS) -> None:
    """Rehearse a job's host calls ``calls`` times (at most :data:`_WARM_CALLS`) over a socketpair of this
    process, as a job makes them: ``pynox_host`` installed, a function imported from it (``from pynox_host
    import ...``) and called, its answers written ahead of the calls (one thread, nothing blocks); then leave
    nothing behind: no module, no descriptor.

    In the template before any job exists (``job.child.prepare_template``), this makes a job's first call
    as warm as its later ones: what that call used to build for itself (msgspec's plans for the frames'
    types, the interpreter's specialized code) is built once, and every
    child inherits it. A child prepared ahead for a job with host functions rehearses again (an answer and
    an error), to take before its job arrives the copy-on-write faults of the whole path its job takes: the
    module's installation (24 faults and 0.1 ms of the job's setup, on the 2-vCPU VM of
    docs/performance.md, when only the calls were rehearsed), the import and the calls
    (``job.child._warm_up``)."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        _install(["warm_up"], _Channel(ours))  # made as socketpair made it: as _channel_of makes the job's
        namespace: dict[str, Any] = {}
        exec(_WARM_IMPORT, namespace)  # the job's own import statement: importlib's from-list path
        function = namespace["warm_up"]
        for tag, answer in enumerate(_WARM_ANSWERS[:calls], 1):
            theirs.sendall(answer)  # the pool's side of the path: not rehearsed here
            try:
                function(tag, "x", 0.5, None, [True], k={"n": tag})
            except HostError:
                pass
            theirs.recv(1024)  # the call's frame, a few dozen bytes (a buffer as large would be fresh pages)
    finally:
        for name in _MODULES:  # no job's: this runs before any job exists
            sys.modules.pop(name, None)
        ours.close()
        theirs.close()


_MODULES = ("pynox_host", "pynox_host.aio")
# The answers warm_up reads, encoded once, here: a child that rehearses takes no fault for the pool's side of
# the path. Odd tags a result, even ones an error (a _Channel numbers its calls from 1).
_WARM_ANSWERS = [bytes(encode_frame(HostAnswer(tag=tag, result=[tag, 0.5, "x", None, {"k": True}]) if tag % 2
                                    else HostAnswer(tag=tag, error="x"))) for tag in range(1, _WARM_CALLS + 1)]
_WARM_IMPORT = compile("from pynox_host import warm_up", "<pynox_host warm-up>", "exec")


def _bind(call: Any, name: str) -> Any:
    def host_function(*args: Any, **kwargs: Any) -> Any:
        return call(name, args, kwargs)

    host_function.__name__ = host_function.__qualname__ = name
    host_function.__doc__ = f"Call the host function {name!r}; it runs in the host application, not here."
    return host_function


def _bind_async(call: Any, name: str) -> Any:
    async def host_function(*args: Any, **kwargs: Any) -> Any:
        import asyncio

        return await asyncio.to_thread(call, name, args, kwargs)

    host_function.__name__ = host_function.__qualname__ = name
    host_function.__doc__ = f"Await the host function {name!r}; calls awaited together run at the same time."
    return host_function


_decoder = msgspec.json.Decoder(HostAnswer)
# The job's channel, once pynox_host is installed (renew_in_copy).
_installed: _Channel | None = None
# A header's first byte before the header is taken: never a real one's (big-endian, of a size under 16 MiB).
_UNWRITTEN = 0xFF
assert HEADER.format == "!I" and MAX_ANSWER < 1 << 24


