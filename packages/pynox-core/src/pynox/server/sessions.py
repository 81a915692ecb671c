"""Sessions: one confined process per name whose ``__main__`` survives between steps, like a notebook.

Each session owns a template and one long-lived child confined once with the
permissions of the session's first request. The template is started ahead
(:class:`_SpareTemplate`: once a pool has had a session, one fresh template
waits for the next), so a new session's first step forks from a warm
interpreter instead of waiting for one to start.
Steps queue behind each other on the session's own thread, so sessions and
plain jobs never wait for each other. A Python exception keeps the session;
a timeout, a crash or ``exit()`` ends it, and the next request under the same
name starts a fresh process with the permissions that request brings.
Between steps the process is stopped (see ``Template.collect``): a session runs
no code of its own, and a step's deadline covers everything the step started.
A cancel interrupts a running step first (:mod:`.interrupts`); the pool
remembers the names of the sessions it ended, and why (:mod:`.ended`), for the
step that reopens one.
"""

from __future__ import annotations

import array
import base64
import contextlib
import logging
import os
import queue
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec

from ..defaults import DEFAULTS
from ..errors import PoolWorkerError, PynoxError, RequestError, quoted
from ..grants import bounded, parse_request_duration, parse_request_size
from ..policy.cgroups import TenantGroup
from ..protocol import Closed, Request, RequestId, SessionResult, encode, session_refusal
from ..units import format_duration
from ..wire.exits import CANCELLED_EXIT, REFUSED_EXIT, WORKER_ERROR_EXIT
from ..wire.frames import Ended, pack
from ..wire.signals import INTERRUPT_SIGNAL
from ..wire.spec import ErrorInfo, JobSpec, StepSpec
from ..wire.state import FORK_CODE
from . import session_fork
from .ended import EndedSessions
from .flights import CLIENT_CANCELLED, Flight, Flights
from .fork_gate import ForkWindow
from .hostcalls import CallRegistry
from .interrupts import InterruptState, StepInterrupt
from .jobs import Resolver
from .lifecycle import ChildState
from .outcome import Gathering, Outcome, to_session_result
from .scratch import ScratchRoot, answer
from .session_life import SessionLife, SessionState
from .session_state import RESTORE_CODE, SAVE_CODE, StateKeeper
from .spare import SpareLife
from .streaming import Streamer
from .templates import CallSink, SessionChannels, Template
from .zygote import SessionTemplates

__all__ = ["MAX_PENDING_STEPS", "FileRequest", "Session", "SessionRegistry", "SessionRequests", "Step"]

_log = logging.getLogger(__name__)

MAX_PENDING_STEPS = 8
# Seconds the spare's thread may take, once the pool closes, to finish preparing a child in its template (two
# reads of the template's grace, 5 s each) and close it (a 2 s wait for its end before a kill).
_SPARE_LETS_GO = 15.0
_FORK_OUTPUT = 64 << 10  # a fork step writes nothing of its own: room for a warning its process prints
_COPY_WITHIN = 5.0  # seconds a fork's copy has to say its pid and stop, once the fork step is over


@dataclass
class Step:
    id: RequestId
    code: str
    name: str
    args: list[str]
    timeout: float
    max_output: int
    accepted_ns: int
    return_value: bool = False
    stream: bool = False  # output as it happens (see streaming.py)
    flight: Flight = field(default_factory=lambda: Flight(None))
    interrupt: StepInterrupt = field(default_factory=lambda: StepInterrupt(0.0))  # set as it is queued
    # The pool's own steps (a save, see session_state.py): their result made into the request's answer.
    answer: Callable[[SessionResult], SessionResult] | None = None
    # The cgroups of the tenant whose session this is, when it has a budget: its process runs beneath them.
    tenant: TenantGroup | None = None
    # A session fork's step (see session_fork.py): the copy's name, under which it is opened.
    fork: str | None = None


@dataclass
class _Forking:
    """A fork step on its way: the copy's session (registered, not started), its channels, the gate's window."""

    copy: Session
    channels: SessionChannels
    window: ForkWindow


class _NotRun(Exception):
    """A cancel came before the step was sent to the session's process: it never runs, the session goes on."""


@dataclass
class FileRequest:
    """Files in or out of the session's scratch directory: queued behind its steps, served between them."""

    request: Request


class _EndedWhileIdle(Exception):
    """The session's child ended between two steps."""


def _send_step(control: socket.socket, step: StepSpec, fds: list[int], deadline_ns: int) -> None:
    """A step's frame and descriptors, on the session's control socket, kept non-blocking: one ``sendmsg``,
    where a socket with a timeout asks ``poll`` first on each send. Only if its buffer is full (a child that
    stopped reading) does it wait, until the step's deadline (TimeoutError), never longer."""
    data = pack(msgspec.json.encode(step))
    ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
    try:
        sent = control.sendmsg([data], ancillary)
    except BlockingIOError:
        sent = -1  # nothing sent, the descriptors neither
    if sent == len(data):
        return
    control.settimeout(max((deadline_ns - time.monotonic_ns()) / 1e9, 1e-3))
    try:
        if sent < 0:
            sent = control.sendmsg([data], ancillary)
        if sent < len(data):
            control.sendall(data[sent:])  # the descriptors went with the first byte
    finally:
        control.setblocking(False)


def _how(ended: Ended) -> str:
    if os.WIFSIGNALED(ended.status):
        number = os.WTERMSIG(ended.status)
        try:
            return f"killed by {signal.Signals(number).name}"
        except ValueError:
            return f"killed by signal {number}"
    return f"exit status {os.waitstatus_to_exitcode(ended.status)}"


@dataclass
class _Close:
    id: RequestId | None  # None: closed by the pool (idle, shutdown), nobody to answer
    why: str | None = None  # closed by the pool: what the step that reopens the name is told


