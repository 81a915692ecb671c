"""The Python client: ``Pool`` and ``Session`` drive a ``pynox pool`` process over its JSON Lines pipes.

One reader thread reads every line the pool writes and completes the matching
future; each host-function call it finds there runs on a thread of its own, so
a slow function never stalls other jobs, the reader or another job's calls
(the pool lets each job have at most 8 calls waiting, so the threads are
bounded too). A call whose job has already ended is not started. Any number of
threads (and asyncio tasks, through ``arun``) may have runs in flight at once.

No run waits for ever: if the pool answers nothing within three times the
run's timeout plus a margin (the jobs queued ahead of it included), the run
raises :class:`PoolError`; and if the pool wrote no line at all meanwhile, it
is hung: it is killed, every request sent to it fails at once, and the next
call starts a new pool. ``stats`` and ``close`` take timeouts of their own.

A pool made before ``os.fork()`` is the parent's: in the child it forgets that
process (see ``Pool._after_fork_in_child``) and starts its own at first use.

The client keeps at most as many plain jobs in flight as the pool can accept
without blocking its intake (running plus queued: three per worker). A pool
whose intake blocked could not read the replies its jobs' host calls wait for.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import dataclasses
import itertools
import logging
import os
import queue
import subprocess
import sys
import threading
import time
import uuid
import weakref
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any, Literal, Self, Unpack

import msgspec

from ..defaults import DEFAULT_WORKERS
from ..errors import START_ERRORS, ConfigError, PoolError, RequestError
from ..grant_types import (
    RUN_GRANT_NAMES,
    SESSION_GRANT_NAMES,
    Grants,
    PathLike,
    RunGrants,
    SessionGrants,
    Units,
    check_grants,
)
from ..protocol import (
    MAX_LINE,
    Answer,
    CallEvent,
    DisplayEvent,
    Reply,
    ReplyBody,
    Request,
    SessionResult,
    StartErrorEvent,
    StatsEvent,
    StreamEvent,
    decode_answer,
    encode,
    first_line_decoder,
)
from ..units import format_duration, parse_duration
from . import files as _files
from . import forking as _forking
from . import saved as _saved
from .connect import Connection, connect_address
from .files import FileInfo
from .host_functions import HostErrors, HostLoop, answer_call, awaiting_on, step_functions
from .model_tool import make_tool
from .requests import build_request
from .result import Result
from .runner import PoolSession
from .saved import SavedSession
from .streaming import OutputCallback, OutputEvent, call, event_of, iterate, wait_with_events
from .transports import Transport, TransportFactory

__all__ = ["Pool", "PynoxPool", "Session", "pool_argv", "pool_command"]

HostFunction = Callable[..., Any]
_READY_TIMEOUT = 300.0  # preloading large libraries on a cold machine
_ANSWER_MARGIN = 30.0  # seconds past the timeouts below before a run gives up on the pool
# A plain run waits for at most three rounds of jobs: those queued ahead of it (the client keeps three per
# worker in flight), then its own. A session step waits behind at most eight steps of its session.
_ROUNDS = 3
_SESSION_ROUNDS = 9
_DEFAULT_TIMEOUT = 30.0  # the pool's own default (defaults.DEFAULTS), for a run that names none
_STDERR_LINES = 50
_pool_log = logging.getLogger("pynox.pool")


# The pool's own events (--log=json) at the level of what they say; its lines about jobs at DEBUG (they
# carry identifiers and outcomes, never output, but an error message may quote the job's data).
_EVENT_LEVELS = {"start_error": logging.ERROR, "template_error": logging.WARNING, "config_warning": logging.WARNING,
                 "stop": logging.WARNING}


def _log_json_line(line: str) -> None:
    """One ``--log=json`` line of the pool as one record: its message as the record's message, and the
    decoded fields as the record's ``pynox`` attribute, for a handler to format as it formats its own."""
    try:
        fields = msgspec.json.decode(line)
    except msgspec.DecodeError:
        fields = None
    if not isinstance(fields, dict):
        _pool_log.warning("%s", line)
        return
    event = fields.get("event")
    if event == "job":
        _pool_log.debug("job %s: exit %s%s", fields.get("id"), fields.get("exit"),
                        f" ({fields['error']})" if fields.get("error") else "", extra={"pynox": fields})
        return
    level = (logging.getLevelName(fields["level"]) if event == "log" and isinstance(fields.get("level"), str)
             else _EVENT_LEVELS.get(str(event), logging.INFO))
    _pool_log.log(level if isinstance(level, int) else logging.WARNING, "pynox pool: %s",
                  fields.get("message", event), extra={"pynox": fields})


def pool_command(binary: PathLike | None) -> list[str]:
    """``binary``, else ``$PYNOX_BIN``, else this interpreter's ``pynox`` module."""
    chosen = binary if binary is not None else os.environ.get("PYNOX_BIN")
    if chosen:
        return [os.fspath(chosen)]
    return [sys.executable, "-m", "pynox"]


def pool_argv(workers: int, *, preload: Sequence[str] = (), package_dirs: Sequence[PathLike] = (),
              config: str | None = None, binary: PathLike | None = None, log: str | None = None,
              max_sessions: int | None = None, session_idle: Units | None = None) -> list[str]:
    """The command line of a ``pynox pool`` with these options (``config`` an absolute path)."""
    command = [*pool_command(binary), "pool", f"--workers={workers}"]
    if preload:
        command.append("--preload=" + ",".join(preload))
    command += [f"--package-dir={os.path.abspath(os.fspath(d))}" for d in package_dirs]
    if config:
        command.append(f"--config={config}")
    if log:
        command.append(f"--log={log}")
    if max_sessions is not None:
        command.append(f"--max-sessions={max_sessions}")
    if session_idle is not None:
        command.append(f"--session-idle={session_idle}")
    return command


