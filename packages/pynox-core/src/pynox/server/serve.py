"""``pynox pool``: JSON Lines in, one confined child per request, results out in completion order.

The server routes every line to the module that decides it (``Server._handle_line``:
an over-long line to :mod:`.io`, a host's reply to :mod:`.hostcalls`, a cancel to
:mod:`.flights`, a session's request to :mod:`.sessions`, a job to :mod:`.jobs`
then :mod:`.admission`), and owns the loops: intake's, the worker threads' (one
warm template each) and the drain's. Results leave through ``Server.finish``, with
their counters and log lines. It never forks job code itself: it has threads and
open descriptors that a job must never inherit. The walk of one line through the
server is drawn in docs/architecture.md ("One line, through the server").

Flow control: intake reads every line as it arrives and never waits for a
worker, so a stats, cancel or host-call reply written behind the jobs waiting
is answered at once, and a job's wait is counted from the moment its line was
read. Jobs waiting for a worker are counted and bounded, each with its queue
deadline (see :mod:`.admission`): beyond ``[pool] max_queued`` a job is
refused at once; with no bound set (one client, on stdin) intake stops reading
at ``DEFAULT_MAX_QUEUED`` waiting jobs instead, the protocol's backpressure. A
client that stops reading results blocks the writers, then the workers and
intake: memory stays bounded. Stats that never wait on intake are on the metrics
socket (:mod:`.metrics`).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import queue
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Literal

from .. import __version__, hints
from ..config import DEFAULT_MAX_QUEUED, PoolOptions, pool_options
from ..errors import ConfigError, KernelSupportError, PoolWorkerError, PynoxError, RequestError
from ..policy import BACKEND, cgroups
from ..policy.limits import refuse_open_file_limit_below
from ..protocol import (
    IMPORTABLE_LISTED,
    CancelAnswer,
    LineError,
    PoolEventName,
    PoolLogEvent,
    ReadyEvent,
    Reply,
    Request,
    RequestId,
    Result,
    SessionResult,
    StartError,
    StartErrorEvent,
    encode,
    parse_line,
    refusal,
)
from ..units import format_duration
from ..wire.exits import CANCELLED_EXIT, WORKER_ERROR_EXIT
from ..wire.frames import Ready
from ..wire.spec import MAX_OPEN_FILES, ErrorInfo
from .admission import Admission
from .flights import Flights
from .hostcalls import CallRegistry
from .init import serve_as_init
from .io import LineReader, Output, TooLong, stdio, too_long, watch_for_client_death
from .jobs import Job as _Job  # the worker's name for it
from .jobs import Resolver
from .jsonlog import log_records_as_json, relay_as_json
from .labels import Labels
from .lifecycle import ChildLife, ChildState
from .listen import Listener, Router
from .metrics import MetricsSocket
from .outcome import Outcome, to_result
from .packages import Installer
from .scratch import ScratchRoot
from .session_state import StateKeeper
from .sessions import SessionRegistry, SessionRequests
from .shutdown import Shutdown, Stage
from .spans import spans_from_environment
from .stats import Gauges, Stats, log_line
from .streaming import Streamer
from .templates import CallSink, Template
from .tenants import Tenants, budget_group
from .trace import Traces
from .zygote import ForkedProcess, SessionTemplates

__all__ = ["serve"]

_log = logging.getLogger(__name__)

_START_ATTEMPTS = 3  # starts of a template that died while starting, before a job or the pool gives up
_PREPARED_EVERY = 0.01  # seconds an idle worker waits for a job or its template's frame before it asks again


class _Jobs:
    """The jobs queued for the workers (None: a worker's signal to end). A SimpleQueue (one lock in C, where
    Queue takes a condition and its waiter lock in Python): nobody joins it.

    A worker whose template is still sending the children it prepared ahead waits for a job and for its
    template's socket at once (:meth:`get_or_readable`), so that it reads their frames as they arrive
    instead of on the next job's path, between the job's line and its child. It listens on an eventfd of
    its own, which a put rings (one listening worker per job); a worker with nothing to read waits in the
    queue itself, as before."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._listening: list[int] = []  # the eventfds of the workers waiting in get_or_readable

    def put(self, job: _Job | None) -> None:
        self._queue.put(job)
        # Read without the lock first (the common case: nobody listens). A worker that starts listening after
        # this read looks in the queue once it listens, and finds this job there.
        if self._listening:
            with self._lock:
                if self._listening:
                    os.eventfd_write(self._listening.pop(), 1)

    def get(self) -> _Job | None:
        return self._queue.get()

    def get_or_readable(self, bell: int, fd: int, timeout: float) -> tuple[bool, _Job | None]:
        """``(True, job)`` for a job queued now or within ``timeout`` seconds; ``(False, None)`` once ``fd`` is
        readable first, or the time is up. ``bell``: the caller's eventfd."""
        try:
            return True, self._queue.get_nowait()
        except queue.Empty:
            pass
        with self._lock:
            self._listening.append(bell)
        try:
            try:  # queued between the look above and the listening: its put rang nobody
                return True, self._queue.get_nowait()
            except queue.Empty:
                pass
            poller = select.poll()
            poller.register(fd, select.POLLIN)
            poller.register(bell, select.POLLIN)
            poller.poll(timeout * 1000)
        finally:
            with self._lock:  # a put rings under the lock: after this, nothing rings this bell until it listens
                if bell in self._listening:
                    self._listening.remove(bell)
            try:
                os.eventfd_read(bell)  # rung or not, it is silent for the next wait
            except BlockingIOError:
                pass
        try:
            return True, self._queue.get_nowait()
        except queue.Empty:
            return False, None

    def close_bell(self, bell: int) -> None:
        with self._lock:
            if bell in self._listening:
                self._listening.remove(bell)
            os.close(bell)