def _why_ended(result: SessionResult) -> str:
    """Why a step's result ended its session, as the step that reopens the name is told."""
    step = f"step {result.step}" if result.step is not None else "a step"
    error = result.error
    if error is None:
        return f"{step} exited with status {result.exit}"
    if error.type == "TimeoutError":
        return f"{step} timed out"
    if error.type == "CancelledError":
        return f"{step} was cancelled ({error.message})"
    return f"{step} ended its process ({error.type})"


class _SpareTemplate:
    """One template started ahead for the next new session, by a thread that lives as long as the pool (a
    template dies with the thread that started it). It has served nothing: each session still gets a template
    of its own. Started once the pool's first session asks for a template; if starting one fails, sessions
    start their own, as before, and say why.

    Once a session's first step has been answered, the spare also holds a child confined ahead with that
    step's confinement (``Template.prepare_session``: forked and confined as a job's prepared child is, waiting
    for its job), so the next session whose first request is confined the same way, with grants naming the same
    files, is handed it: its first step pays neither a fork nor a confinement. A session confined otherwise
    (another profile, a scratch directory of its own) has that child discarded and its own forked, as before.
    A spare taken is replaced once the taker's first step has been answered (:meth:`answered`), not while that
    step runs: on two cores, forking and confining the next one would take the time the step needs.

    Its states and their moves are spare.py's table (:class:`SpareLife`); this class does what they call for:
    starting, preparing, checking and closing templates."""

    def __init__(self, new_template: Callable[[], Template]) -> None:
        self._new_template = new_template
        self.life: SpareLife[Template] = SpareLife()
        self._thread: threading.Thread | None = None  # started by the first take

    def take(self) -> Template:
        """The waiting template, or (none ready yet) one started now on the caller's thread."""
        spare, first = self.life.take()
        if first:
            self._thread = threading.Thread(target=self._keep_one_ready, name="pynox-session-spare", daemon=True)
            self._thread.start()
        if spare is not None and (spare.broken or spare.process.poll() is not None):  # it died while it waited
            self.life.found_dead(spare)  # nothing is owed for it: the next one is started now
            spare.close()
            spare = None
        return spare if spare is not None else self._new_template()

    def answered(self, taken: Template | None, first: JobSpec | None = None) -> None:
        """A session's first step was answered (or the session ended before one was): the spare it took, if
        ``taken`` is one, is replaced now, and ``first`` (its first request as resolved, None if it cannot be
        shared: a scratch or pip directory of its own) is what the next one is prepared for (its bounds and
        grants: no payload)."""
        self.life.answered(taken, None if first is None else msgspec.structs.replace(
            first, payload=msgspec.structs.replace(first.payload, code=None, script=None, args=[], env={}, name="")))

    def close(self) -> None:
        """Close the template waiting; one the thread is starting or preparing a child in is the thread's to close
        (never both: see spare.py), and it is waited for, so that it is closed before the pool goes on."""
        spare = self.life.close()
        if spare is not None:
            spare.close()
        if self._thread is not None:
            self._thread.join(_SPARE_LETS_GO)
            if self._thread.is_alive():
                _log.warning("the template started ahead for the next session did not stop within %s; the pool "
                             "closes without it", format_duration(_SPARE_LETS_GO))

    def _keep_one_ready(self) -> None:
        try:
            self._start_spares()
        except Exception as exc:  # the session asking next starts its own and reports the problem
            _log.warning("could not start a template ahead for the next session (%s: %s); sessions start their "
                         "own", type(exc).__name__, exc)
            try:
                held = self.life.failed()
            except PynoxError:  # a bug of the table's own: logged, and the thread still waits for the pool's end
                _log.exception("the pool lost track of its spare template")
            else:
                if held is not None:  # the template it was preparing a child in: in no known state now
                    held.close()
        # This thread must outlive the templates it started, which sessions hold: it waits for the pool's end.
        self.life.wait_closed()

    def _start_spares(self) -> None:
        while (work := self.life.work()) is not None:
            template, wanted = work
            own = template is None  # started here: the table holds it only once it is ready
            if template is None:
                template = self._new_template()
            prepared = False
            if wanted is not None:
                try:
                    prepared = template.prepare_session(wanted)
                except PynoxError as exc:  # this template failed: the next one is started in its place
                    _log.warning("a template waiting for the next session failed (%s)", exc)
                    template.close()
                    self.life.lost(wanted)  # prepared again once another session's first step is answered
                    continue
                except BaseException:
                    if own:
                        template.close()
                    raise
            if not self.life.ready(template, wanted, prepared):  # the pool closed while it started
                template.close()
                return