class _Process:
    """One running ``pynox pool`` and its reader thread."""

    def __init__(self, command: list[str], cwd: str, on_line: Callable[[Answer], None],
                 on_bad_line: Callable[[bytes, str], None], on_exit: Callable[[_Process], None]) -> None:
        try:
            self.popen = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, close_fds=True, cwd=cwd)
        except OSError as exc:
            raise PoolError(f"cannot start the pool with {command[0]!r} (binary= or $PYNOX_BIN): {exc}") from None
        self.stderr_tail: collections.deque[str] = collections.deque(maxlen=_STDERR_LINES)
        # The pool's first line, undecoded: its ready event, or why it could not start.
        self.ready: concurrent.futures.Future[bytes] = concurrent.futures.Future()
        self._on_line = on_line
        self._on_bad_line = on_bad_line
        self._on_exit = on_exit
        self._write_lock = threading.Lock()
        self.dead = False
        # When the pool last wrote a line (any line: a result, a call, stats): a pool that wrote none for a
        # run's whole patience, since that run was sent, is hung (see Pool._hung).
        self.last_heard = time.monotonic()
        self.hung: str | None = None  # why the client stopped it, when it did
        self._readers = [threading.Thread(target=self._read_stdout, name="pynox-client-reader", daemon=True),
                         threading.Thread(target=self._read_stderr, name="pynox-client-stderr", daemon=True)]
        for reader in self._readers:
            reader.start()

    def write(self, message: Request | Reply) -> None:
        self.write_line(encode(message))

    def write_line(self, line: bytes) -> None:
        stdin = self.popen.stdin
        assert stdin is not None
        with self._write_lock:
            try:
                stdin.write(line)
                stdin.flush()
            except (BrokenPipeError, ValueError, OSError) as exc:
                raise PoolError(f"the pool process is gone: {self.describe_exit()}") from exc

    def _read_stdout(self) -> None:
        stdout = self.popen.stdout
        assert stdout is not None
        try:
            for raw in stdout:
                self.last_heard = time.monotonic()
                if not self.ready.done():
                    self.ready.set_result(raw)
                    continue
                try:
                    message = decode_answer(raw)
                except (msgspec.DecodeError, msgspec.ValidationError, RecursionError) as exc:
                    self._on_bad_line(raw, str(exc))
                    continue
                self._on_line(message)
        finally:
            stdout.close()
            self.dead = True
            self.popen.wait()
            self._close_stdin()
            if not self.ready.done():
                self.ready.set_exception(PoolError(f"the pool process exited before it was ready: "
                                                   f"{self.describe_exit()}"))
            self._on_exit(self)

    def _read_stderr(self) -> None:
        stderr = self.popen.stderr
        assert stderr is not None
        with stderr:
            for raw in stderr:
                line = raw.decode("utf-8", "replace").rstrip("\n")
                self.stderr_tail.append(line)
                if line.startswith("{"):
                    _log_json_line(line)
                elif line:  # the pool names itself ("pynox pool: ..."), as the logger's name does
                    _pool_log.warning("%s", line)

    def stop_hung(self, why: str) -> None:
        """Kill a pool that answers nothing (SIGKILL also ends a stopped process); its reader then ends."""
        self.hung = why
        self.dead = True  # the next call starts a new pool without waiting for this one's end
        try:
            self.popen.kill()
        except OSError:
            pass  # already gone

    def forget_after_fork(self) -> None:
        """In a forked child: this pool is the parent's. Its pipes are pointed at /dev/null, so that nothing
        of the child (a buffered line, a close) ever reaches the parent's pool or reads its answers."""
        self.dead = True
        self.hung = "this pool belongs to the process that forked"
        devnull = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
        try:
            for stream in (self.popen.stdin, self.popen.stdout, self.popen.stderr):
                if stream is not None:
                    os.dup2(devnull, stream.fileno())
        finally:
            os.close(devnull)
        # Not this process's child: never waited for, signalled or warned about from here.
        self.popen.returncode = 0

    def describe_exit(self) -> str:
        if self.hung is not None:
            return self.hung
        status = self.popen.poll()
        tail = " | ".join(list(self.stderr_tail)[-5:])
        return f"exit status {status}" + (f"; it said: {tail}" if tail else "")

    def _close_stdin(self, timeout: float | None = None) -> None:
        stdin = self.popen.stdin
        # A writer blocked on a pool that stopped reading holds the lock: then the kill that follows ends it.
        if not self._write_lock.acquire(timeout=-1 if timeout is None else timeout):
            return
        try:
            if stdin is not None:
                stdin.close()
        except OSError:
            pass  # already broken: the process is gone
        finally:
            self._write_lock.release()

    def close(self, timeout: float) -> None:
        """EOF, then up to ``timeout`` seconds for the pool to drain and exit, then a kill."""
        deadline = time.monotonic() + timeout
        self._close_stdin(timeout)  # EOF: the pool drains what it accepted and exits
        try:
            self.popen.wait(timeout=max(deadline - time.monotonic(), 0))
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()
        for reader in self._readers:
            if reader is not threading.current_thread():
                reader.join(timeout=max(deadline - time.monotonic(), 0.5))


class _FairSlots:
    """A semaphore that serves waiters in the order they came: with many threads running jobs, none
    waits while later callers go first (``threading.Semaphore`` wakes whichever thread the OS picks)."""

    def __init__(self, count: int) -> None:
        self._free = count
        self._waiting: collections.deque[threading.Event] = collections.deque()
        self._lock = threading.Lock()

    def acquire(self, blocking: bool = True, timeout: float | None = None) -> bool:
        """A slot (True), or False when none came free within ``timeout`` seconds (None: wait for one)."""
        with self._lock:
            if self._free and not self._waiting:
                self._free -= 1
                return True
            if not blocking:
                return False
            turn = threading.Event()
            self._waiting.append(turn)
        if turn.wait(timeout):  # release() hands the slot over directly: nobody can take it meanwhile
            return True
        with self._lock:
            if turn.is_set():  # handed over just as the wait ended: it is ours
                return True
            self._waiting.remove(turn)
            return False

    def release(self) -> None:
        with self._lock:
            if self._waiting:
                self._waiting.popleft().set()
            else:
                self._free += 1

    def resize(self, count: int, was: int) -> None:
        """From ``was`` slots to ``count`` (a fleet that gained or lost nodes): waiters take the new ones."""
        with self._lock:
            self._free += count - was
            while self._free > 0 and self._waiting:
                self._free -= 1
                self._waiting.popleft().set()


# A pool process this client started, its connection to a listening pool (see connect.py), or another
# transport (transports.py).
_Transport = _Process | Connection | Transport


def _unencodable(message: Request) -> str:
    """Why ``message`` cannot be a protocol line: the field holding a lone surrogate, which UTF-8 JSON cannot carry."""
    for field in message.__struct_fields__:
        try:
            msgspec.json.encode(getattr(message, field))
        except UnicodeEncodeError as exc:
            text = exc.object if isinstance(exc.object, str) else ""
            return (f"{field}: {text[max(exc.start - 20, 0):exc.end + 20]!r} holds a lone surrogate, which a protocol "
                    "line (UTF-8 JSON) cannot carry; nothing was sent. Text read with errors='surrogateescape' (as "
                    "os.environ and os.listdir give bytes that are not UTF-8) must be decoded another way first")
    return "the request holds a lone surrogate, which a protocol line (UTF-8 JSON) cannot carry; nothing was sent"