class _Worker(threading.Thread):
    """One worker thread and its template. The template is started from this thread, which lives as long
    as the pool: a template dies with the thread that started it (its parent-death signal)."""

    def __init__(self, index: int, server: Server) -> None:
        super().__init__(name=f"pynox-worker-{index}", daemon=True)
        self.server = server
        self.template: Template | None = None
        self.started_event = threading.Event()
        self.start_error: BaseException | None = None
        self.start_problem = ""  # why the last replacement template failed, for the job's result
        self.busy = False  # running a job (a gauge of the stats)
        # The child serving this worker's job, kept across the templates it replaces (see lifecycle.py).
        self.child = ChildLife()
        self._bell: int | None = None  # an eventfd a job queued rings while this worker reads its template too

    def run(self) -> None:
        try:
            self.template = self.server.zygote.new_template(self.child)
        except BaseException as exc:
            self.start_error = exc
            self.started_event.set()
            return
        self.started_event.set()
        try:
            # Made once, with the template (a pool's descriptors stay what they were after its first job): a
            # worker that cannot have one (EMFILE) waits in the queue, and its jobs read the frames on their way.
            with contextlib.suppress(OSError):
                self._bell = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
            while (job := self._next_job()) is not None:
                try:
                    self._take(job)
                except Exception:  # a bug around the job costs it its result and its template, never this worker
                    self._failed_around(job)
                self.busy = False
                self._after_job()
                self.server.scratch.remove(job.spec.scratch)
                self.server.flights.remove(job.flight)
        finally:
            if self.template is not None:
                self.template.close()
            if self._bell is not None:
                self.server.jobs.close_bell(self._bell)

    def _take(self, job: _Job) -> None:
        # Taken before its flight starts: a cancel from then on is kept until the job is sent.
        self.child.take()
        self.server.admission.taken(job)  # past its queue deadline, it is refused now and never starts
        # A job cancelled while it was queued has been answered: it never starts.
        if job.flight.start(self.child.cancel):
            # Read after the flight started: a shutdown that escalates later kills it instead.
            stopping = self.server.stop_reason
            self.busy = True
            result = self._serve_safely(job) if stopping is None else self.server.stopped_before_start(job)
            leftover = None
            if job.spec.scratch is not None:  # the job has ended: what it left there goes with its result
                result.files = self.server.scratch.files_of(job.spec.scratch, job.max_output)
                leftover = self.server.scratch.detach(job.spec.scratch)  # gone from its path with its result
            self.busy = False
            if job.flight.answer():
                self.server.finish(result, session=None, step=None)
            # Its contents are removed once the result has left: the work is the size of what the job left (on
            # the remover's thread; on a tmpfs here, before this worker's next job, see ScratchRoot.dispose).
            self.server.scratch.dispose(leftover)
            if self.template is not None:
                self.template.after_result()

    def _failed_around(self, job: _Job) -> None:
        """Something of ours failed around a job, outside its serving (its queue deadline, its scratch files, the
        template's turn after it): the job is answered once, if it was not, and the template replaced. Were the
        exception to end this thread, the pool would have a worker fewer, and the jobs queued for it would wait."""
        _log.exception("worker %s failed around job %r", self.name, job.id)
        if self.template is not None:
            self.template.broken = True  # replaced before the next job
        if job.flight.answer():
            self.server.finish(self._worker_error(job, 0, "the pool failed around this job; it was stopped"),
                               session=None, step=None)

    def _next_job(self) -> _Job | None:
        """The next job, as soon as it comes; while none does and the template is still sending the children
        it prepares, its frames are read as they arrive, so that an idle pool holds every child it prepared
        and the next job reads none of them on its way to its child (with one waiting, a job never waits for
        the others: they arrive while it runs)."""
        while self.template is not None and self.template.preparing:
            if self._bell is None:  # none could be made: the next job reads the frames on its way
                break
            taken, job = self.server.jobs.get_or_readable(self._bell, self.template.sock.fileno(), _PREPARED_EVERY)
            if taken:
                return job
            self.template.read_prepared()
        return self.server.jobs.get()

    def _after_job(self) -> None:
        """Its result left: the next job finds the life IDLE. A job never sent is dropped; a broken
        template is closed now (its child forgotten), and replaced when the next job needs one."""
        if self.child.state is ChildState.TAKEN:
            self.child.drop()
        if self.template is not None and self.template.broken:
            self._died(self.template)
            self.template.close()
            self.template = None

    def _died(self, template: Template) -> None:
        """The operator's line for a template that died or broke, with its cause (the restarts counter alone
        says only that one did)."""
        self.server.log_event("template_died", f"{self.name}: template {template.process.pid} {death_cause(template)}"
                                               "; a new one starts before the next job")

    def _serve_safely(self, job: _Job) -> Result:
        """Serve one job; whatever goes wrong costs that job and its template, never this thread."""
        try:
            return self._serve(job)
        except Exception as exc:
            _log.exception("worker %s failed while serving job %r", self.name, job.id)
            if self.template is not None:
                self.template.broken = True  # replaced before the next job
            return self._worker_error(job, 0, f"the pool failed while serving this job ({type(exc).__name__}); "
                                              "it was stopped")

    def _serve(self, job: _Job) -> Result:
        began = time.monotonic_ns()
        queue_us = (began - job.accepted_ns) // 1000
        for attempt in range(2):
            template = self._healthy_template()
            if template is None:
                return self._worker_error(job, queue_us, f"no template could be started for this job: "
                                                         f"{self.start_problem}")
            try:
                gathered = template.run(job.spec, max_output=job.max_output, calls=self._calls_for(job),
                                       streamer=Streamer(job.id, None, self.server.output.write)
                                       if job.spec.payload.stream else None, tenant=job.tenant)
            except RequestError as exc:  # a grant changed between acceptance and start: nothing ran
                return refusal(job.id, str(exc))
            except PoolWorkerError as exc:
                # A job that never began is safe to retry once: it never reached the template (a fresh one
                # takes it), or the prepared child handed it died before it claimed it (the template forks it one).
                if not exc.started and attempt == 0:
                    continue
                return self._worker_error(job, queue_us, str(exc), (time.monotonic_ns() - began) // 1000)
            # Killed for a cancel: that, not the kill, is what happened to it.
            gathered.cancelled = job.flight.cancelled
            if (budget_killed := gathered.budget_killed) is not None:
                self.server.stats.record_budget_kill(budget_killed)
            return to_result(job.id, gathered.freeze(job.spec, job.spec.confinement.timeout), job.spec,
                             max_output=job.max_output, python=template.ready.python,
                             preloaded=template.ready.preloaded, landlock_abi=template.ready.landlock_abi,
                             mode="pool", queue_us=queue_us)
        raise AssertionError("unreachable")  # pragma: no cover - the loop always returns

    def _calls_for(self, job: _Job) -> CallSink | None:
        if not job.spec.payload.functions:
            return None
        return lambda outbox: self.server.calls.open(job.id, job.spec.payload.functions, outbox)

    def _healthy_template(self) -> Template | None:
        template = self.template
        if template is not None and not template.broken and template.process.poll() is None:
            return template
        if template is not None:
            self._died(template)
            template.close()
        self.template = None
        try:
            self.template = self.server.zygote.new_template(self.child)
        except PynoxError as exc:
            self.start_problem = str(exc)
            self.server.log_event("template_error", str(exc))
        else:
            self.server.stats.record_template_restart()
            self.server.log_event("template_replaced", f"{self.name}: template {self.template.process.pid} "
                                                       "started in place of the one that died")
        return self.template

    def _worker_error(self, job: _Job, queue_us: int, message: str, duration_us: int = 0) -> Result:
        outcome = Outcome(exit=WORKER_ERROR_EXIT, error=ErrorInfo(type="PoolWorkerError", message=message),
                          duration_us=duration_us)
        ready = self.server.ready
        return to_result(job.id, outcome, job.spec, max_output=job.max_output, python=ready.python,
                         preloaded=ready.preloaded, landlock_abi=ready.landlock_abi, mode="pool", queue_us=queue_us)


class Server:
    def __init__(self, options: PoolOptions, output: Output, log: Callable[[bytes], None]) -> None:
        self.options = options
        self.output = output
        self._log = log
        self.stats = Stats(options.workers, version=__version__)
        self._arrived_ns = 0  # when intake read the line it handles now
        self.workers: list[_Worker] = []  # once started
        self.ready_info: ReadyEvent | None = None
        self.ready: Ready  # the first template's, once started
        # How the pool ends (see shutdown.py). The intake lock is held while a line is accepted: once the
        # drain holds it, every later line sees the stage and is refused, and nothing more is queued.
        self.shutdown = Shutdown(options.drain_timeout, on_drain=self._start_drain, on_stop=self._stop)
        self._intake = threading.Lock()
        self.drained = threading.Event()
        self.stop_reason: str | None = None  # set when the drain escalates
        self._cut = 0  # jobs the escalation killed or refused: the drain was not complete
        self._cut_lock = threading.Lock()
        self.wake = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)  # wakes intake when the drain is over
        # Requests accepted and not yet answered, for {"cancel": ID}.
        self.flights = Flights()
        self.calls = CallRegistry(output.write, self.stats.record_host_call)
        self.sessions: SessionRegistry  # created once the first template has reported the runtime
        # What a template writes on stderr (a preload that prints, a crash): as JSON lines too, with --log=json.
        self._template_stderr = relay_as_json(log, "a template said") if options.log == "json" else None
        # The trace context of requests that carried one, until their result (see trace.py).
        self.traces = Traces()
        # The tenant and profile of each request until its result, and the counts by them (see labels.py).
        self.labels = Labels(lambda name: self.sessions.get(name) is not None, options.max_sessions)
        # The tenant a request id belongs to, for its log line: set by a listening pool (see listen.py).
        self.tenant_of: Callable[[RequestId | None], str | None] = lambda _: None
        # The user a request's jobs run as, when its tenant says (see listen.py), over a profile's and [pool] run_as.
        self.run_as_of: Callable[[RequestId | None], tuple[int, int] | None] = lambda _: None
        # A listening pool's request id as its client gave it, and the connection's tag the pool's names carry
        # (see listen.Router.own_names); on stdin, the id itself and no tag.
        self.own_names: Callable[[RequestId | None], tuple[RequestId | None, str]] = lambda request_id: (
            request_id, "")
        # The cgroups of each tenant with a memory_budget or cpu_weight (see policy/cgroups.py TenantGroup), made
        # as the pool starts: where none can be made, the pool does not start (never without the budget).
        self.budgets: dict[str, cgroups.TenantGroup] = {}
        # Scratch directories of sessions and jobs that ask for one (see scratch.py); removed at exit.
        self.scratch = ScratchRoot(options.scratch_dir, run_as=options.config.pool.run_as,
                                   others=options.config.runs_as_others(),
                                   max_file=options.scratch_max_file, max_total=options.scratch_max_total)
        # The packages requests name, installed by the pool (see packages.py); the ceiling's bound their versions.
        limits = options.config.limits
        self.installer = Installer(options.config.pool.installs, ceiling=limits.packages if limits else (),
                                   allowed=limits.packages if limits else None)
        self.calls.pip = self.installer.pip
        # Unbounded as a queue: admission counts and bounds the jobs in it (see admission.py).
        self.jobs = _Jobs()
        # A bound the operator set, or many clients on a socket (one that floods must not stall the others):
        # refused beyond it. One client on stdin and stdout with no bound set: slowed, as the protocol says.
        self.admission = Admission(options.max_queued or DEFAULT_MAX_QUEUED, options.workers, self._finish_job,
                                   flights=self.flights, queue=self.jobs.put, install=self.installer.submit,
                                   cancelled=self._cancelled_while_queued,
                                   refuse=options.max_queued is not None or options.listen is not None)
        # What the pool adds to a request's grants, for a job or a session's first step (see jobs.py).
        self.resolver = Resolver(options, self.installer, self.scratch, self.budget_of,
                                 lambda request_id: self.run_as_of(request_id))
        # OpenTelemetry spans, when OTEL_TRACES_EXPORTER asks for them (see spans.py); else None, and no cost.
        self.spans = spans_from_environment(lambda why: self.log_event("config_warning", why))
        # Signs the states sessions save and checks those given back (see session_state.py).
        self.states = StateKeeper(options.session_key_file, options.max_session_state)
        # The pool's zygote (see zygote.py): every template, a worker's or a session's, is forked from it.
        self.zygote = SessionTemplates(self.new_template, self.log_event)

    # -- templates and results -------------------------------------------------------------------------
    def new_template(self, life: ChildLife | None = None, *, zygote: bool = False,
                     spawn: Callable[[], tuple[ForkedProcess, socket.socket]] | None = None) -> Template:
        """A started template; one that died while starting (killed, out of memory) is replaced, a few
        times, before the start counts as failed. A preload that fails to import is not retried.
        ``life``: a worker's child life, which outlives its templates (see lifecycle.py). ``zygote``,
        ``spawn``: a zygote, or a template forked from one (see zygote.py)."""
        for attempt in range(_START_ATTEMPTS):
            try:
                return Template(self.options.preload, self.options.package_dirs, stderr=self._template_stderr,
                                landlock_abi=self.options.landlock_abi, life=life, job_cpu=self.options.job_cpu,
                                zygote=zygote, spawn=spawn, prepared_children=self.options.prepared_children)
            except PoolWorkerError as exc:
                if not exc.transient or attempt == _START_ATTEMPTS - 1:
                    raise
                self.log_event("template_error", str(exc), retry=attempt + 1)
        raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises

    def finish(self, result: Result, *, session: str | None, step: int | None) -> None:
        """Write ``result``: its request's one answer. Should our own accounting or its encoding fail (a bug), the
        answer is a PoolWorkerError of the same id, so that the request still has one and its thread lives on."""
        try:
            outcome = self.stats.record(result)
            # Before the result is written: a listening pool forgets a dropped connection once its last one is.
            tenant, profile = self.labels.finished(result, outcome, session=session, fallback=self.tenant_of(result.id),
                                                   ended=bool(getattr(result, "session_ended", False)))
            line = encode(result)
        except Exception as exc:
            _log.exception("the pool could not make the result of %r", result.id)
            result, tenant, profile = _unwritable(result, exc), self.tenant_of(result.id) or "", ""
            line = encode(result)
        self.output.write(line)
        try:
            self._trace_and_log(result, session=session, step=step, tenant=tenant, profile=profile)
        except Exception:  # answered already: a failure here costs the operator a line, not the request its answer
            _log.exception("the pool could not log the result of %r", result.id)

    def _trace_and_log(self, result: Result, *, session: str | None, step: int | None, tenant: str,
                       profile: str) -> None:
        if self.spans is not None:
            self.spans.finished(result, session=session, step=step, tenant=tenant, profile=profile)
        trace = self.traces.pop(result.id) if self.traces else None
        if self.options.log == "json":
            line = log_line(result, session=session, step=step)
            if self.options.log_redact:
                line.message = None
            if trace is not None:
                line.traceparent = trace
            # On stdin there is one client: its lines name no tenant (the metrics call it "default").
            line.tenant, line.profile = tenant if self.options.listen is not None else None, profile or None
            own_id, tag = self.own_names(line.id)
            if tag:  # the request as its client named it, and the message as its client was told it
                line.id = own_id
                line.session = line.session.removeprefix(tag) if line.session is not None else None
                line.message = line.message.replace(tag, "") if line.message is not None else None
            self._log(encode(line))

    def log_event(self, event: PoolEventName, message: str, *, retry: int | None = None,
                  status: int | None = None) -> None:
        """A line about the pool itself: JSON with ``--log=json``, else a line of text an operator reads
        (template errors are results' business then, and say nothing here)."""
        if self.options.log == "json":
            self._log(encode(PoolLogEvent(ts_ms=int(time.time() * 1000), event=event, message=message, retry=retry,
                                          pid=os.getpid() if event in ("start", "ready", "exit") else None,
                                          status=status)))
        elif event in ("config_warning", "bound_not_in_force", "signal", "stop"):
            warning = event in ("config_warning", "bound_not_in_force")
            self._log(f"pynox pool: {'warning: ' if warning else ''}{message}\n".encode())

    # -- startup -----------------------------------------------------------------------------------------
    def make_budgets(self) -> None:
        """Each tenant's cgroups, for those with a budget; KernelSupportError if this host cannot make them."""
        for index, tenant in enumerate(self.options.config.tenants):
            if tenant.has_budget:
                self.budgets[tenant.name] = budget_group(index, tenant)

    def budget_of(self, request_id: RequestId | None) -> cgroups.TenantGroup | None:
        return self.budgets.get(self.tenant_of(request_id) or "") if self.budgets else None

    def start(self) -> list[_Worker]:
        refuse_open_file_limit_below(MAX_OPEN_FILES)
        self.make_budgets()
        workers = self.workers = [_Worker(i, self) for i in range(self.options.workers)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.started_event.wait()
        failed = next((w.start_error for w in workers if w.start_error is not None), None)
        if failed is not None:
            for worker in workers:
                if worker.start_error is None:
                    self.jobs.put(None)
            raise failed
        first = workers[0].template
        assert first is not None  # every worker started without error
        ready = self.ready = first.ready
        try:
            # Only now is it known how much a job inherits from its template (preloaded modules included).
            self.options.config.refuse_memory_below(
                ready.memory_floor, "a job of this pool needs to start (what its template holds, with the "
                                    "preloaded modules, plus 16 MiB to run)")
        except ConfigError:
            for _ in workers:
                self.jobs.put(None)
            raise
        self.resolver.read_paths = ready.read_paths
        self.ready_info = ReadyEvent(
            workers=self.options.workers,
            python=ready.python,
            preloaded_modules=ready.preloaded,
            package_dirs=self.options.package_dirs,
            runtime_paths=ready.read_paths,
            config=self.options.config.path,
            profiles=sorted(self.options.config.profiles),
            landlock_abi=ready.landlock_abi,
            backend=BACKEND,
            bounds_not_in_force=cgroups.available().not_in_force(),
            longest_timeout=self.options.config.longest_timeout,
            importable=hints.importable(ready.preloaded, self.options.package_dirs, IMPORTABLE_LISTED),
            installs_packages=self.installer.problem() is None,
            queue_timeout=self.options.queue_timeout or 0.0,
        )
        self.sessions = SessionRegistry(
            max_sessions=self.options.max_sessions, idle=self.options.session_idle, new_template=self.new_template,
            finish=self.finish, emit=self.output.write, calls=self.calls, python=ready.python,
            landlock_abi=ready.landlock_abi, flights=self.flights, stopped=self._stopped_step, scratch=self.scratch,
            place=self.installer.place, interrupt_grace=self.options.interrupt_grace, templates=self.zygote)
        self.sessions.count = self.stats.record_session
        self.session_requests = SessionRequests(self.sessions, self.resolver, self.states)
        self.sessions.budget_kill = self.stats.record_budget_kill
        self.output.write(encode(self.ready_info))
        return workers

    # -- shutdown ----------------------------------------------------------------------------------------
    def _start_drain(self) -> None:
        threading.Thread(target=self._drain, name="pynox-drain", daemon=True).start()

    def _drain(self) -> None:
        """Every job accepted so far is answered (run, or stopped by the escalation), then the workers and
        the sessions end, and intake is woken to exit."""
        if self.shutdown.refusing():
            self.log_event("drain", f"draining: accepted jobs run on for at most "
                                    f"{format_duration(self.shutdown.drain_timeout)}; new requests are refused")
        else:
            self.log_event("drain", "the input ended: accepted jobs run to their end")
        with self._intake:  # the line being accepted now is the last one queued
            pass
        self.installer.wait_idle()  # a job waiting for its packages is queued (or answered) first
        for _ in self.workers:
            self.jobs.put(None)
        for worker in self.workers:
            worker.join()
        try:
            self.sessions.shutdown()
        except Exception:  # a bug in closing must cost the pool its cleanup, never its exit (it hung on one)
            _log.exception("the pool failed while closing its sessions and spare templates")
        finally:
            self.shutdown.cancel_deadline()
            self.admission.close()
            self.drained.set()
            os.write(self.wake[1], b"x")

    def _stop(self, reason: str) -> None:
        """The drain escalated: running jobs are killed (answered as cancelled for ``reason``), queued ones
        are refused by whoever takes them."""
        self.stop_reason = reason
        self.log_event("stop", f"{reason}: running jobs are stopped, queued ones refused")
        for flight in self.flights.all():
            if flight.stop(reason):
                self.count_cut()

    def _stopped_step(self) -> str | None:
        """Why a session step taken now must not run (the drain escalated), counted as cut; else None."""
        if self.stop_reason is None:
            return None
        self.count_cut()
        return f"{self.shutdown.why()}: {self.stop_reason}"

    def stopped_before_start(self, job: _Job) -> Result:
        self.count_cut()
        return refusal(job.id, f"{self.shutdown.why()}: {self.stop_reason}")

    def count_cut(self) -> None:
        with self._cut_lock:
            self._cut += 1

    @property
    def drain_complete(self) -> bool:
        """Every job accepted to run ran to its end: none was stopped or refused by the escalation."""
        with self._cut_lock:
            return self._cut == 0

    # -- observing -------------------------------------------------------------------------------------
    def gauges(self) -> Gauges:
        """The load at this moment; readable from any thread, before the pool is ready too."""
        started = self.ready_info is not None
        return Gauges(busy_workers=sum(worker.busy for worker in self.workers), queued=self.admission.waiting,
                      queue_capacity=self.admission.capacity, in_flight=self.flights.unanswered(),
                      sessions_active=self.sessions.active if started else 0,
                      max_sessions=self.options.max_sessions, draining=self.draining())

    def state(self) -> Literal["starting", "serving", "draining"]:
        if self.draining():
            return "draining"
        return "serving" if self.ready_info is not None else "starting"

    def draining(self) -> bool:
        """The pool has begun to end (its input ended, or a stop signal came): it takes no new work."""
        return self.shutdown.stage is not Stage.SERVING

    # -- intake ------------------------------------------------------------------------------------------
    def handle_line(self, line: bytes | TooLong, arrived_ns: int | None = None) -> None:
        """Answer one input line; whatever goes wrong costs that line a refusal, never the pool. ``arrived_ns``:
        when it was read (its job's wait counts from then), else now."""
        try:
            with self._intake:
                self._arrived_ns = arrived_ns if arrived_ns is not None else time.monotonic_ns()
                self._handle_line(line)
        except Exception as exc:
            _log.exception("the pool failed while reading a request")
            request_id = None
            try:
                parsed = parse_line(line) if isinstance(line, bytes) else None
                request_id = parsed.id if isinstance(parsed, Request) else None
            except LineError:
                pass
            self._refuse(request_id, f"the pool failed while reading this request ({type(exc).__name__}); "
                                     "nothing ran")

    def handle_request(self, message: Request, arrived_ns: int) -> None:
        """Answer one request a listening pool's connection already parsed from its line (then renamed with its
        tag, which makes it longer than the line was: parsed again, a line just under the limit, or an id of
        quotes, would be refused for a size the client never sent). As :meth:`handle_line` otherwise."""
        try:
            with self._intake:
                self._arrived_ns = arrived_ns
                self._handle_message(message)
        except Exception as exc:
            _log.exception("the pool failed while reading a request")
            self._refuse(message.id, f"the pool failed while reading this request ({type(exc).__name__}); "
                                     "nothing ran")

    def _handle_line(self, line: bytes | TooLong) -> None:
        """Route one line to the module that decides it; what it answers leaves through finish or output."""
        if isinstance(line, TooLong):  # intake: a reply fails its call, a request is refused
            request_id, why = too_long(line, self.calls.fail)
            self._refuse(request_id, why)
            return
        try:
            message = parse_line(line)
        except LineError as exc:
            self._refuse(exc.request_id, str(exc))
            return
        self._handle_message(message)

    def _handle_message(self, message: Request | Reply) -> None:
        if isinstance(message, Reply):  # the host's answer to a job's call
            if (problem := self.calls.answer(message.reply)) is not None:
                self._refuse(None, problem)
            return
        if message.stats:
            self.output.write(encode(self.stats.snapshot(message.id, self.gauges())))
            return
        if message.cancel is not None:
            self._cancel(message.id, message.cancel)
            return
        if not message.close and not message.file_request():  # answered by a result, through finish
            # A label is the config's name, never a client's text: a profile the config lacks (refused) is none.
            known = message.profile if message.profile in self.options.config.profiles else None
            # Whether it asks to open a session: read for a session's request only (a job opens none).
            self.labels.arrived(message.id, self.tenant_of(message.id), known, message.session,
                                opens=message.session is not None and bool(message.open or message.grant_fields()))
            if self.spans is not None:
                self.spans.arrived(message.id, message.traceparent, self._arrived_ns)
        try:
            self.traces.arrived(message)
            draining = self.shutdown.why() if self.shutdown.refusing() else None
            if message.session is not None:  # a session's step, save, restore, files or close
                self.session_requests.take(message, self._arrived_ns, draining)
            elif draining is not None:
                self._refuse(message.id, draining)
            else:  # a job: resolved, then admitted
                self.admission.enter(self.resolver.job(message, self._arrived_ns))
        except RequestError as exc:
            self._refuse(message.id, str(exc), session=message.session)

    def _cancel(self, request_id: RequestId, target: RequestId) -> None:
        answer = encode(CancelAnswer(id=request_id, cancelled=target))
        try:
            self.flights.cancel(target, lambda: self.output.write(answer), shown=self.own_names(target)[0])
        except RequestError as exc:
            self._refuse(request_id, str(exc))

    def _finish_job(self, result: Result) -> None:
        self.finish(result, session=None, step=None)

    def _cancelled_while_queued(self, job: _Job) -> Result:
        message = "the client cancelled the job before it started"
        outcome = Outcome(exit=CANCELLED_EXIT, error=ErrorInfo(type="CancelledError", message=message))
        ready = self.ready
        return to_result(job.id, outcome, job.spec, max_output=job.max_output, python=ready.python,
                         preloaded=ready.preloaded, landlock_abi=ready.landlock_abi, mode="pool",
                         queue_us=(time.monotonic_ns() - job.accepted_ns) // 1000)

    def _refuse(self, request_id: str | int | float | None, message: str, *, session: str | None = None) -> None:
        if session is None:
            self.finish(refusal(request_id, message), session=None, step=None)
            return
        self.finish(self.session_requests.refusal(request_id, message, session), session=session, step=None)


def _unwritable(result: Result, exc: Exception) -> Result:
    """What answers a request whose result the pool failed to make or encode: its id (its session and step), and
    why, in words of ours only (the result's own fields are what could not be written)."""
    error = ErrorInfo(type="PoolWorkerError", message=f"the pool could not write this request's result "
                                                      f"({type(exc).__name__})")
    if isinstance(result, SessionResult):
        return SessionResult(id=result.id, exit=WORKER_ERROR_EXIT, error=error, session=result.session,
                             step=result.step, session_ended=result.session_ended)
    return Result(id=result.id, exit=WORKER_ERROR_EXIT, error=error)


def death_cause(template: Template) -> str:
    """Why a template is being replaced, from what the pool itself knows (its wait status, its own verdict)."""
    try:  # a template that just died may not be reaped yet: the pool saw its socket close first
        status: int | None = template.process.wait(timeout=0.2)
    except subprocess.TimeoutExpired:
        status = None
    if status is None:
        return "was found broken by the pool (it failed while serving a job, or misbehaved) and is stopped"
    process = template.process
    usage = ""
    if isinstance(process, ForkedProcess):  # its zygote reported its end, or died before it could
        if process.returncode is None:
            return "ended after the zygote it was forked from: its status went with the zygote"
        usage = f" ({described})" if (described := process.describe_end()) is not None else ""
    if status < 0:
        try:
            return f"was killed by {signal.Signals(-status).name}{usage}"
        except ValueError:
            return f"was killed by signal {-status}{usage}"
    return f"exited with status {status}{usage}"


def _write_log(line: bytes) -> None:
    sys.stderr.buffer.write(line)
    sys.stderr.buffer.flush()


# Stop signals: waited for on a thread of their own (see _watch_signals), blocked everywhere else, so that
# no handler ever runs in the middle of intake, holding its lock.
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_SIGNALS = (*_STOP_SIGNALS, signal.SIGHUP)


def _watch_signals(server: Server) -> None:
    while True:
        signum = signal.sigwaitinfo(_SIGNALS).si_signo
        name = signal.Signals(signum).name
        if signum == signal.SIGHUP:
            # A terminal's hangup or `systemctl reload`: the pool does not reload its config (a running
            # pool's grants and limits stay what its jobs were accepted under). Restart it to apply a change.
            server.log_event("signal", "SIGHUP ignored: the pool does not reload its config; restart it to "
                                       "apply a change")
            continue
        stage = server.shutdown.stage
        server.log_event("signal", f"{name} received while {stage.value}")
        server.shutdown.signalled(name)


# The pool's exit status when its drain was cut short (the deadline, or a second signal): a job was stopped
# or refused after it was accepted (EX_TEMPFAIL: run it again elsewhere).
DRAIN_CUT_EXIT = 75


def serve(args: argparse.Namespace) -> int:
    """Run the pool until stdin ends or a stop signal; returns the process exit status."""
    if os.getpid() == 1:  # a container's entrypoint: be its init, and run the pool below (see init.py)
        return serve_as_init(lambda: _serve(args))
    return _serve(args)


def _serve(args: argparse.Namespace) -> int:
    # Before any thread starts, so that every thread inherits the mask and only the watcher takes them.
    signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)
    stdin_fd, stdout = stdio()
    output = Output(stdout)
    json_log = getattr(args, "log", None) == "json"
    if json_log:
        log_records_as_json(_write_log)
    metrics: MetricsSocket | None = None
    listener: Listener | None = None
    try:
        options = pool_options(args)
        # Listening: many connections instead of stdin/stdout, a layer around this server (see listen.py).
        router = Router(output) if options.listen is not None else None
        server = Server(options, router or output, _write_log)
        server.log_event("start", f"pynox {__version__} starting {options.workers} workers")
        if options.metrics_socket is not None:
            # Bound before any template starts: a probe sees "starting", and a path in use stops the pool now.
            metrics = MetricsSocket(options.metrics_socket, lambda: server.stats.snapshot(None, server.gauges()),
                                    server.state, server.labels.snapshot)
        if options.listen is not None:  # bound before any template starts, as the metrics socket is
            listener = Listener(options.listen, Tenants(options.config.tenants))
        for warning in options.config.warnings:
            server.log_event("config_warning", warning)
        workers = server.start()
        assert server.ready_info is not None
        for missing in server.ready_info.bounds_not_in_force:  # never loosened silently
            server.log_event("bound_not_in_force", f"per-job bound not in force: {missing}")
    except (PynoxError, OSError) as exc:
        if metrics is not None:
            metrics.close()
        if listener is not None:
            listener.close()
        kind = type(exc).__name__
        output.write(encode(StartErrorEvent(error=StartError(type=kind, message=str(exc)))))
        if json_log:
            _write_log(encode(PoolLogEvent(ts_ms=int(time.time() * 1000), event="start_error",
                                           message=f"{kind}: {exc}")))
        else:
            print(f"pynox pool: {kind}: {exc}", file=sys.stderr)
        return 1 if not isinstance(exc, KernelSupportError) else 125
    server.log_event("ready", f"ready with {len(workers)} workers")
    # Only now: a signal that came while the templates started waits (blocked) until there is a pool to drain.
    threading.Thread(target=_watch_signals, args=(server,), name="pynox-signals", daemon=True).start()
    if listener is not None and router is not None:
        try:  # until a stop signal's drain is over; stdin is not read
            listener.serve(server, router)
        finally:
            listener.close()
    else:
        # The client died: nobody reads our results. Templates and jobs die with us (parent-death signals).
        watch_for_client_death(stdout.fileno(), lambda: os._exit(1))
        # Intake reads on through a drain: every line it reads is answered, a request as refused.
        reader = LineReader(stdin_fd, server.wake[0], server.drained.is_set)
        try:
            for line in reader:
                server.handle_line(line, reader.read_ns)
            if not server.drained.is_set():  # EOF: no reply to a host call can be read from here on
                server.calls.close("the host cannot answer: the pool's input has ended")
                server.shutdown.input_ended()
                server.drained.wait()
            # Lines already written when the drain ended are answered too (refused), not left unread.
            for line in reader.rest():
                server.handle_line(line)
        except BrokenPipeError:
            os._exit(1)
    server.calls.close("the pool has stopped")
    server.scratch.close()
    if server.spans is not None:
        server.spans.close()
    if metrics is not None:
        metrics.close()
    status = 0 if server.drain_complete else DRAIN_CUT_EXIT
    server.log_event("exit", f"exit {status}: " + ("every accepted job ran to its end" if status == 0 else
                                                   "stopped before every accepted job ran to its end"), status=status)
    return status