class Session(threading.Thread):
    def __init__(self, name: str, spec: JobSpec, max_output: int, registry: SessionRegistry) -> None:
        super().__init__(name=f"pynox-session-{name}", daemon=True)
        self.session_name = name
        self.spec = spec
        self.max_output = max_output
        self.registry = registry
        self.items: queue.Queue[Step | _Close | FileRequest] = queue.Queue()
        self.pending = 0  # steps accepted and not yet answered
        self.steps = 0
        self.last_used = time.monotonic()
        self.life = SessionLife(name)  # its state and its intake (see session_life.py)
        self.reopened: str | None = None  # why the pool ended the session held under this name before
        self._template: Template | None = None
        self._channels: SessionChannels | None = None
        self._first: JobSpec | None = None  # its first step as sent (what the next session's child is prepared for)
        self._took: Template | None = None  # the template it took for its process
        self._forking: _Forking | None = None
        # The spec a step's result states (see _step_spec), with the session's spec, timeout and return_value it
        # was made for.
        self._kept_spec: tuple[JobSpec, float, bool, JobSpec] | None = None

    @property
    def closing(self) -> bool:
        return self.life.closing

    def process_ended(self) -> bool:
        """Whether this idle session's process has ended (the reaper asks, to free its slot)."""
        template = self._template
        return self.life.has_process and template is not None and template.has_word()

    # -- on the session's thread -------------------------------------------------------------------------
    def run(self) -> None:
        try:
            while True:
                item = self.items.get()
                if isinstance(item, _Close):
                    self.registry.forget(self, item.why)
                    self._stop_process()
                    self._remove_scratch()  # gone by the time the client reads it closed
                    self.life.closed()
                    if item.id is not None:
                        self.registry.emit(encode(Closed(id=item.id, session=self.session_name)))
                    return
                if isinstance(item, FileRequest):
                    self._serve_files(item)
                    continue
                if not item.flight.start(self._kill_step, item.interrupt.interrupt):
                    continue  # cancelled while it waited: answered then
                # Read after the flight started: a shutdown that escalates later kills it instead.
                stopped = self.registry.stopped()
                if stopped is not None:
                    self.life.ended()
                    self.registry.forget(self)
                    self._answer(item, self._refused(item, stopped))
                    return
                first = self.steps == 0
                ended = self._serve(item) if item.fork is None else self._serve_fork(item, item.fork)
                if first and self.steps == 1:  # answered: the spare it took is replaced now, off its path
                    self.registry.spare.answered(self._took, self._first if self._shareable() else None)
                if ended:
                    return  # later requests under this name start afresh; steps queued here are refused
        finally:
            self.registry.spare.answered(self._took)  # no first step answered: its spare is replaced all the same
            self._stop_process()
            self._drain_after_end()
            self._remove_scratch()
            if self.life.state is not SessionState.CLOSED:
                self.life.closed()

    def _shareable(self) -> bool:
        """Whether another session could be confined as this one is: not with a directory of its own."""
        return self.spec.scratch is None and self.spec.pip_dir is None

    def _remove_scratch(self) -> None:
        if self.registry.scratch is not None:
            self.registry.scratch.remove(self.spec.scratch)

    def _serve_files(self, item: FileRequest, ended: str | None = None) -> None:
        """On this thread, between steps: the process is stopped, so nothing of it races the pool's file work."""
        try:
            if ended is not None:
                raise RequestError(ended)
            scratch = self.registry.scratch
            directory = scratch.directory(self.spec.scratch) if scratch is not None else None
            self.registry.emit(encode(answer(directory, self.session_name, item.request)))
        except RequestError as exc:
            refused = SessionResult(id=item.request.id, exit=REFUSED_EXIT,
                                    error=ErrorInfo(type="RequestError", message=str(exc)), refused=True,
                                    session=self.session_name, step=None, session_ended=ended is not None)
            self.registry.finish(refused, session=self.session_name, step=None)
        except OSError as exc:  # the pool's own failure (the disk, say): the request is refused, the session goes on
            _log.warning("session %r: a file request failed: %s", self.session_name, exc)
            refused = SessionResult(id=item.request.id, exit=REFUSED_EXIT,
                                    error=ErrorInfo(type="RequestError", message=f"the pool could not do this: {exc}"),
                                    refused=True, session=self.session_name, step=None, session_ended=False)
            self.registry.finish(refused, session=self.session_name, step=None)
        finally:
            self.last_used = time.monotonic()
            with self.registry.lock:
                self.pending -= 1

    def _drain_after_end(self) -> None:
        while True:
            try:
                item = self.items.get_nowait()
            except queue.Empty:
                return
            if isinstance(item, FileRequest):
                self._serve_files(item, "the session ended before this request was served")
            elif isinstance(item, Step):
                stopped = self.registry.stopped()  # the pool's shutdown ended it, or the session itself did
                self._answer(item, self._refused(item, stopped or "the session ended before this step ran; send "
                                                                  "the step again to start a new session"))
            elif item.id is not None:
                self.registry.emit(encode(Closed(id=item.id, session=self.session_name)))

    def _serve_fork(self, step: Step, name: str) -> bool:
        """A fork step: refused (the session goes on) unless it can fork and the copy fits; else run as a step
        whose answer adopts the copy (see _forked). True if the session ended with it."""
        template = self._template
        pid = template.child.pid if template is not None and self.life.state is SessionState.IDLE else None
        problem = session_fork.refusal(self.spec, pid)
        try:
            if problem is not None:
                raise RequestError(problem)
            copy = self.registry.reserve(name, self.spec, self.max_output)
        except RequestError as exc:
            refused = SessionResult(id=step.id, exit=REFUSED_EXIT, error=ErrorInfo(type="RequestError",
                                                                                  message=str(exc)),
                                    refused=True, session=self.session_name, step=None, session_ended=False)
            self._answer(step, refused)
            return False
        assert template is not None and pid is not None
        self._forking = _Forking(copy, SessionChannels.create(self.spec.confinement.host_channel),
                                 ForkWindow(pid, step.timeout, parent=True))
        step.answer = self._forked
        try:
            with template.fork_lock():
                return self._serve(step)
        finally:
            forking, self._forking = self._forking, None
            if forking is not None:  # not answered (the pool failed first): the copy is given up
                self._give_up(forking, None)

    def _forked(self, result: SessionResult) -> SessionResult:
        """The fork step's answer: the copy adopted and its session opened, or an error saying why not."""
        forking, self._forking = self._forking, None
        assert forking is not None
        forking.window.close()
        # The window admits no fork whose child is the original's, so it has none; should one exist all the same
        # (the fork step's code is the job's to replace), it would be a process of the job's own making.
        session_fork.kill_children(forking.window.pid)
        template = self._template
        if result.error is not None or result.session_ended or template is None:
            self._give_up(forking, None)
            return result if result.error is not None else msgspec.structs.replace(
                result, error=ErrorInfo(type="PoolWorkerError", message="the session ended during its fork"))
        pid = None
        try:
            said = session_fork.await_copy(forking.channels.control, template.pid, _COPY_WITHIN)
            if said in template.served():
                # The fork step's code (the job's to replace) named the original or a copy of the family: a
                # session of its own, which the pool neither adopts again nor kills as a copy given up.
                raise ValueError(f"pid {said} is a session's process already, not a new copy")
            pid = said
            session_fork.check_filters(pid, forking.window.pid)
            shared = session_fork.shared_memory(pid)  # mapped by the fork step's code (the job's to replace)
            if shared is not None:
                raise ValueError(shared.removeprefix("fork: "))
            adopted = Template.adopt(template, pid, template.steward_for_copy(), self.spec.confinement.memory)
        except (ValueError, PynoxError) as exc:
            self._give_up(forking, pid)
            return msgspec.structs.replace(result, error=ErrorInfo(type="PoolWorkerError",
                                                                   message=f"the session's fork failed: {exc}"))
        copy = forking.copy
        copy._template, copy._channels, copy.steps = adopted, forking.channels, self.steps
        copy.life.running()
        copy.life.step_done()
        copy.start()
        return msgspec.structs.replace(result, forked=copy.session_name)

    def _give_up(self, forking: _Forking, pid: int | None) -> None:
        """The copy is not opened: its process (if it said its pid) killed, its name released."""
        forking.window.close()
        if pid is not None:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)  # checked a stopped child of the template: only it can reap it
            if self._template is not None:
                self._template.let_go(pid)
        elif self._template is not None:
            # The copy, if any, never said who it is: every child of the template no handle serves goes (a copy
            # another session of the family is forking at this very moment among them: that fork then fails).
            self._template.sweep_strays()
        forking.channels.close()
        copy = forking.copy
        self.registry.forget(copy)
        copy.items.put(_Close(None))
        copy.start()  # answers whatever was queued on it meanwhile, and closes

    def _serve(self, step: Step) -> bool:
        """Run one step; True if the session ended with it."""
        self.steps += 1
        queue_us = (time.monotonic_ns() - step.accepted_ns) // 1000
        try:
            try:
                gathered = self._run_step(step)
            finally:
                step.interrupt.over()  # no interrupt of this step reaches the process from now on
        except _NotRun:
            self.steps -= 1
            self._answer(step, self._not_run(step))
            return False
        except _EndedWhileIdle as exc:  # nothing of this step ran: it must not be blamed for the end
            self.life.ended()
            self.registry.forget(self, f"its process ended while it waited for a step ({exc})")
            self._answer(step, self._failure(step, f"the session's process ended while it waited for this step "
                                                   f"({exc}); this step did not run: send it again to start a "
                                                   "new session", queue_us))
            return True
        except RequestError as exc:  # a grant changed between the first request and its start: nothing ran
            self.life.ended()
            self.registry.forget(self)
            self._answer(step, self._refused(step, str(exc)))
            return True
        except PynoxError as exc:
            self.life.ended()
            self.registry.forget(self, f"the pool failed while serving step {self.steps}")
            self._answer(step, self._failure(step, str(exc), queue_us))
            return True
        except Exception as exc:  # whatever goes wrong costs this session, never the pool a thread
            _log.exception("session %r failed while serving step %r", self.session_name, step.id)
            self.life.ended()
            self.registry.forget(self, f"the pool failed while serving step {self.steps}")
            self._answer(step, self._failure(step, f"the pool failed while serving this step "
                                                   f"({type(exc).__name__}); the session was stopped", queue_us))
            return True
        if step.flight.cancelled:  # its process was killed (the pool's shutdown): the session ends with it
            gathered.cancelled, gathered.ended = step.flight.cancelled, True
        elif step.interrupt.killed and not gathered.timed_out:  # its interrupt's grace passed: killed
            gathered.cancelled = CLIENT_CANCELLED if step.interrupt.before_its_process else (
                f"{CLIENT_CANCELLED}; it did not end within {format_duration(self.registry.interrupt_grace)} of "
                "its KeyboardInterrupt")
            gathered.ended = True
        elif step.interrupt.was_interrupted and gathered.signal == INTERRUPT_SIGNAL and not gathered.timed_out:
            # Its code gave the interrupt signal its default action back (a real-time signal's ends the process):
            # the cancel's own signal ended it. The client's cancel, as a kill past the grace is; never a crash.
            gathered.cancelled = f"{CLIENT_CANCELLED}; its interrupt signal ended the process (its code had " \
                                 "taken away the handler that makes it a KeyboardInterrupt)"
            gathered.ended = True
        outcome = gathered.freeze(self.spec, step.timeout)
        if (budget_killed := gathered.budget_killed) is not None:  # killed at its tenant's budget, as told
            self.registry.budget_kill(budget_killed)
        ended = outcome.ended or outcome.timed_out
        result = to_session_result(step.id, outcome, self._step_spec(step), max_output=step.max_output,
                           python=self._ready_python(), preloaded=self._preloaded(),
                           landlock_abi=self._abi(), mode="session", queue_us=queue_us,
                           session=self.session_name, step=self.steps, session_ended=ended)
        if step.interrupt.was_interrupted and not ended:
            result = msgspec.structs.replace(result, interrupted=True)
        if self.steps == 1 and self.reopened is not None:
            result = msgspec.structs.replace(result, session_reopened=self.reopened)
        if ended:
            self.life.ended()
            # Forgotten before the result leaves: a client that answers it at once starts a new session.
            self.registry.forget(self, _why_ended(result))
            self._remove_scratch()  # its files went with its process
        else:
            self.life.step_done()
        self._answer(step, result)
        return ended

    def _run_step(self, step: Step) -> Gathering:
        calls: CallSink | None = None
        if self.spec.payload.functions:
            calls = lambda outbox: self.registry.calls.open(step.id, self.spec.payload.functions, outbox,  # noqa: E731
                                                            pip_dir=self.spec.pip_dir)
        if self.life.state is SessionState.OPENING:
            # The packages its first request names, installed on this session's thread (RequestError if not).
            self.spec = self.registry.place(self.spec)
            if self._template is None:
                self._template = self._took = self.registry.spare.take()
            if not step.interrupt.sent(self._template.child):
                raise _NotRun  # the session stays as it was: opening, its process not started
            self._channels = SessionChannels.create(bool(self.spec.payload.functions))
            first = msgspec.structs.replace(
                self.spec, confinement=msgspec.structs.replace(self.spec.confinement, timeout=step.timeout),
                payload=msgspec.structs.replace(self.spec.payload, code=step.code, name=step.name, args=step.args,
                                                return_value=step.return_value, images=step.max_output,
                                                stream=step.stream))
            self._first = first
            if step.flight.cancelled:  # cancelled while its process started: it never runs
                return Gathering(ended=True)
            self.life.running()
            try:
                return self._template.run(first, max_output=step.max_output, calls=calls, session=self._channels,
                                          streamer=self._streamer(step), tenant=step.tenant)
            except PoolWorkerError as exc:
                # Nothing of the step began (the child prepared for it died before it claimed the step; not for
                # a deadline, a cancel, a broken protocol or its memory): sent once more, as a job is (serve.py),
                # to a child its template forks for it, with channels of its own (the dead child had the first).
                if exc.started or self._template.broken:
                    raise
            child = self._template.child
            if child.state is ChildState.IDLE:
                child.take()  # from here a cancel is kept by the child's life (see lifecycle.py)
            if step.flight.cancelled or step.interrupt.state is not InterruptState.SENT:  # cancelled meanwhile
                child.drop()
                return Gathering(ended=True)
            self._channels.close()
            self._channels = SessionChannels.create(bool(self.spec.payload.functions))
            return self._template.run(first, max_output=step.max_output, calls=calls, session=self._channels,
                                      streamer=self._streamer(step), tenant=step.tenant)
        template, channels = self._template, self._channels
        assert template is not None and channels is not None
        ended = template.ended_while_idle()
        if ended is not None:
            # A cancel between this step's start and here killed the idle process itself: the step is
            # answered as cancelled (by _serve), not as a process that ended on its own while it waited.
            if step.flight.cancelled:
                return Gathering(ended=True)
            raise _EndedWhileIdle(_how(ended))
        if not step.interrupt.sent(template.child):
            raise _NotRun
        # A step brings no descriptors (its outputs are the session's), unless an earlier step's code closed every
        # copy of one of them: then three new ones. A fork step brings the copy's channels and pipes too.
        renewed = channels.make_outputs() if channels.stream.broken or channels.outputs is None else []
        outputs = channels.outputs
        assert outputs is not None
        # The step's report must bear its number (see capture.py): one the code wrote itself is not taken.
        channels.stream.serial = self.steps
        # The step's time starts before it is sent: a child that stops reading its control channel (a
        # full socket buffer) costs the step its deadline, never the pool a thread.
        start = time.monotonic_ns()
        self.life.running()
        forking = self._forking
        if forking is not None:  # the steward lets this step's double fork through (see fork_gate.py)
            template.arm_fork(forking.window)
        # Frozen since its last step's result: what it runs from now on (a thread an earlier step left
        # behind included) runs under this step's deadline.
        template.continue_child()
        if channels.control.gettimeout() != 0.0:  # once for the session (see _send_step)
            channels.control.setblocking(False)
        copy_outputs = forking.channels.make_outputs() if forking is not None else []
        try:
            _send_step(channels.control, StepSpec(code=step.code, name=step.name, args=step.args,
                                                  return_value=step.return_value, images=step.max_output,
                                                  stream=step.stream, fork=forking is not None, serial=self.steps,
                                                  outputs=bool(renewed)),
                       renewed + (self._fork_ends(forking) + copy_outputs if forking is not None else []),
                       start + int(step.timeout * 1e9))
        except TimeoutError:
            template.kill_child()  # collect() then finds the deadline passed and reports the timeout
        except OSError:
            pass  # the child is gone; the template's Ended frame says how, the pipes' ends end the step
        finally:
            for fd in renewed:
                os.close(fd)
            if forking is not None:  # the copy has them, or no copy will be made
                for fd in copy_outputs:
                    os.close(fd)
                forking.channels.job_control.close()
                if forking.channels.job_channel is not None:
                    forking.channels.job_channel.close()
        return template.collect(outputs, self.spec, step.timeout, step.max_output, start,
                                calls=calls, outbox=channels.outbox, session=True, return_value=step.return_value,
                                streamer=self._streamer(step), stream=channels.stream)

    @staticmethod
    def _fork_ends(forking: _Forking) -> list[int]:
        """The copy's ends of its own channels, as the fork step's frame brings them (job/execute.py)."""
        channel = forking.channels.job_channel
        return [forking.channels.job_control.fileno(), *([channel.fileno()] if channel is not None else [])]

    def _streamer(self, step: Step) -> Streamer | None:
        return Streamer(step.id, self.session_name, self.registry.emit) if step.stream else None

    def _stop_process(self) -> None:
        if self._channels is not None:
            self._channels.close()  # EOF on control: the child exits
            self._channels = None
        if self._template is not None:
            self._template.close()
            self._template = None

    def _kill_step(self) -> bool:
        """Kill the process running this session's step (a cancel, from the intake thread)."""
        template = self._template
        if template is None or self.life.state is SessionState.OPENING:
            return True  # the process is still starting: _run_step stops the step before it runs
        return template.child.cancel()

    def answer_cancelled(self, step: Step) -> None:
        """A step cancelled while it waited: it never runs, and the session goes on."""
        outcome = Outcome(exit=CANCELLED_EXIT, error=ErrorInfo(type="CancelledError",
                                                               message="the client cancelled the step before it ran"))
        result = to_session_result(step.id, outcome, self._step_spec(step), max_output=step.max_output,
                                   python=self._ready_python(), preloaded=self._preloaded(),
                                   landlock_abi=self._abi(), mode="session", queue_us=0,
                                   session=self.session_name, step=None, session_ended=False)
        self._deliver(step, result)

    def _answer(self, step: Step, result: SessionResult) -> None:
        if step.answer is not None:
            result = step.answer(result)
        if step.flight.answer():  # not already answered by a cancel
            self._deliver(step, result)

    def _deliver(self, step: Step, result: SessionResult) -> None:
        self.last_used = time.monotonic()
        self.registry.finish(result, session=self.session_name, step=result.step)
        self.registry.flights.remove(step.flight)
        with self.registry.lock:
            self.pending -= 1

    def _failure(self, step: Step, message: str, queue_us: int = 0) -> SessionResult:
        outcome = Outcome(exit=WORKER_ERROR_EXIT, error=ErrorInfo(type="PoolWorkerError", message=message))
        return to_session_result(step.id, outcome, self._step_spec(step), max_output=step.max_output,
                                 python=self._ready_python(), preloaded=self._preloaded(),
                                 landlock_abi=self._abi(), mode="session", queue_us=queue_us,
                                 session=self.session_name, step=self.steps, session_ended=True)

    def _not_run(self, step: Step) -> SessionResult:
        outcome = Outcome(exit=CANCELLED_EXIT, error=ErrorInfo(type="CancelledError",
                                                               message="the client cancelled the step before it ran"))
        return to_session_result(step.id, outcome, self._step_spec(step), max_output=step.max_output,
                                 python=self._ready_python(), preloaded=self._preloaded(),
                                 landlock_abi=self._abi(), mode="session", queue_us=0,
                                 session=self.session_name, step=None, session_ended=False)

    def _refused(self, step: Step, message: str) -> SessionResult:
        return SessionResult(id=step.id, exit=REFUSED_EXIT, error=ErrorInfo(type="RequestError", message=message),
                             refused=True, session=self.session_name, step=None, session_ended=True)

    def _step_spec(self, step: Step) -> JobSpec:
        """The session's policy with this step's own timeout: the result's policy states what was enforced. Kept
        for the steps after it, which most often bring the same timeout (three struct copies on each step's path)."""
        spec, kept = self.spec, self._kept_spec
        if kept is not None and kept[0] is spec and kept[1] == step.timeout and kept[2] == step.return_value:
            return kept[3]
        made = msgspec.structs.replace(
            spec, confinement=msgspec.structs.replace(spec.confinement, timeout=step.timeout),
            payload=msgspec.structs.replace(spec.payload, return_value=step.return_value))
        self._kept_spec = (spec, step.timeout, step.return_value, made)
        return made

    def _ready_python(self) -> str:
        return self._template.ready.python if self._template else self.registry.python

    def _preloaded(self) -> list[str]:
        return self._template.ready.preloaded if self._template else []

    def _abi(self) -> int:
        return self._template.ready.landlock_abi if self._template else self.registry.landlock_abi