class _Pending:
    __slots__ = ("functions", "future", "host_errors", "is_job", "loop", "on_event", "process", "sent")

    def __init__(self, process: _Transport, functions: Mapping[str, HostFunction] | None, is_job: bool,
                 host_errors: HostErrors, loop: asyncio.AbstractEventLoop | None) -> None:
        self.future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self.process = process  # the pool it was sent to: only that pool's end fails it
        self.sent = time.monotonic()
        self.functions = functions
        self.is_job = is_job
        self.host_errors = host_errors
        # Where an async host function of this run is awaited: the caller's loop (arun), else the client's.
        self.loop = loop
        # Where its output events go as they come (a run with on_output): called on the reader thread.
        self.on_event: Callable[[OutputEvent], None] | None = None


class Pool:
    """A ``pynox pool`` process: warm templates, one confined child per run.

    ``binary`` (or ``$PYNOX_BIN``) names the ``pynox`` executable; by default this interpreter runs it.
    If the pool process dies, runs in flight raise :class:`pynox.PoolError` and the next run starts a
    new pool. ``host_errors="full"`` sends the text of every exception a host function raises to the
    job; by default only :class:`pynox.HostError` messages are sent (see :mod:`pynox.client.host_functions`).
    """

    def __init__(self, workers: int = DEFAULT_WORKERS, *, preload: Sequence[str] = (),
                 package_dirs: Sequence[PathLike] = (), config: PathLike | None = None,
                 binary: PathLike | None = None, log: str | None = None,
                 max_sessions: int | None = None, session_idle: Units | None = None,
                 host_errors: HostErrors = "safe", connect: str | None = None,
                 transport: TransportFactory | None = None) -> None:
        if workers < 1:
            raise ConfigError(f"workers must be at least 1, got {workers}")
        _check_host_errors(host_errors)
        self.host_errors: HostErrors = host_errors
        self.workers = workers
        # Where relative grants resolve: the pool process runs here, a restarted one too, whatever
        # directory the caller moves to later (a tool's description resolves them here as well).
        self.cwd = os.getcwd()
        self.config_path = os.path.abspath(os.fspath(config)) if config is not None else None
        self._command = pool_argv(workers, preload=preload, package_dirs=package_dirs, config=self.config_path,
                                  binary=binary, log=log, max_sessions=max_sessions, session_idle=session_idle)
        # "unix:PATH": run on a listening pool (pynox pool --listen) instead of starting one; the pool's own
        # options (workers, preload, config) are the operator's, and the arguments for them are not used.
        self._connect = connect_address(connect) if connect is not None else None
        # Another transport (pynox-ray's): opened at the first call, which then says why it cannot start.
        self._transport = transport
        self._lock = threading.Lock()
        self._pending: dict[str, _Pending] = {}
        self._ids = itertools.count(1)
        self._prefix = uuid.uuid4().hex[:8]
        # Plain jobs in flight, at most what the pool takes without blocking its intake (see module doc).
        self._slots = _FairSlots(3 * workers)
        self._process: _Transport | None = None
        self._closed = False
        self._host_loop = HostLoop()
        self.ready: dict[str, Any] = {}
        _live_pools.add(self)
        if transport is None:
            self._ensure_process()

    # -- lifecycle ---------------------------------------------------------------------------------------
    def _ensure_process(self) -> _Transport:
        with self._lock:
            if self._closed:
                raise PoolError("this pool is closed")
            current = self._process
            if current is not None and not current.dead:
                return current
            process: _Transport
            if self._transport is not None:
                process = self._transport(self._dispatch, self._unreadable, self._process_exited)
            elif self._connect is not None:  # a listening pool's socket: this client's own connection
                process = Connection(self._connect, self._dispatch, self._unreadable, self._process_exited)
            else:
                process = _Process(self._command, self.cwd, self._dispatch, self._unreadable, self._process_exited)
            self._process = process
        try:
            first = process.ready.result(timeout=_READY_TIMEOUT)
        except concurrent.futures.TimeoutError:
            process.close(timeout=1)
            raise PoolError(f"the pool did not become ready within {_READY_TIMEOUT:.0f}s") from None
        try:
            event = first_line_decoder.decode(first)
        except msgspec.DecodeError:
            process.close(timeout=1)
            raise PoolError(f"the pool's first line was not its ready event: {first[:200]!r}") from None
        if isinstance(event, StartErrorEvent):
            process.close(timeout=5)
            raise START_ERRORS.get(event.error.type, PoolError)(event.error.message or "the pool could not start")
        # Checked against its type above; kept as the pool wrote it (a newer pool's extra fields included).
        self.ready = msgspec.json.decode(first)
        workers = self.ready.get("workers")
        if self._command_unused and isinstance(workers, int) and workers != self.workers:
            with self._lock:  # the pool's own size (a fleet's: every node's) decides how many runs to keep in it
                if not self._pending:
                    self.workers, self._slots = workers, _FairSlots(3 * workers)
        return process

    def _resize(self, workers: int) -> None:
        """The pool's size changed under it (a fleet's nodes joined or left): keep three runs per worker."""
        with self._lock:
            was, self.workers = self.workers, max(workers, 1)
            self._slots.resize(3 * self.workers, 3 * was)

    @property
    def _command_unused(self) -> bool:
        """Whether the pool is another's (a listening pool, a fleet): its own options decide its size."""
        return self._connect is not None or self._transport is not None

    def close(self, timeout: float = 60.0) -> None:
        """Let runs in flight finish (their host functions still answered), then stop the pool process.

        Safe to call twice. Returns within about ``timeout`` seconds: runs still unfinished then end with
        the pool, which is killed."""
        deadline = time.monotonic() + timeout
        with self._lock:
            self._closed = True
            in_flight = [pending.future for pending in self._pending.values()]
        # Closing stdin first would leave the pool unable to read the replies its jobs wait for.
        concurrent.futures.wait(in_flight, timeout=timeout)
        with self._lock:
            process, self._process = self._process, None
        if process is not None:
            process.close(timeout=max(deadline - time.monotonic(), 0))
        self._host_loop.close()

    def _after_fork_in_child(self) -> None:
        """In the child of a fork (a pre-fork server's worker): the pool process, its pipes and every run in
        flight are the parent's. The child forgets them all and starts a pool of its own at its first call;
        sharing the parent's pipe would hand each process the other's answers (request ids are per Pool)."""
        self._lock = threading.Lock()  # another thread may have held it at the fork: it does not exist here
        self._pending = {}
        self._slots = _FairSlots(3 * self.workers)
        self._prefix = uuid.uuid4().hex[:8]
        self._host_loop = HostLoop()
        process, self._process = self._process, None
        if process is not None:
            process.forget_after_fork()
            _forgotten_in_child.append(process)  # never collected: its streams then point at /dev/null

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _process_exited(self, process: _Transport) -> None:
        if process.hung is not None:
            error = PoolError(process.hung)
        else:
            error = PoolError(f"the pool process exited while this run was in flight ({process.describe_exit()})")
        self._fail_pending(process, error)

    def _fail_pending(self, process: _Transport, error: PoolError) -> None:
        """Answer every run sent to ``process`` with ``error`` (runs sent to a newer pool go on)."""
        with self._lock:
            stale = [(key, p) for key, p in self._pending.items() if p.process is process]
            for key, _ in stale:
                del self._pending[key]
        for _, pending in stale:
            if not pending.future.done():
                pending.future.set_exception(error)

    # -- requests ----------------------------------------------------------------------------------------
    def _submit(self, message: Request, functions: Mapping[str, HostFunction] | None = None,
                *, is_job: bool = False, host_errors: HostErrors | None = None,
                loop: asyncio.AbstractEventLoop | None = None,
                on_event: Callable[[OutputEvent], None] | None = None) -> concurrent.futures.Future[Any]:
        process = self._ensure_process()
        request_id = f"{self._prefix}-{next(self._ids)}"
        try:
            line = encode(msgspec.structs.replace(message, id=request_id))
        except UnicodeEncodeError:
            raise RequestError(_unencodable(message)) from None
        if len(line) - 1 > MAX_LINE:  # the pool would discard it unread: say why now, not at its patience
            raise RequestError(f"the request is {(len(line) - 1) / (1 << 20):.1f} MiB as a protocol line, over the "
                               "pool's 1 MiB line limit (code, args and env together); nothing was sent: pass "
                               "large inputs as files under allow_read")
        pending = _Pending(process, functions, is_job, host_errors or self.host_errors, loop)
        pending.on_event = on_event
        with self._lock:
            self._pending[request_id] = pending
        try:
            process.write_line(line)
        except PoolError as exc:
            with self._lock:
                self._pending.pop(request_id, None)
            pending.future.set_exception(exc)
        return pending.future

    def _dispatch(self, message: Answer) -> None:
        """On the reader thread: complete a future, or start a host function call."""
        if isinstance(message, CallEvent):
            self._host_call(message)
            return
        if isinstance(message, StreamEvent | DisplayEvent):
            self._output_event(message)
            return
        request_id = message.id
        if not isinstance(request_id, str):
            return  # a refusal without an id (a late host reply): nothing is waiting for it
        with self._lock:
            pending = self._pending.pop(request_id, None)
        if pending is not None and not pending.future.done():
            pending.future.set_result(message)

    def _output_event(self, message: StreamEvent | DisplayEvent) -> None:
        """On the reader thread: output as it happens, handed to its run (see streaming.py), before its result."""
        with self._lock:
            pending = self._pending.get(message.id) if isinstance(message.id, str) else None
        if pending is not None and pending.on_event is not None:
            pending.on_event(event_of(message))

    def _events_for(self, on_output: OutputCallback | None) -> tuple[Callable[[OutputEvent], None] | None,
                                                                    queue.SimpleQueue[Any] | None]:
        """For a blocking run with ``on_output``: the reader's sink and the queue the caller's thread reads."""
        if on_output is None:
            return None, None
        events: queue.SimpleQueue[Any] = queue.SimpleQueue()
        return events.put, events

    def _wait_output(self, future: concurrent.futures.Future[Any], message: Request,
                     events: queue.SimpleQueue[Any] | None, on_output: OutputCallback | None,
                     rounds: int = _ROUNDS) -> Any:
        """``_wait``, calling ``on_output`` with each event as it comes, on this thread."""
        if events is None or on_output is None:
            return self._wait(future, message, rounds)
        patience = self._patience(message, rounds)
        return wait_with_events(future, events, on_output, patience, lambda: self._abandon(future, patience))

    @staticmethod
    def _loop_sink(on_output: OutputCallback | None) -> Callable[[OutputEvent], None] | None:
        """For arun with ``on_output``: each event is handed to the caller's event loop, in order."""
        if on_output is None:
            return None
        loop = asyncio.get_running_loop()

        def sink(event: OutputEvent) -> None:
            loop.call_soon_threadsafe(call, on_output, event)

        return sink

    def _unreadable(self, raw: bytes, problem: str) -> None:
        """On the reader thread: a line that is none of the pool's messages (a pool of another version, a
        bug). The run it names, if any, fails now rather than waiting out its patience."""
        _pool_log.warning("pynox pool: a line the client cannot read (%s): %r", problem, raw[:200])
        try:
            request_id = msgspec.json.decode(raw).get("id")
        except (msgspec.DecodeError, AttributeError, RecursionError):
            return
        with self._lock:
            pending = self._pending.pop(request_id, None) if isinstance(request_id, str) else None
        if pending is not None and not pending.future.done():
            pending.future.set_exception(PoolError(f"the pool's answer to this run could not be read: {problem}"))

    def _host_call(self, event: CallEvent) -> None:
        threading.Thread(target=self._answer_call, args=(event,), name="pynox-host-call", daemon=True).start()

    def _answer_call(self, event: CallEvent) -> None:
        request_id = event.id
        with self._lock:
            pending = self._pending.get(request_id) if isinstance(request_id, str) else None
        if pending is None:
            return  # its job has ended (its result came first): the call must not start in the host
        function = pending.functions.get(event.function) if pending.functions else None
        answer = answer_call(event.function, function, event.args, event.kwargs, host_errors=pending.host_errors,
                             run_awaitable=awaiting_on(pending.loop or self._host_loop.get))
        reply = ReplyBody(call_id=event.call_id, **answer)
        process = self._process
        if process is not None:
            try:
                process.write(Reply(reply=reply))
            except PoolError:
                pass  # the pool died; the job's caller hears about it

    # -- public API --------------------------------------------------------------------------------------
    def run(self, code: str | None = None, *, functions: Mapping[str, HostFunction] | None = None,
            host_errors: HostErrors | None = None, return_value: bool = True,
            host_globals: Literal["call", "await"] | None = None, on_output: OutputCallback | None = None,
            queue_timeout: Units | None = None,
            **grants: Unpack[RunGrants]) -> Result:
        """Run code (or ``script=``) in a fresh confined process and wait for its :class:`Result`.

        ``on_output``: called on this thread with each chunk of output (:class:`~pynox.StreamText`) and each
        display output (:class:`~pynox.Output`) as the code makes them, before the result.

        ``grants``: name, args, allow_read, allow_write, allow_network, allow_hosts, env, timeout, memory, max_output,
        max_file_size, package_dirs, profile. ``return_value``: report repr() of a trailing expression's
        value (:attr:`Result.return_value`), as a notebook shows it. Raises :class:`pynox.RequestError` if
        the pool refused the request before running it, and :class:`pynox.PoolError` if the pool gave no
        answer in time; every failure of the code itself is in the result. ``host_globals="await"`` binds the
        host functions as coroutines in the code's globals (``"call"``: as plain functions). ``queue_timeout``:
        how long the run may wait for a worker, here for one of this client's slots and then in the pool; past
        it the run raises :class:`pynox.RequestError` ("the pool is saturated") and nothing ran.
        """
        check_grants(f"{type(self).__name__}.run()", grants, RUN_GRANT_NAMES)
        self._admit(grants, functions)
        message = build_request(code, functions=list(functions or ()), return_value=return_value,
                                host_globals=host_globals, stream=on_output is not None, **grants)
        sink, events = self._events_for(on_output)
        started = time.monotonic()
        limit = self._queue_limit(queue_timeout)
        if not self._slots.acquire(timeout=limit):
            raise RequestError(self._no_slot(time.monotonic() - started, limit))
        try:
            message = _with_queue_timeout(message, limit, started)
            future = self._submit(message, functions, is_job=True, host_errors=host_errors, on_event=sink)
            reply = self._wait_output(future, message, events, on_output)
        finally:
            self._slots.release()
        return _result(reply)

    def _queue_limit(self, queue_timeout: Units | None) -> float | None:
        """The run's own queue_timeout, else the pool's [pool] queue_timeout (its ready event says), else None."""
        if queue_timeout is None:
            said = self.ready.get("queue_timeout")
            return float(said) if isinstance(said, int | float) and said > 0 else None
        try:
            return parse_duration(queue_timeout, "queue_timeout")
        except ConfigError as exc:
            raise RequestError(str(exc)) from None

    def _no_slot(self, waited: float, limit: float | None) -> str:
        return (f"waited {format_duration(round(waited, 3))} for one of this Pool's {3 * self.workers} slots "
                f"(queue_timeout {format_duration(limit or 0)}); the pool is saturated: nothing was sent")

    def _patience(self, message: Request, rounds: int) -> float:
        """How long a run waits for its answer: ``rounds`` of its timeout (the jobs queued ahead of it,
        then its own), plus a margin."""
        timeout = message.timeout
        try:
            seconds = parse_duration(timeout) if timeout is not None else self._longest_timeout()
        except (ConfigError, ValueError):  # the pool refuses it with its own words
            seconds = _DEFAULT_TIMEOUT
        return rounds * seconds + _ANSWER_MARGIN

    def _longest_timeout(self) -> float:
        """The longest timeout a run that names none may get, as the pool's ready event says (the default, a
        profile's, the ceiling's); the default where the pool does not say (a stand-in, an older version)."""
        said = self.ready.get("longest_timeout")
        return float(said) if isinstance(said, int | float) and said > 0 else _DEFAULT_TIMEOUT

    def _wait(self, future: concurrent.futures.Future[Any], message: Request, rounds: int = _ROUNDS) -> Any:
        return self._wait_for(future, self._patience(message, rounds))

    def _wait_for(self, future: concurrent.futures.Future[Any], patience: float, *, hang: bool = True) -> Any:
        try:
            return future.result(timeout=patience)
        except concurrent.futures.TimeoutError:
            raise self._abandon(future, patience, hang=hang) from None

    def _abandon(self, future: concurrent.futures.Future[Any], patience: float, *, hang: bool = True) -> PoolError:
        """Forget a request the pool never answered; the error its caller raises. A pool that wrote nothing
        at all since the request was sent (no result, no call, no stats for anyone) is hung: it is killed,
        every request sent to it is answered with that error now, and the next call starts a new pool."""
        with self._lock:
            found = next(((key, p) for key, p in self._pending.items() if p.future is future), None)
            if found is not None:
                del self._pending[found[0]]
        if found is not None:
            process = found[1].process
            if hang and not process.dead and process.last_heard < found[1].sent:
                error = PoolError(f"the pool answered nothing for {patience:.0f}s while requests were pending; "
                                  "it was stopped, and the next call starts a new one")
                process.stop_hung(str(error))
                self._fail_pending(process, error)
                return error
        return PoolError(f"the pool gave no answer within {patience:.0f}s; the run was abandoned")

    async def _await(self, future: concurrent.futures.Future[Any], message: Request,
                     rounds: int = _ROUNDS) -> Any:
        patience = self._patience(message, rounds)
        try:
            return await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(future)), patience)
        except TimeoutError:
            raise self._abandon(future, patience) from None
        except asyncio.CancelledError:
            # The caller gave up on it (task.cancel(), asyncio.wait_for, asyncio.timeout): so does the pool,
            # which kills the job now rather than letting it run on (and write its files) unobserved.
            self._cancel(future)
            raise

    def _cancel(self, future: concurrent.futures.Future[Any]) -> None:
        with self._lock:
            request_id = next((key for key, pending in self._pending.items() if pending.future is future), None)
        process = self._process
        if request_id is None or process is None or process.dead:
            return  # answered meanwhile, or the pool is gone: nothing runs
        try:
            process.write(Request(id=f"{request_id}-cancel", cancel=request_id))
        except PoolError:
            pass  # the pool died: the job with it

    async def arun(self, code: str | None = None, *, functions: Mapping[str, HostFunction] | None = None,
                   host_errors: HostErrors | None = None, return_value: bool = True,
                   host_globals: Literal["call", "await"] | None = None, on_output: OutputCallback | None = None,
                   queue_timeout: Units | None = None, **grants: Unpack[RunGrants]) -> Result:
        """``run`` for asyncio: no thread is held while the job runs. ``on_output`` is called on this event
        loop with each event, in order, before the result."""
        check_grants(f"{type(self).__name__}.arun()", grants, RUN_GRANT_NAMES)
        self._admit(grants, functions)
        message = build_request(code, functions=list(functions or ()), return_value=return_value,
                                host_globals=host_globals, stream=on_output is not None, **grants)
        sink = self._loop_sink(on_output)
        started = time.monotonic()
        limit = self._queue_limit(queue_timeout)
        if not self._slots.acquire(blocking=False):
            waiting = asyncio.ensure_future(asyncio.to_thread(self._slots.acquire, True, limit))
            try:
                got = await asyncio.shield(waiting)
            except asyncio.CancelledError:
                # The thread still takes the slot once one is free: give it back then.
                waiting.add_done_callback(lambda done: self._slots.release() if done.result() else None)
                raise
            if not got:
                raise RequestError(self._no_slot(time.monotonic() - started, limit))
        try:
            message = _with_queue_timeout(message, limit, started)
            if self._process is None or self._process.dead:
                # Starting (or restarting) the pool waits for its templates: not on the event loop.
                await asyncio.to_thread(self._ensure_process)
            reply = await self._await(self._submit(message, functions, is_job=True, host_errors=host_errors,
                                                   loop=asyncio.get_running_loop(), on_event=sink), message)
        finally:
            self._slots.release()
        return _result(reply)

    def stream(self, code: str | None = None, *, functions: Mapping[str, HostFunction] | None = None,
               host_errors: HostErrors | None = None, return_value: bool = True,
               host_globals: Literal["call", "await"] | None = None,
               **grants: Unpack[RunGrants]) -> AsyncIterator[OutputEvent | Result]:
        """``async for event in pool.stream(code)``: each chunk of output and display output as it comes,
        then the :class:`Result`. Leaving the loop before the result cancels the run."""
        return iterate(lambda on_output: self.arun(code, functions=functions, host_errors=host_errors,
                                                   return_value=return_value, host_globals=host_globals,
                                                   on_output=on_output, **grants))

    def session(self, *, functions: Mapping[str, HostFunction] | None = None,
                host_errors: HostErrors | None = None, host_globals: Literal["call", "await"] | None = None,
                pip_install: bool = False, restore: SavedSession | bytes | None = None,
                **grants: Unpack[SessionGrants]) -> Session:
        """A stateful process: variables survive between ``run`` calls. Permissions are fixed here, and so is
        ``host_globals`` (see :meth:`run`). ``pip_install``: a step's ``%pip install NAME`` line asks the pool to
        install NAME for this session (under the same ceiling as ``packages``). ``restore``: a state
        :meth:`Session.save` returned (on a pool with the same ``session_key_file``), loaded into the session's
        process when it opens, under the grants given here."""
        check_grants(f"{type(self).__name__}.session()", grants, SESSION_GRANT_NAMES)
        self._admit(grants, functions)
        fixed: dict[str, Any] = {**grants, **({"host_globals": host_globals} if host_globals else {}),
                                 **({"pip_install": True} if pip_install else {})}
        return self._session_type(self, functions, fixed, host_errors=host_errors, restore=restore)

    def _admit(self, grants: Mapping[str, Any], functions: object) -> None:
        """What a run or session must be before anything is sent: its host functions callables by name. A
        pool over another transport adds its own rules (pynox-ray's network rule)."""
        if functions is not None and not (isinstance(functions, Mapping)
                                          and all(isinstance(name, str) and callable(function)
                                                  for name, function in functions.items())):
            raise RequestError(f"functions must map names to callables, e.g. functions={{'search': search}}; got "
                               f"{functions!r}")

    def stats(self, timeout: float = 30.0) -> dict[str, Any]:
        """The pool's counters and gauges (see the protocol's stats event), by name; its histograms as dicts.
        Raises :class:`pynox.PoolError` when the pool gives no answer within ``timeout`` seconds."""
        event = self._wait_for(self._submit(Request(stats=True)), timeout)
        if not isinstance(event, StatsEvent):
            raise PoolError(f"the pool answered a stats request with {type(event).__name__}")
        stats: dict[str, Any] = msgspec.to_builtins(event)
        return stats

    def tool(self, profile: str | None = None, *, session: bool = False,
             functions: Mapping[str, HostFunction] | None = None, host_errors: HostErrors | None = None,
             **grants: Unpack[Grants]) -> Callable[[str], str]:
        """A ``run_python(code: str) -> str`` function for a model; see :func:`pynox.tool`."""
        return make_tool(self, profile=profile, session=session, functions=functions, grants=grants,
                         host_errors=host_errors)


    @property
    def _session_type(self) -> type[Session]:
        return Session


