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

import logging
import os
import queue
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec

from ..errors import PynoxError, RequestError
from ..policy.cgroups import TenantGroup
from ..protocol import Closed, Request, RequestId, SessionResult, encode
from ..units import format_duration
from ..wire.descriptors import STEP
from ..wire.exits import CANCELLED_EXIT, REFUSED_EXIT, WORKER_ERROR_EXIT
from ..wire.frames import Ended, send_frame
from ..wire.spec import ErrorInfo, JobSpec, StepSpec
from .ended import EndedSessions
from .flights import CLIENT_CANCELLED, Flight, Flights
from .hostcalls import CallRegistry
from .interrupts import StepInterrupt
from .outcome import Gathering, Outcome, to_session_result
from .scratch import ScratchRoot, answer
from .session_life import SessionLife, SessionState
from .streaming import Streamer
from .templates import CallSink, SessionChannels, Template
from .zygote import SessionTemplates

__all__ = ["MAX_PENDING_STEPS", "FileRequest", "Session", "SessionRegistry", "Step"]

_log = logging.getLogger(__name__)

MAX_PENDING_STEPS = 8


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


class _NotRun(Exception):
    """A cancel came before the step was sent to the session's process: it never runs, the session goes on."""


@dataclass
class FileRequest:
    """Files in or out of the session's scratch directory: queued behind its steps, served between them."""

    request: Request


class _EndedWhileIdle(Exception):
    """The session's child ended between two steps."""


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
    step runs: on two cores, forking and confining the next one would take the time the step needs."""

    def __init__(self, new_template: Callable[[], Template]) -> None:
        self._new_template = new_template
        self._ready = threading.Condition()
        self._spare: Template | None = None
        self._started = self._closed = False
        self._preparing = False  # the spare is out of reach while a child is prepared in it (a fork's time)
        self._owed: list[Template] = []  # spares taken whose session's first step has not been answered yet
        # What the next session is likely confined with: the last first step's bounds and grants (no payload),
        # and the one the spare's waiting child was prepared with.
        self._wanted: JobSpec | None = None
        self._prepared_for: JobSpec | None = None

    def take(self) -> Template:
        """The waiting template, or (none ready yet) one started now on the caller's thread."""
        with self._ready:
            while self._preparing and not self._closed:
                self._ready.wait()
            spare, self._spare = self._spare, None
            if spare is not None:
                self._owed.append(spare)
            if not self._started:
                self._started = True
                threading.Thread(target=self._keep_one_ready, name="pynox-session-spare", daemon=True).start()
            self._ready.notify_all()
        if spare is not None and (spare.broken or spare.process.poll() is not None):  # it died while it waited
            with self._ready:  # nothing is owed for it: the next one is started now
                self._owed = [owed for owed in self._owed if owed is not spare]
                self._ready.notify_all()
            spare.close()
            spare = None
        return spare if spare is not None else self._new_template()

    def answered(self, taken: Template | None, first: JobSpec | None = None) -> None:
        """A session's first step was answered (or the session ended before one was): the spare it took, if
        ``taken`` is one, is replaced now, and ``first`` (its first request as resolved, None if it cannot be
        shared: a scratch or pip directory of its own) is what the next one is prepared for."""
        with self._ready:
            self._owed = [owed for owed in self._owed if owed is not taken]
            if first is not None:
                self._wanted = msgspec.structs.replace(first, payload=msgspec.structs.replace(
                    first.payload, code=None, script=None, args=[], env={}, name=""))
            self._ready.notify_all()

    def close(self) -> None:
        with self._ready:
            self._closed = True
            spare, self._spare = self._spare, None
            self._ready.notify_all()
        if spare is not None:
            spare.close()

    def _keep_one_ready(self) -> None:
        try:
            self._start_spares()
        except Exception as exc:  # the session asking next starts its own and reports the problem
            _log.warning("could not start a template ahead for the next session (%s: %s); sessions start their "
                         "own", type(exc).__name__, exc)
        # This thread must outlive the templates it started, which sessions hold: it waits for the pool's end.
        with self._ready:
            while not self._closed:
                self._ready.wait()

    def _forget_wanted(self, wanted: JobSpec) -> None:
        with self._ready:
            if self._wanted is wanted:  # not a newer one, which is tried
                self._wanted = None

    def _to_prepare(self) -> bool:
        wanted, prepared = self._wanted, self._prepared_for
        return wanted is not None and (prepared is None or wanted.confinement != prepared.confinement)

    def _start_spares(self) -> None:
        while True:
            with self._ready:
                while not self._closed and (self._owed or (self._spare is not None and not self._to_prepare())):
                    self._ready.wait()
                if self._closed:
                    return
                template, wanted = self._spare, self._wanted
                self._preparing = template is not None
            try:
                if template is None:
                    template = self._new_template()
                    self._prepared_for = None
                if wanted is not None:
                    try:
                        prepared = template.prepare_session(wanted)
                    except PynoxError as exc:  # this template failed: the next one is started in its place
                        _log.warning("a template waiting for the next session failed (%s)", exc)
                        template.close()
                        template = None
                        self._forget_wanted(wanted)  # prepared again once another session's first step is answered
                        continue
                    self._prepared_for = wanted if prepared else None
                    if not prepared:  # a grant is gone: no child waits; tried again when another session comes
                        self._forget_wanted(wanted)
            finally:
                with self._ready:
                    self._preparing = False
                    closed = self._closed
                    if not closed:
                        self._spare = template
                    self._ready.notify_all()
            if closed and template is not None:  # the pool closed while it started
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
                ended = self._serve(item)
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
        pipes = [os.pipe2(os.O_CLOEXEC) for _ in STEP]  # stdout, stderr, report, display, in that order
        # The step's time starts before it is sent: a child that stops reading its control channel (a
        # full socket buffer) costs the step its deadline, never the pool a thread.
        start = time.monotonic_ns()
        self.life.running()
        # Frozen since its last step's result: what it runs from now on (a thread an earlier step left
        # behind included) runs under this step's deadline.
        template.continue_child()
        channels.control.settimeout(step.timeout)
        try:
            send_frame(channels.control, StepSpec(code=step.code, name=step.name, args=step.args,
                                                  return_value=step.return_value, images=step.max_output,
                                                  stream=step.stream),
                       [w for _, w in pipes])
        except TimeoutError:
            template.kill_child()  # collect() then finds the deadline passed and reports the timeout
        except OSError:
            pass  # the child is gone; the template's Ended frame says how, the empty pipes end the step
        finally:
            for _, w in pipes:
                os.close(w)
        return template.collect([r for r, _ in pipes], self.spec, step.timeout, step.max_output, start,
                                calls=calls, outbox=channels.outbox, session=True, return_value=step.return_value,
                                streamer=self._streamer(step))

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
        """The session's policy with this step's own timeout: the result's policy states what was enforced."""
        return msgspec.structs.replace(
            self.spec, confinement=msgspec.structs.replace(self.spec.confinement, timeout=step.timeout),
            payload=msgspec.structs.replace(self.spec.payload, return_value=step.return_value))

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

    def submit_files(self, name: str, item: FileRequest) -> None:
        """Queue a file request behind the session's steps (they count together against the pending limit)."""
        with self.lock:
            session = self._sessions.get(name)
            if session is None or session.closing:
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