class SessionRegistry:
    """Named sessions of one pool: creation, the step queue limit, idle closing, shutdown."""

    def __init__(self, *, max_sessions: int, idle: float, new_template: Callable[..., Template],
                 finish: Callable[..., None], emit: Callable[[bytes], None], calls: CallRegistry,
                 python: str, landlock_abi: int, flights: Flights,
                 stopped: Callable[[], str | None] = lambda: None, scratch: ScratchRoot | None = None,
                 place: Callable[[JobSpec], JobSpec] = lambda spec: spec, interrupt_grace: float = 1.0,
                 templates: SessionTemplates | None = None) -> None:
        """``stopped``: why a step taken now must not run (the pool's drain escalated), or None. ``scratch``:
        where sessions' scratch directories are (see scratch.py). ``place``: a session's spec with the packages
        it names installed (waits for them; see packages.py). ``interrupt_grace``: seconds a cancelled step has
        to end after its KeyboardInterrupt. ``templates``: the pool's zygote, shared with its workers."""
        self.scratch = scratch
        self.place = place
        self.max_sessions = max_sessions
        self.interrupt_grace = interrupt_grace
        self.ended = EndedSessions()  # the names of sessions ended, and why
        self.stopped = stopped
        self.flights = flights
        self.idle = idle
        self.new_template = new_template
        self.finish = finish
        self.emit = emit
        self.calls = calls
        self.python = python
        self.landlock_abi = landlock_abi
        self.lock = threading.Lock()
        self._sessions: dict[str, Session] = {}
        # Told "opened", "closed" (every end) and "expired" (closed for being idle): the stats' session counters.
        self.count: Callable[[str], None] = lambda _: None
        # Told the tenant of a step its tenant's memory_budget killed (the stats' budget_kills).
        self.budget_kill: Callable[[str], None] = lambda _: None
        # Each session's template is forked from the pool's zygote (see zygote.py), one waiting ahead.
        self.templates = templates if templates is not None else SessionTemplates(new_template)
        self.spare = _SpareTemplate(self.templates.new_template)
        self._reaper = threading.Thread(target=self._reap_idle, name="pynox-session-reaper", daemon=True)
        self._reaper.start()

    @property
    def active(self) -> int:
        with self.lock:
            return len(self._sessions)

    def get(self, name: str) -> Session | None:
        with self.lock:
            return self._sessions.get(name)

    def submit(self, name: str, step: Step, create: Callable[[], tuple[JobSpec, int]] | None) -> None:
        """Queue a step. ``create`` resolves the first request's permissions when the session is new.

        Raises :class:`RequestError` when the step cannot be accepted."""
        with self.lock:
            session = self._sessions.get(name)
            if session is None:
                if create is None:  # pragma: no cover - the server always passes it for a new session
                    raise RequestError(f"no session named {name!r}")
                if len(self._sessions) >= self.max_sessions:
                    raise RequestError(f"the pool already has {self.max_sessions} sessions (max_sessions); close "
                                       "one or wait until an idle one is closed")
                spec, max_output = create()
                session = Session(name, spec, max_output, self)
                session.reopened = self.ended.take(name)
                self._sessions[name] = session
                self.count("opened")
                session.start()
            elif session.closing:
                raise RequestError(f"session {name!r} is closing; send the step again after its result or "
                                   "closed reply")
            elif session.pending >= MAX_PENDING_STEPS:
                raise RequestError(f"session {name!r} already has {MAX_PENDING_STEPS} pending steps; wait for "
                                   "their results before sending more")
            session.pending += 1
            session.last_used = time.monotonic()
            step.interrupt = StepInterrupt(self.interrupt_grace)
            self.flights.add(step.flight)
            step.flight.answer_cancelled = lambda: session.answer_cancelled(step)
            session.items.put(step)

    def reserve(self, name: str, spec: JobSpec, max_output: int) -> Session:
        """Register a fork's copy under ``name`` (not started: the fork starts it, or releases it); RequestError
        if the name is taken or the pool is at max_sessions: the copy is a session."""
        with self.lock:
            existing = self._sessions.get(name)
            if existing is not None:
                raise RequestError(f"fork: a session named {name!r} is already open; name the copy otherwise")
            if len(self._sessions) >= self.max_sessions:
                raise RequestError(f"fork: the pool already has {self.max_sessions} sessions (max_sessions), and "
                                   "the copy would be one more; close one or wait until an idle one is closed")
            copy = Session(name, spec, max_output, self)
            self._sessions[name] = copy
            self.count("opened")
        return copy

    def submit_files(self, name: str, item: FileRequest) -> None:
        """Queue a file request behind the session's steps (they count together against the pending limit)."""
        with self.lock:
            session = self._sessions.get(name)
            if session is None or session.closing:
                why = self.ended.why(name) if session is None else None
                if why is not None:  # it held files: say they are gone, and why
                    raise RequestError(f"there is no open session named {name!r}: it ended ({why}), and its "
                                       "scratch directory with it")
                raise RequestError(f"there is no open session named {name!r}: a file request goes to a session "
                                   'opened with "scratch": true')
            if session.pending >= MAX_PENDING_STEPS:
                raise RequestError(f"session {name!r} already has {MAX_PENDING_STEPS} pending requests; wait for "
                                   "their answers before sending more")
            session.pending += 1
            session.last_used = time.monotonic()
            session.items.put(item)

    def close(self, name: str, request_id: RequestId) -> bool:
        with self.lock:
            session = self._sessions.get(name)
            if session is None or not session.life.stop_taking():
                return False
            session.items.put(_Close(request_id))
            return True

    def forget(self, session: Session, why: str | None = None) -> None:
        """``why``: the pool ended it (the client did not close it), as the step that reopens its name is told."""
        with self.lock:
            session.life.stop_taking()  # nothing more is queued on it
            if self._sessions.get(session.session_name) is session:
                del self._sessions[session.session_name]
                if why is not None:
                    self.ended.remember(session.session_name, why)
                self.count("closed")

    def shutdown(self) -> None:
        """Sessions end with the pool: pending steps are answered, then every session closes."""
        with self.lock:
            sessions = list(self._sessions.values())
            for session in sessions:
                if session.life.stop_taking():
                    session.items.put(_Close(None))
        for session in sessions:
            session.join()
        self.spare.close()
        self.templates.close()

    def _reap_idle(self) -> None:
        while True:
            time.sleep(min(1.0, self.idle / 4))
            now = time.monotonic()
            with self.lock:
                for session in self._sessions.values():
                    idle_too_long = now - session.last_used >= self.idle
                    if (not session.closing and session.pending == 0 and (idle_too_long or session.process_ended())
                            and session.life.stop_taking()):
                        why = (f"it was closed after {format_duration(self.idle)} without a step (session_idle)"
                               if idle_too_long else "its process ended while it waited for a step")
                        if idle_too_long:
                            self.count("expired")
                        session.items.put(_Close(None, why))