# The name the specification's examples use (``PynoxPool(preload=["pandas"])``): the same class.
PynoxPool = Pool


def _check_host_errors(value: object) -> None:
    if value not in ("safe", "full"):
        raise ConfigError(f"host_errors must be 'safe' or 'full', got {value!r}")


def _with_queue_timeout(message: Request, limit: float | None, started: float) -> Request:
    """The request with what is left of its queue deadline after the wait for a slot (the pool counts the rest
    from the moment it reads the line)."""
    if limit is None:
        return message
    left = max(limit - (time.monotonic() - started), 0.001)
    return msgspec.structs.replace(message, queue_timeout=round(left, 3))


def _result(reply: Answer) -> Result:
    if not isinstance(reply, SessionResult):
        raise PoolError(f"the pool answered a run with {type(reply).__name__}")
    result = Result.from_wire(reply)
    if result.refused:
        raise RequestError(result.error["message"] if result.error else "the pool refused the request")
    return result


def _step(**fields: Any) -> dict[str, Any]:
    """A session step's own fields, those that were given."""
    return {key: value for key, value in fields.items() if value is not None and value is not False}


class Session(PoolSession):
    """One process whose ``__main__`` survives between runs. A timeout or crash ends it; the next
    ``run`` starts a fresh one with the same permissions.

    A session never comes back with other grants or limits than its first request's: each later step says
    ``"open": false``, so a pool that no longer holds it (closed after ``session_idle``, ended with a step,
    or the pool was restarted) refuses the step rather than open a session with its defaults; the step is
    then sent again, opening a new process under the same name with the session's own grants. A step that
    runs in a new process, however the old one ended, has ``session_reopened`` (and a line of its text)
    saying the state was lost, and why: the pool's reason when it gives one, else the client's.

    A cancelled ``arun`` (or :meth:`interrupt`) interrupts its step (``KeyboardInterrupt``): the session
    and its variables live on if the step ends within the pool's grace, and it is killed otherwise."""

    def __init__(self, pool: Pool, functions: Mapping[str, HostFunction] | None, grants: dict[str, Any], *,
                 host_errors: HostErrors | None = None, restore: SavedSession | bytes | None = None) -> None:
        if "script" in grants:
            raise RequestError("sessions take inline code, not script")
        if host_errors is not None:
            _check_host_errors(host_errors)
        self.pool = pool
        self.functions = dict(functions or {})
        self.host_errors = host_errors
        self.grants = grants
        self.steps = 0
        self._name = f"session-{uuid.uuid4().hex[:12]}"  # one name for its life: the pool says why it reopened
        self._open = False  # the pool holds a process for it, as far as this client knows
        self._opening = 0  # counts the requests that opened it: a step learns only about its own process
        self._ended: str | None = None  # why its last process ended, as this client saw it
        # Why an earlier process was gone, from a step that opened a new one the caller never saw (the empty step
        # a file request opens it with): the next run's result says it.
        self._unreported: str | None = None
        self._opened_on: _Transport | None = None  # the pool process the session's first request went to
        self._running: list[concurrent.futures.Future[Any]] = []  # its steps sent and not answered, in order
        self._lock = threading.Lock()
        # A saved state its first process opens with (see saved.py); a later process starts empty.
        if restore is not None and not isinstance(restore, SavedSession | bytes):
            raise TypeError(f"restore takes a SavedSession or bytes, got {type(restore).__name__}")
        self._restore = bytes(restore) if restore is not None else None

    @property
    def alive(self) -> bool:
        """Whether a process holds this session's state (false before the first run and after an end)."""
        return self._open

    def _message(self, code: str, step: dict[str, Any]) -> tuple[Request, int, str | None]:
        """The request; which opening of the session it belongs to; and, if it opens one after an end this
        client saw, why that process ended (None for a later step, or the session's very first)."""
        with self._lock:
            if not self._open:
                self._open, self._opening = True, self._opening + 1
                ended, self._ended = self._ended, None
                first = build_request(code, functions=list(self.functions), **{**self.grants, **step})
                return msgspec.structs.replace(first, session=self._name, open=True), -self._opening, ended
            later = build_request(code, **step)
            return msgspec.structs.replace(later, session=self._name, open=False), self._opening, None

    def _lost(self, reply: Answer, opening: int) -> str | None:
        """Why the pool holds no session for this later step it refused (it never ran), else None: then the
        step is sent again, opening a new process with the first request's grants."""
        if not (isinstance(reply, SessionResult) and reply.refused and reply.session_ended) or opening < 0:
            return None
        with self._lock:
            if self._opening == opening and self._open:
                self._open = False
            restarted = self._opened_on is not None and self._opened_on is not self.pool._process
        if restarted:
            return "the pool was restarted since the session was opened"
        return ("the pool no longer held it: it was closed after session_idle without a step, or ended with "
                "an earlier step")

    def _ended_with(self, reply: Answer, opening: int) -> None:
        """A step's answer: if it says the pool holds no process for this opening of the session any more,
        the next step opens a new one (and tells the model why)."""
        if not (isinstance(reply, SessionResult) and reply.session_ended):
            return
        with self._lock:
            if self._opening == abs(opening) and self._open:
                self._open = False
                if reply.refused and opening < 0:  # a refused first request: no process of it ever held any state
                    return
                if reply.refused:  # a later request (a file's, a save) to a process the pool no longer holds
                    restarted = self._opened_on is not None and self._opened_on is not self.pool._process
                    self._ended = ("the pool was restarted since the session was opened" if restarted else
                                   "the pool no longer held it")
                    return
                error = reply.error
                self._ended = (f"step {reply.step} ended it ({error.type})" if error is not None and reply.step
                               else f"step {reply.step} ended it" if reply.step else "it ended")

    def _after(self, reply: Answer, opening: int, reopened: str | None = None) -> Result:
        self._ended_with(reply, opening)
        try:
            result = _result(reply)
        except RequestError as exc:
            if reopened is None or opening >= 0:
                raise
            with self._lock:  # not opened: the run that does open it says so again
                self._ended = self._ended or reopened
            raise RequestError(f"{exc} [The session's earlier process was gone ({reopened}), and a new one could "
                               "not be opened: variables, imports and functions defined in earlier runs are "
                               "gone.]") from None
        with self._lock:
            self.steps += 1
            unreported, self._unreported = self._unreported, None
        reopened = result.session_reopened or reopened or unreported
        return dataclasses.replace(result, session_reopened=reopened) if reopened else result

    def _step_functions(self, functions: Mapping[str, HostFunction] | None) -> Mapping[str, HostFunction]:
        return step_functions(self.functions, functions)

    def run(self, code: str, *, name: str | None = None, args: Sequence[str] | None = None,
            timeout: Units | None = None, max_output: Units | None = None, return_value: bool = True,
            functions: Mapping[str, HostFunction] | None = None, on_output: OutputCallback | None = None) -> Result:
        """Run one step; ``on_output`` as for :meth:`Pool.run`."""
        step = _step(name=name, args=args, timeout=timeout, max_output=max_output, return_value=return_value,
                     stream=on_output is not None)
        callables = self._step_functions(functions)
        self._restored()
        message, opening, reopened = self._message(code, step)
        sink, events = self.pool._events_for(on_output)
        reply = self.pool._wait_output(self._submit(message, opening, callables, on_event=sink),
                                       self._limits(message), events, on_output, _SESSION_ROUNDS)
        lost = self._lost(reply, opening)
        if lost is not None:
            message, opening, _ = self._message(code, step)
            reply = self.pool._wait_output(self._submit(message, opening, callables, on_event=sink),
                                           self._limits(message), events, on_output, _SESSION_ROUNDS)
        return self._after(reply, opening, lost or reopened)

    def _submit(self, message: Request, opening: int, callables: Mapping[str, HostFunction],
                loop: asyncio.AbstractEventLoop | None = None,
                on_event: Callable[[OutputEvent], None] | None = None) -> concurrent.futures.Future[Any]:
        future = self.pool._submit(message, callables, host_errors=self.host_errors, loop=loop, on_event=on_event)
        with self._lock:
            if opening < 0:
                self._opened_on = self.pool._process
            self._running.append(future)
        future.add_done_callback(self._answered)
        return future

    def _answered(self, future: concurrent.futures.Future[Any]) -> None:
        with self._lock:
            if future in self._running:
                self._running.remove(future)

    def _limits(self, message: Request) -> Request:
        """What bounds a step's wait: its own timeout, else the session's grants."""
        timeout = message.timeout if message.timeout is not None else self.grants.get("timeout")
        return Request(timeout=timeout) if timeout is not None else Request(profile=self.grants.get("profile"))

    async def arun(self, code: str, *, name: str | None = None, args: Sequence[str] | None = None,
                   timeout: Units | None = None, max_output: Units | None = None,
                   return_value: bool = True, functions: Mapping[str, HostFunction] | None = None,
                   on_output: OutputCallback | None = None) -> Result:
        step = _step(name=name, args=args, timeout=timeout, max_output=max_output, return_value=return_value,
                     stream=on_output is not None)
        callables = self._step_functions(functions)
        if self._restore is not None:
            await asyncio.to_thread(self._restored)
        message, opening, reopened = self._message(code, step)
        sink = self.pool._loop_sink(on_output)
        reply = await self._asend(message, opening, callables, sink)
        lost = self._lost(reply, opening)
        if lost is not None:
            message, opening, _ = self._message(code, step)
            reply = await self._asend(message, opening, callables, sink)
        return self._after(reply, opening, lost or reopened)

    def stream(self, code: str, *, name: str | None = None, args: Sequence[str] | None = None,
               timeout: Units | None = None, max_output: Units | None = None, return_value: bool = True,
               functions: Mapping[str, HostFunction] | None = None) -> AsyncIterator[OutputEvent | Result]:
        """``async for event in session.stream(code)``: as :meth:`Pool.stream`, for one step."""
        return iterate(lambda on_output: self.arun(code, name=name, args=args, timeout=timeout,
                                                   max_output=max_output, return_value=return_value,
                                                   functions=functions, on_output=on_output))

    async def _asend(self, message: Request, opening: int, callables: Mapping[str, HostFunction],
                     on_event: Callable[[OutputEvent], None] | None = None) -> Answer:
        future = self._submit(message, opening, callables, asyncio.get_running_loop(), on_event)
        try:
            reply: Answer = await self.pool._await(future, self._limits(message), _SESSION_ROUNDS)
        except asyncio.CancelledError:
            # The pool was sent a cancel (Pool._await): the step is interrupted, and the session lives on if
            # it ends within the pool's grace. Its result, when it comes, says whether the process ended.
            future.add_done_callback(lambda done: self._ended_with(done.result(), opening)
                                     if not done.cancelled() and done.exception() is None else None)
            raise
        return reply

    def _restored(self) -> None:
        """Before the first step: open the process with the state given as ``restore``, once."""
        with self._lock:
            state, self._restore = self._restore, None
        if state is not None:
            _saved.restore(self, state)

    def save(self, *, timeout: Units | None = None) -> SavedSession:
        """The session's variables, serialized inside its process (cloudpickle) and signed by the pool: give
        them to ``Pool.session(restore=...)`` to start a session with them. A variable that cannot be pickled
        is left out and named in ``skipped``, with the reason. Waits behind a running step.

        Raises :class:`pynox.RequestError` if the session has no process, :class:`pynox.SessionStateError`
        if the state is over the pool's ``max_session_state`` or the save step failed."""
        return _saved.save(self, timeout)

    async def asave(self, *, timeout: Units | None = None) -> SavedSession:
        """:meth:`save`, off the event loop."""
        return await asyncio.to_thread(self.save, timeout=timeout)

    def fork(self, *, timeout: Units | None = None) -> Session:
        """A new session whose process is a copy-on-write copy of this one's, as it is now: the same variables
        (every object, picklable or not), grants and limits, counted by the pool as a session (``max_sessions``).
        Each then goes its own way: a step, an end or a close of one is not the other's. Waits behind a running
        step. Tree-search agents branch a state this way: ``branches = [session.fork() for _ in range(3)]``.

        Raises :class:`pynox.RequestError` if the session has no process or the pool refuses the fork (no room
        for one more session, a scratch directory, pip_install, threads left running),
        :class:`pynox.SessionStateError` if the fork itself failed."""
        return _forking.fork(self, timeout)

    async def afork(self, *, timeout: Units | None = None) -> Session:
        """:meth:`fork`, off the event loop."""
        return await asyncio.to_thread(self.fork, timeout=timeout)

    def interrupt(self) -> bool:
        """Interrupt the step running now (``KeyboardInterrupt`` in its code), from any thread, as a
        notebook's interrupt does; its ``run`` returns its result, with ``interrupted`` if the session
        lives on. False if no step of this session is waiting for its result."""
        with self._lock:
            running = self._running[0] if self._running else None
        if running is None:
            return False
        self.pool._cancel(running)
        return True

    def close(self, timeout: float = 30.0) -> None:
        """End the process, waiting at most ``timeout`` seconds for the pool to confirm. The session object
        stays usable: a later ``run`` starts a fresh one."""
        with self._lock:
            name, opened = self._name, self._open
            self._open, self._ended = False, None
        if opened:
            try:
                # Not a sign of a hung pool: a close is answered only after the session's running step.
                self.pool._wait_for(self.pool._submit(Request(session=name, close=True)), timeout, hang=False)
            except PoolError:
                pass  # the pool is gone (or hung, and now stopped), and the session with it

    async def aclose(self) -> None:
        """``close`` for asyncio callers: the event loop is not blocked while the pool answers."""
        await asyncio.to_thread(self.close)

    # -- files in and out of the scratch directory (a session made with scratch=True) ---------------------
    def upload(self, path: str, data: bytes, *, timeout: float = 60.0) -> FileInfo:
        """Put ``data`` at ``path`` (relative; missing directories are made) in the session's scratch
        directory, its code's working directory; returns the file as it now is. Waits behind a running step.
        Raises :class:`pynox.RequestError` if the pool refuses (a bad path, over a size cap)."""
        return _files.upload(self._file_sender(timeout), path, data)

    def download(self, path: str, *, timeout: float = 60.0) -> bytes:
        """The content of ``path`` in the session's scratch directory (a regular file; never a symlink)."""
        return _files.download(self._file_sender(timeout), path)

    def files(self, *, timeout: float = 60.0) -> list[FileInfo]:
        """Every regular file of the session's scratch directory: path, size, mtime and MIME type."""
        return _files.listing(self._file_sender(timeout))

    async def aupload(self, path: str, data: bytes, *, timeout: float = 60.0) -> FileInfo:
        """:meth:`upload`, off the event loop."""
        return await asyncio.to_thread(self.upload, path, data, timeout=timeout)

    async def adownload(self, path: str, *, timeout: float = 60.0) -> bytes:
        """:meth:`download`, off the event loop."""
        return await asyncio.to_thread(self.download, path, timeout=timeout)

    async def afiles(self, *, timeout: float = 60.0) -> list[FileInfo]:
        """:meth:`files`, off the event loop."""
        return await asyncio.to_thread(self.files, timeout=timeout)

    def _file_sender(self, timeout: float) -> Callable[[Request], Answer]:
        """Sends a file request under the session's name, opening the session first if it has no process
        (an empty step, with its grants). A session the pool no longer holds has lost its files with its
        process: the request raises RequestError, and the next run opens a new one."""
        if not self.grants.get("scratch"):
            raise RequestError("this session has no scratch directory: make it with pool.session(scratch=True)")

        def send(message: Request) -> Answer:
            if not self.alive:
                opened = self.run("pass", return_value=False)
                opened.raise_for_error()
                with self._lock:
                    self.steps -= 1  # the empty step that opened it is not one of the caller's
                    self._unreported = opened.session_reopened  # its note is the caller's next run's
            with self._lock:
                opening = self._opening
            reply: Answer = self.pool._wait_for(
                self.pool._submit(msgspec.structs.replace(message, session=self._name)), timeout, hang=False)
            self._ended_with(reply, opening)
            return reply

        return send

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# Every open Pool of this process, so that the child of a fork can make each forget its parent's pool.
_live_pools: weakref.WeakSet[Pool] = weakref.WeakSet()
_forgotten_in_child: list[_Transport] = []


def _after_fork_in_child() -> None:
    for pool in list(_live_pools):
        pool._after_fork_in_child()


os.register_at_fork(after_in_child=_after_fork_in_child)