class SessionRequests:
    """A request that names a session, taken or refused: a step (the first one opening the session with the
    permissions it brings, resolved as a job's are, see jobs.py), a save or a restore (see session_state.py),
    files in or out, a close. What a later step may carry, when a name is opened again, and what a refusal
    tells the client of the session are decided here; :class:`SessionRegistry` queues what is taken."""

    def __init__(self, registry: SessionRegistry, resolver: Resolver, states: StateKeeper) -> None:
        self.registry = registry
        self.resolver = resolver
        self.states = states

    def take(self, request: Request, arrived_ns: int, draining: str | None) -> None:
        """Queue what ``request`` (read at ``arrived_ns``) asks of its session; RequestError when it is refused
        (nothing ran). ``draining``: why the pool takes no new work, once it has begun to end (a close is still
        taken)."""
        name = request.session
        assert name is not None  # routed here for its session
        if request.queue_timeout is not None:
            raise RequestError("queue_timeout applies to jobs; a session's steps wait for the step before them, in "
                               "the session's own process")
        if draining is not None and not request.close:
            raise RequestError(draining)
        if request.file_request():
            self.registry.submit_files(name, FileRequest(request))
            return
        self._request(request, name, arrived_ns)

    def refusal(self, request_id: RequestId, message: str, session: str) -> SessionResult:
        """A refused session request still says which session it was for, and whether the pool holds one under
        that name (a session that goes on), or none (a refused first request: its client must forget the name,
        and bring the permissions again with the next one)."""
        existing = self.registry.get(session)
        return session_refusal(request_id, message, session=session,
                               session_ended=existing is None or existing.closing)

    def _request(self, request: Request, name: str, arrived_ns: int) -> None:
        if request.close:
            if not self.registry.close(name, request.id):
                raise RequestError(f"close: there is no open session named {quoted(name)}")
            return
        if request.script is not None:
            raise RequestError("sessions take inline code, not script")
        existing = self.registry.get(name)
        live = existing is not None and not existing.closing
        if request.save:
            if existing is None or not live:
                raise RequestError(f"save: there is no open session named {quoted(name)}")
            self._save(request, name, existing.spec.confinement.timeout)
            return
        if request.fork is not None:
            if existing is None or not live:
                raise RequestError(f"fork: there is no open session named {quoted(name)}")
            self._fork(request, name, request.fork, existing.spec.confinement.timeout)
            return
        if request.restore is not None:
            if live:
                raise RequestError(f"restore: session {quoted(name)} is already open; a restore opens a new "
                                   "session (close this one first, or restore under another name)")
            state = self.states.opened(request.restore)  # refused here, before anything runs
            request = msgspec.structs.replace(request, restore=None, code=RESTORE_CODE, name="session-restore.py",
                                              args=[base64.b64encode(state).decode()], return_value=None,
                                              stream=None)
        if request.open and live:
            raise RequestError(f"open: session {quoted(name)} is already open; its later steps carry no open")
        if existing is not None and live:
            fields = request.grant_fields()
            if fields:
                raise RequestError(f"session {name!r} already exists and its permissions are fixed by its first "
                                   f"request; a later step may carry only code, name, args, timeout, "
                                   f"max_output and return_value, not {', '.join(fields)}")
            spec, max_output = existing.spec, existing.max_output
        else:
            self._may_open(request, name)
            spec, max_output = self.resolver.resolve(request, session=True)
        # A step's own timeout and output cap are still bounded by the ceiling.
        step_request = Request(id=request.id, code=request.code, timeout=request.timeout,
                               max_output=request.max_output)
        bounded(step_request, self.resolver.options.config, self.resolver.cwd)
        timeout = parse_request_duration(request.timeout, spec.confinement.timeout)
        step_max_output = parse_request_size(request.max_output, max_output)
        # Like any request, a step's file name is agent.py unless it says otherwise.
        step = Step(id=request.id, code=request.code or "", name=request.name or DEFAULTS.name,
                    args=list(request.args or ()), timeout=timeout, max_output=step_max_output,
                    accepted_ns=arrived_ns, return_value=bool(request.return_value),
                    stream=bool(request.stream),
                    flight=Flight(request.id), tenant=self.resolver.budget_of(request.id))
        # A scratch directory is made only for a session that is really opened.
        scratch = self.resolver.scratch
        self.registry.submit(name, step, lambda: (scratch.grant(spec) if request.scratch else spec, max_output))

    def _save(self, request: Request, name: str, timeout: float) -> None:
        """A save is a step of the session running the pool's own code; its result becomes the save's answer."""
        step_timeout = parse_request_duration(request.timeout, timeout)
        bounded(Request(id=request.id, code="", timeout=request.timeout), self.resolver.options.config,
                self.resolver.cwd)
        step = Step(id=request.id, code=SAVE_CODE, name="session-save.py", args=[], timeout=step_timeout,
                    max_output=self.states.save_output, accepted_ns=time.monotonic_ns(), flight=Flight(request.id),
                    answer=self.states.saved)
        self.registry.submit(name, step, None)

    def _fork(self, request: Request, name: str, copy: str, timeout: float) -> None:
        """A fork is a step of the session running the pool's own code, whose answer opens the copy (see
        Session._serve_fork)."""
        step_timeout = parse_request_duration(request.timeout, timeout)
        bounded(Request(id=request.id, code="", timeout=request.timeout), self.resolver.options.config,
                self.resolver.cwd)
        step = Step(id=request.id, code=FORK_CODE, name="session-fork.py", args=[], timeout=step_timeout,
                    max_output=_FORK_OUTPUT, accepted_ns=time.monotonic_ns(), flight=Flight(request.id), fork=copy)
        self.registry.submit(name, step, None)

    def _may_open(self, request: Request, name: str) -> None:
        """A request to a name the pool holds no session under opens one with the permissions it brings,
        code only included (the protocol's rule), unless it says it is a later step (``"open": false``: a
        client that holds the session and will not have it reopened with other grants), or the operator
        turned on ``strict_session_reopen`` and the pool ended a session under that name."""
        if request.open is False:
            why = self.registry.ended.why(name)
            raise RequestError(f"there is no open session named {quoted(name)} "
                               f"({why if why is not None else 'it ended, or this pool never opened it'}), and "
                               '"open": false says this step must not open one: it did not run. Send the '
                               "session's first request again, with its grants and limits")
        if self.resolver.options.strict_session_reopen and not (request.open or request.grant_fields()):
            why = self.registry.ended.why(name)
            if why is not None:
                raise RequestError(f"the session named {quoted(name)} ended ({why}), and this pool does not "
                                   "reopen it for a step that carries only code (strict_session_reopen): it did "
                                   'not run. Send the session\'s first request again, with its grants and limits, '
                                   'or "open": true for the defaults')
