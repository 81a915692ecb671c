"""The server's handle on one template process: start it, serve a job through it, enforce the deadline.

A :class:`Template` serves one job at a time; the job's process goes through
the states of :mod:`.lifecycle`. While it runs, one select loop reads its
output (:mod:`.capture`), relays its host calls, answers its delegated
metadata calls (:mod:`.metadata`) and enforces its deadline, from outside the
sandbox, by SIGKILL through the pidfd the template handed over: no pid reuse
race, and the job cannot ignore it.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec

import pynox

from .. import hints
from ..config import PoolSettings, landlock_abi_from_environment, native_from_environment
from ..errors import KernelSupportError, PoolWorkerError, RequestError
from ..hosts import AllowList, parse_hosts, resolve
from ..policy import cgroups
from ..policy.grants import close_all, identity, open_grants, refuse_kernel_filesystems
from ..policy.runtime import rule_paths, runtime_watch
from ..wire.descriptors import (
    CHANNEL,
    CLAIM,
    CONTROL,
    DISPLAY,
    METADATA,
    PAYLOAD,
    REPORT,
    STDERR,
    STDOUT,
    handed_to_prepared,
    sent_with_job,
)
from ..wire.frames import (
    Adopt,
    Discard,
    Ended,
    Fork,
    HandOver,
    Init,
    NotForked,
    Prepare,
    Prepared,
    Ready,
    Started,
    TemplateFailed,
    Unprepared,
    recv_frame,
    send_frame,
)
from ..wire.payload import new_claim, new_payload, take_back, write_payload
from ..wire.spec import Confinement, JobSpec
from .capture import Capture, SessionStream
from .figures import matplotlib_setup
from .fork_gate import ForkWindow
from .hostcalls import JobCalls, Outbox, ProtocolViolation
from .lifecycle import ChildLife, ChildState
from .outcome import Gathering
from .prepared import Key, PreparedChild, PreparedChildren
from .report import JobWord, read_report
from .serving import ServingLife
from .steward import StewardLife, StewardPhase, StewardThread
from .streaming import Streamer
from .usage import StatusKept, proc_text
from .waiting import readable
from .zygote import ForkedProcess

__all__ = ["SessionChannels", "Template", "template_environment"]

_log = logging.getLogger(__name__)

_READ_CHUNK = 1 << 16
# After SIGKILL the kernel tears the process down; a template that does not report by then is broken.
_KILL_GRACE = 5.0
_GRACE_NS = int(_KILL_GRACE * 1e9)
_STEWARD_LETS_GO = 5.0  # seconds for a delegated call being answered to finish (each has a bounded cost)
_RESOLVE_WITHIN = 5.0  # seconds for the names of a job's allow_hosts, all together (pynox.hosts.resolve)
_START_TIMEOUT = 300.0  # preloading pandas on a cold disk takes seconds, not minutes
# How long a result waits for the template's word on a job that exited on its own before it could be
# measured (its peak memory is in the template's wait4): the template is reaping it as the result is due.
_END_WAIT = 0.25
_CONTINUE_EVERY = 10_000_000  # ns between two SIGCONTs to a child whose exit status is awaited
# Hardware tuning the host may need for BLAS on this processor (see the env notes); not secrets.
_PASSTHROUGH = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
CallSink = Callable[[Outbox], JobCalls]
Handler = Callable[["_Serving"], None]


def _close_unsent(pipes: list[tuple[int, int]], claim: int, outbox: Outbox | None) -> None:
    """What the pool made for a job that never left: its pipes' read ends (their write ends are closed by the
    caller's ``finally``, once), its claim, and its host channel's outbox (None: a session's, which outlives it)."""
    for r, _ in pipes:
        os.close(r)
    if outbox is not None:
        outbox.close()
    os.close(claim)


def _close_quietly(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


_PF_EXITING = 0x4  # a task's flags, field 9 of /proc/<pid>/stat
_SIGKILL_PENDING = 1 << (signal.SIGKILL - 1)  # in the pending signals of field 31


def _dying(pid: int) -> bool:
    """Whether a process is gone or on its way out: SIGKILL pending, exiting, or a zombie."""
    try:
        return _dying_by(proc_text(f"/proc/{pid}/stat"))
    except OSError:
        return True


def _open_stat(pid: int) -> int:
    """A process's /proc/<pid>/stat, kept open to be read again (see _dying_at); -1 if it is gone."""
    try:
        return os.open(f"/proc/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return -1


def _dying_at(stat: int) -> bool:
    """:func:`_dying`, from the process's /proc/<pid>/stat kept open (:func:`_open_stat`): one read, where an
    open, a read and a close were. It names the process it was opened for: once that one is reaped, it reads
    ESRCH, whatever process has its pid since."""
    try:
        return _dying_by(os.pread(stat, 4096, 0))
    except OSError:
        return True


def _dying_by(stat: bytes) -> bool:
    try:
        fields = stat.rpartition(b")")[2].split()
        state, flags, pending = fields[0], int(fields[6]), int(fields[28])
    except (ValueError, IndexError):
        return True
    return state in (b"Z", b"X") or bool(flags & _PF_EXITING) or bool(pending & _SIGKILL_PENDING)


def _dying_by_status(status: bytes | None) -> bool:
    """:func:`_dying_by`, from /proc/<pid>/status (kept open for the job's end, see StatusKept.text): gone, a
    zombie (State Z or X), SIGKILL pending (SigPnd or ShdPnd), or its memory released (no VmHWM: an exiting
    process detaches its memory first, then spends the milliseconds of its teardown). What the flags of
    /proc/<pid>/stat said besides (PF_EXITING) is only the few microseconds before that detach."""
    if status is None:
        return True
    try:
        at = status.index(b"\nState:\t") + 8
        if status[at:at + 1] in (b"Z", b"X"):
            return True
        for field in (b"\nSigPnd:\t", b"\nShdPnd:\t"):
            at = status.index(field) + len(field)
            if int(status[at:status.index(b"\n", at)], 16) & _SIGKILL_PENDING:
                return True
    except ValueError:
        return True
    return b"\nVmHWM:" not in status


# A job's own descriptors: its payload's memfd (empty until the job comes), its claim, and its 4 pipes (stdout,
# stderr, report, display; read end, write end).
_Descriptors = tuple[int, int, list[tuple[int, int]]]


def _job_descriptors() -> _Descriptors:
    """A job's descriptors, made: 8 system calls, which a worker makes after a result has left for the next
    job (see Template.after_result), off its path."""
    made = [new_payload()]
    try:
        made.append(new_claim())
        for _ in range(4):
            made += os.pipe2(os.O_CLOEXEC)
            # The pool's end never blocks: a job may hold a read end of its own output (/proc/self/fd/1 opened
            # is either end of the pipe) and empty it before the pool reads, its write end kept open; a read
            # that blocked then stopped the worker's loop, deadline included, for good (see Capture.read).
            os.set_blocking(made[-2], False)
    except BaseException:
        close_all(made)
        raise
    return made[0], made[1], [(made[i], made[i + 1]) for i in range(2, 10, 2)]


def _close_descriptors(made: _Descriptors) -> None:
    payload, claim, pipes = made
    close_all([payload, claim, *(end for pipe in pipes for end in pipe)])


def _key(confinement: Confinement, granted: list[int]) -> Key | None:
    """What a prepared child must have been confined with to take this job: the same confinement, grants
    naming the same files, the same working directory (a child prepared in it keeps it, even renamed). The
    pool's package directories, as every runtime path, are not in it: a replaced one is seen by the runtime's
    watch (see _runtime_unchanged). None if the working directory is gone: the job's own child will say so."""
    try:
        cwd = os.stat(confinement.cwd)
    except OSError:
        return None
    return msgspec.json.encode(confinement), (*identity(granted), (cwd.st_dev, cwd.st_ino))


def _confinement(spec: JobSpec) -> Confinement:
    """What a child for ``spec`` is confined with: its threads bounded where the pids cgroup bounds them."""
    confinement = spec.confinement
    if cgroups.available().pids is not None:  # its template's pids cgroup bounds its threads
        confinement = msgspec.structs.replace(confinement, max_tasks=cgroups.MAX_JOB_TASKS)
    return confinement


def _explain_refused_connect(outcome: Gathering, spec: JobSpec, hosts: AllowList) -> None:
    """A job that failed on a connect the pool refused is told which entry would have allowed it: only the
    pool knows the address (the job's error says only "Operation not permitted"). Only for an error the job's
    own report took for a socket's (its hint says so), after a refusal in this job or step."""
    error = outcome.error
    if not hosts.refused or error is None or error.type != "PermissionError" \
            or not (error.hint or "").startswith(hints.HOSTS_HINT_START):
        return
    address, port = hosts.refused[-1]
    shown = f"[{address}]:{port}" if ":" in address else f"{address}:{port}"
    hint = hints.hosts_hint(shown, hosts.entry_for(address, port), spec.payload.allow_hosts,
                            spec.confinement.hint_style)
    outcome.error = msgspec.structs.replace(error, hint=hint)


def _job_ids(confinement: Confinement) -> tuple[int, int]:
    """The uid and gid the job runs as (see policy.confine): the operator's, or the pool's own."""
    if confinement.uid is None:
        return _own_ids()
    return confinement.uid, confinement.gid if confinement.gid is not None else confinement.uid


@functools.cache
def _own_ids() -> tuple[int, int]:
    """The pool's effective uid and gid, asked once (the pool never changes them): two system calls a job fewer."""
    return os.geteuid(), os.getegid()


@functools.cache
def _matplotlib() -> tuple[dict[str, str], str] | None:
    """matplotlib's setup for every job of this pool (see figures.py): prepared once per pool process."""
    return matplotlib_setup()


def template_environment() -> dict[str, str]:
    """The template's whole environment: a minimal base, BLAS pinned to one thread, nothing of the host's."""
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
    # Preloaded numpy must not start a thread pool: a template has to stay single-threaded to fork.
    for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS",
                 "VECLIB_MAXIMUM_THREADS", "BLIS_NUM_THREADS"):
        env[name] = "1"
    env.update({name: os.environ[name] for name in _PASSTHROUGH if name in os.environ})
    return env


@dataclass
class SessionChannels:
    """The pool's and the child's ends of a session's control and host-call channels, the outbox of the
    host-call channel, and the pool's ends of its stdout, stderr and report pipes, which its steps share."""

    control: socket.socket
    job_control: socket.socket
    job_channel: socket.socket | None
    outbox: Outbox | None  # the pool's end of the host-call channel, in the outbox that owns it
    # The read ends of the session's stdout, stderr and report pipes, kept for its life (non-blocking): its first
    # step's (Template.run), or, for a fork's copy, those its fork step made (make_outputs). None until then.
    outputs: list[int] | None = None
    stream: SessionStream = field(default_factory=SessionStream)

    @classmethod
    def create(cls, with_functions: bool) -> SessionChannels:
        control, job_control = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        channel, job_channel = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM) if with_functions else (None, None)
        return cls(control, job_control, job_channel, Outbox(channel) if channel is not None else None)

    def make_outputs(self) -> list[int]:
        """New stdout, stderr and report pipes (a fork's copy's own; a session's whose step closed every copy of
        one): the read ends kept here, in place of any before, the write ends returned (for the step's frame; the
        caller closes them once sent)."""
        if self.outputs is not None:
            close_all(self.outputs)
            self.outputs = None
        self.stream = SessionStream()
        made: list[int] = []
        try:
            for _ in range(3):
                made += os.pipe2(os.O_CLOEXEC)
                os.set_blocking(made[-2], False)  # the pool's end never blocks (see _job_descriptors)
        except BaseException:
            close_all(made)
            raise
        self.outputs = made[0::2]
        return made[1::2]

    def close(self) -> None:
        if self.outbox is not None:
            self.outbox.close()  # never waits: a frozen child reads nothing
        for sock in (self.control, self.job_control, self.job_channel):
            if sock is not None:
                sock.close()
        outputs, self.outputs = self.outputs, None
        if outputs is not None:  # what a thread of the session wrote after its last step is dropped with it
            close_all(outputs)


class _Watched:
    """The descriptors one job's loop watches, each with its handler: ``select.poll`` and a dict (a selector's
    keys cost a lookup and a tuple for each registration and each event, on every job's path). Any event on a
    descriptor, its hang-up included, calls its handler."""

    __slots__ = ("_poll", "events", "handlers")

    def __init__(self) -> None:
        self._poll = select.poll()
        self.handlers: dict[int, Handler] = {}
        self.events: dict[int, int] = {}  # what the last wait saw on each descriptor ready then

    def register(self, target: int | socket.socket, events: int, handler: Handler) -> None:
        fd = target if isinstance(target, int) else target.fileno()
        self._poll.register(fd, events)
        self.handlers[fd] = handler

    def modify(self, target: socket.socket, events: int) -> None:
        self._poll.modify(target.fileno(), events)

    def unregister(self, target: int | socket.socket) -> None:
        fd = target if isinstance(target, int) else target.fileno()
        self._poll.unregister(fd)
        del self.handlers[fd]

    def wait(self, wait_ns: int) -> list[Handler]:
        """The handlers of the descriptors ready within ``wait_ns`` (rounded up to a millisecond)."""
        handlers = self.handlers
        ready = self._poll.poll(-(-max(wait_ns, 0) // 1_000_000))
        self.events = dict(ready)
        return [handlers[fd] for fd, _ in ready if fd in handlers]


@dataclass
class _Serving:
    """One job (or session step) on its way through :meth:`Template.collect`: what the loop watches, and
    what it has seen so far."""

    sel: _Watched
    capture: Capture
    outcome: Gathering
    job_calls: JobCalls | None
    session: bool
    life: ServingLife  # its deadline, its kills and what they were for (see serving.py)
    max_output: int
    watching_pidfd: bool = False
    # The job's word from its report (see report.py), read once its pipes have closed; None if it wrote none
    # the pool can take.
    word: JobWord | None = None
    word_read: bool = False
    claimed: bool = False  # the pool holds the job's claim (a job, or a session's first step)
    # Whether the job could leave pages in a tmpfs or TCP buffers (a write grant, or a network): only then is
    # the memory cgroup's stat read for them (~70 µs on a job's path).
    holds_in_kernel: bool = False
    # What the loop watches the host-call channel for: POLLIN, with POLLOUT while answers wait for
    # it to take them (see Outbox); 0 once it is no longer watched.
    channel_events: int = 0
    watching_listener: bool = False  # the steward's listener, until the job's first delegated call

    def read_word(self) -> JobWord | None:
        if not self.word_read:
            self.word_read = True
            self.word = read_report(bytes(self.capture.report), value_limit=self.max_output,
                                    image_limit=self.max_output)
        return self.word


class _Family:
    """A session's template process shared with its fork's copies (each a :class:`Template` over a socket of
    its own): the last handle to close stops the process and removes its cgroups."""

    def __init__(self, origin: Template) -> None:
        self.origin = origin  # the handle whose cgroups hold the template process
        self._lock = threading.Lock()
        # Held across a fork of any of its sessions: they share the steward's window (a second armed replaced
        # the first, whose clone was then refused), and a failed one kills the template's unserved children.
        self.forking = threading.Lock()
        self._handles: list[Template] = [origin]

    def join(self, handle: Template) -> None:
        with self._lock:
            self._handles.append(handle)

    def leave(self, handle: Template) -> bool:
        """True for the last handle."""
        with self._lock:
            self._handles = [other for other in self._handles if other is not handle]
            return not self._handles

    def children(self) -> set[int]:
        """The pids of the children its handles serve (the original's, and every copy's adopted)."""
        with self._lock:
            return {handle.child.pid for handle in self._handles if handle.child.pid is not None}


class Template:
    """One warm template process, the socket to it, and the child it is serving."""

    _family: _Family | None = None  # shared with a session fork's copies (see adopt)
    _adopted = False  # a copy's handle: its cgroups are the copy's own
    _stat: int | None = None  # the template's /proc/<pid>/stat, kept open once read (see _hand_to_prepared)
    _status: StatusKept | None = None  # a session's process's /proc/<pid>/status, kept open (see _finish)
    _made: _Descriptors | None = None  # the next job's descriptors, made after the last result left

    def __init__(self, preload: list[str], package_dirs: list[str], *, stderr: int | None = None,
                 landlock_abi: int | None = None, life: ChildLife | None = None,
                 job_cpu: float = PoolSettings.job_cpu, zygote: bool = False,
                 spawn: Callable[[], tuple[ForkedProcess, socket.socket]] | None = None,
                 prepared_children: int = PoolSettings.prepared_children) -> None:
        """``landlock_abi``: the highest ABI its jobs use (None: ``$PYNOX_LANDLOCK_ABI``, else the kernel's).
        ``job_cpu``: the CPUs' worth of time its jobs may use at once (0: no quota; see policy/cgroups.py).
        ``life``: the life of the child serving its jobs, when it outlives this template (a worker's, kept
        across the templates it replaces, so that a cancel of a job on its way is never lost).
        ``zygote``: it forks templates, never a job's child (see zygote.py). ``spawn``: fork this template from
        a zygote (the process and the socket to it) rather than start one by exec. ``prepared_children``: how
        many children it keeps confined ahead of the next job (see prepared.py); 0: none."""
        if landlock_abi is None:
            landlock_abi = landlock_abi_from_environment()
        native = native_from_environment()
        self.process: subprocess.Popen[bytes] | ForkedProcess
        if spawn is not None:
            self.process, parent = spawn()
        else:
            self.process, parent = self._start(stderr)
        self.sock = parent
        # The socket's poller for the reads between jobs (_settle, read_prepared: the thread serving the template),
        # made once where each look made one and registered the socket anew.
        self._between = select.poll()
        self._between.register(parent.fileno(), select.POLLIN)
        self.broken = False
        self.cgroups: cgroups.TemplateGroup | None = None
        self._job_cpu = job_cpu
        self._budget_hits = 0  # its tenant's budget hits when the job or step began (see TenantGroup)
        self.child = life if life is not None else ChildLife()
        # The child's delegated metadata calls (see steward.py): from the socket its listener arrives on,
        # with the job's write grants and its uid and gid, to the steward answering them.
        self._steward: StewardLife | None = None
        # Answers them off this worker thread, which enforces the deadline (see steward.py).
        self._steward_thread: StewardThread | None = None
        # The children the template confines ahead of the next job (see prepared.py), and the serial of
        # the child serving the current job, whose Ended frame is its own.
        self.prepared = PreparedChildren(prepared_children)
        self._due_by = 0.0  # when the template's announced children must have arrived (see preparing)
        self._child_serial: int | None = None
        # A job handed to a prepared child that died before it claimed the job ran nowhere: its worker sends it
        # again, and this template forks it a child of its own (see run).
        self._fork_next = False
        bounds = cgroups.available()
        try:
            if bounds.hierarchies():  # before the template can fork anything: every job it forks is bounded
                self.cgroups = cgroups.TemplateGroup.confine(bounds, self.process.pid, f"template-{self.process.pid}",
                                                             job_cpu)
        except OSError as exc:
            self.close()
            raise PoolWorkerError(f"could not put the template in its cgroups: {exc}") from None
        try:
            figures = _matplotlib()
            send_frame(parent, Init(preload=preload, package_dirs=package_dirs,
                                    job_env=figures[0] if figures else {}, data_dirs=[figures[1]] if figures else [],
                                    landlock_abi=landlock_abi, zygote=zygote, native=native,
                                    prepared=prepared_children))
            parent.settimeout(_START_TIMEOUT)
            frame, _ = recv_frame(parent)
            parent.settimeout(None)
        except (OSError, EOFError, ValueError, msgspec.DecodeError) as exc:
            self.close()
            raise PoolWorkerError(f"the template did not start: {exc}", transient=True) from None
        if isinstance(frame, TemplateFailed):
            self.close()
            raise (KernelSupportError if frame.kind == "kernel" else PoolWorkerError)(frame.message)
        if not isinstance(frame, Ready):
            self.close()
            raise PoolWorkerError(f"the template sent {type(frame).__name__} instead of Ready")
        self.ready: Ready = frame
        # Whether a file of its runtime's rules may name another file now than when its children waiting were
        # confined (see run): the pool's one watch, and how many changes it had counted when they were.
        self._runtime = runtime_watch(rule_paths(frame.read_paths))
        self._runtime_seen = self._runtime.changes()
        # The generation of the template's rules its last child was forked under (it starts at 0), and how many
        # times it moved: each move counts as a change of the runtime (see _rules_seen).
        self._rules = self._rules_moved = 0
        try:
            self._settle_memory()  # what it holds with its preloads: none of it counts against a job
        except PoolWorkerError:
            self.close()
            raise

    @staticmethod
    def _start(stderr: int | None) -> tuple[subprocess.Popen[bytes], socket.socket]:
        """A template started by exec, and the socket to it."""
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        # -I: no PYTHON* variables, no user site, no current directory on sys.path.
        source_root = os.path.dirname(os.path.dirname(os.path.abspath(pynox.__file__)))
        # typing_extensions, when msgspec finds it, patches the standard typing module, and every job would
        # inherit the patch: hidden while pynox loads (msgspec then uses typing's own), importable again after.
        bootstrap = (f"import sys; sys.path.insert(0, {source_root!r}); sys.modules['typing_extensions'] = None; "
                     "from pynox.template.fork_server import main; del sys.modules['typing_extensions']; main()")
        try:
            process = subprocess.Popen(
                [sys.executable, "-I", "-c", bootstrap, str(child.fileno()), str(os.getpid())],
                env=template_environment(), pass_fds=[child.fileno()], stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=stderr, cwd="/",
            )
        except BaseException:
            parent.close()
            raise
        finally:
            child.close()
        return process, parent

    @property
    def pid(self) -> int:
        return self.process.pid

    @classmethod
    def adopt(cls, original: Template, pid: int, steward: StewardLife, memory: int) -> Template:
        """A handle on a session fork's copy, process ``pid`` (checked stopped, a child of ``original``'s
        template): put in cgroups of its own with ``memory`` as its limit, adopted by the template (an Adopt
        frame with a socket of the copy's own, on which the template reports it), its delegated calls answered by
        ``steward``. The template process is shared: it stops with the last of its handles."""
        copy = cls.__new__(cls)
        copy.process, copy.ready, copy.broken = original.process, original.ready, False
        copy._adopted, copy.cgroups, copy._job_cpu, copy._budget_hits = True, None, original._job_cpu, 0
        copy.child, copy._steward, copy._steward_thread = ChildLife(), steward, None
        copy.prepared, copy._due_by = PreparedChildren(0), 0.0
        copy._child_serial = None
        if original._family is None:
            original._family = _Family(original)
        copy._family = original._family
        copy._family.join(copy)
        copy.sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        copy._between = select.poll()
        copy._between.register(copy.sock.fileno(), select.POLLIN)
        try:
            bounds = cgroups.available()
            if bounds.hierarchies():
                tenant = original.cgroups.tenant if original.cgroups is not None else None
                copy.cgroups = cgroups.TemplateGroup.confine(bounds, pid, f"fork-{pid}", original._job_cpu, tenant)
                if copy.cgroups.memory is not None:
                    copy.cgroups.memory.settle()  # pages it shares stay the original's: it starts from none
                    copy.cgroups.memory.start(memory)
            send_frame(original.sock, Adopt(pid=pid), [theirs.fileno()])
            theirs.close()
            copy.child.take()
            copy.child.sent()
            copy.sock.settimeout(_KILL_GRACE)
            frame, fds = recv_frame(copy.sock)
            copy.sock.settimeout(None)
            if not isinstance(frame, Started) or len(fds) != 1 or frame.pid != pid:
                close_all(fds)
                raise PoolWorkerError(f"the template did not adopt the copy (it sent {type(frame).__name__})")
            copy._child_serial = frame.serial
            copy.child.started(fds[0], pid)
        except (OSError, EOFError, ValueError, msgspec.DecodeError, PoolWorkerError) as exc:
            theirs.close()
            copy.close()
            raise PoolWorkerError(f"the session's template did not adopt its fork's copy ({exc})") from None
        return copy

    def close(self) -> None:
        """Stop the template: closing its socket ends it; a stuck one is killed. A handle shared with a
        session fork's copies (see adopt) ends its own child only, and the last one the process."""
        self.sock.close()
        self._between = select.poll()  # its number may be another descriptor's from now on
        last = self._family is None or self._family.leave(self)
        if last:
            try:
                self.process.wait(timeout=2)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        # A session's child is served until the session closes, and a broken template may leave its job's
        # pidfd behind: either way it is the pool's descriptor, and closing the template must release it.
        with contextlib.suppress(PoolWorkerError):
            self._close_metadata()
        if self._steward_thread is not None:
            self._steward_thread.close(_STEWARD_LETS_GO)
            self._steward_thread = None
        self.child.abandon()
        self.prepared.close()
        if self._stat is not None and self._stat >= 0:
            os.close(self._stat)
        self._stat = None
        if self._status is not None:
            self._status.close()
            self._status = None
        if self._made is not None:
            _close_descriptors(self._made)
            self._made = None
        if self.cgroups is not None and (last or self._adopted):
            # Its children die with it (parent-death signal); what is still exiting is removed at exit.
            self.cgroups.close(wait=0.5)
            self.cgroups = None
        origin = self._family.origin if self._family is not None else None
        if last and origin is not None and origin.cgroups is not None:  # the template's, kept until now
            origin.cgroups.close(wait=0.5)
            origin.cgroups = None

    def run(self, spec: JobSpec, *, max_output: int, calls: CallSink | None = None,
            session: SessionChannels | None = None, streamer: Streamer | None = None,
            tenant: cgroups.TenantGroup | None = None) -> Gathering:
        """Run one job (or a session's first step) to its end: what the pool gathered of it (see collect); with
        ``tenant``, in that tenant's cgroups.

        Raises :class:`PoolWorkerError` (and marks itself broken) if the template fails, and
        :class:`RequestError` (nothing ran) if a granted path changed since the job was resolved. With
        ``session``, the call returns when the first step is over and the child stays alive for the next ones.

        A job handed to a child prepared ahead that dies before it claims the job (killed from outside, even
        after any look at /proc could see it: see _hand_to_prepared) never began: ``PoolWorkerError`` with
        ``started=False``, which its worker retries once, on a child this template then forks for it; a
        session's first step likewise, which its session sends again with channels made anew.
        """
        self._settle()
        self._enter(tenant)
        if spec.payload.functions and session is not None and session.job_channel is None:
            raise PoolWorkerError("a session with host functions has no channel for them", started=False)
        if self.child.state is ChildState.IDLE:  # nobody took it ahead (a session's first step, pynox run, check)
            self.child.take()
        hosts = None
        if spec.confinement.network == "hosts":
            # Each listed name is resolved once, now, by the pool; the job is told these addresses and may
            # connect to these only (see pynox.hosts). Before the job's clock starts: it has no say in this.
            entries = parse_hosts(spec.payload.allow_hosts)
            pinned = resolve(entries, min(_RESOLVE_WITHIN, spec.confinement.timeout))
            spec = msgspec.structs.replace(spec, payload=msgspec.structs.replace(spec.payload, pinned=pinned))
            hosts = AllowList(entries, pinned)
        confinement = _confinement(spec)
        # The grants bind now, when the job starts (RequestError if a path changed since it was resolved).
        granted = open_grants([*confinement.allow_read, *confinement.allow_write])
        reads, writes = granted[:len(confinement.allow_read)], granted[len(confinement.allow_read):]
        try:
            refuse_kernel_filesystems(confinement.allow_write, writes)  # as they are now, not when accepted
        except BaseException:
            close_all(granted)
            raise
        try:
            made, self._made = self._made, None
            payload, claim, pipes = made if made is not None else _job_descriptors()
        except BaseException:
            close_all(granted)
            raise
        try:
            write_payload(payload, spec.payload)
        except BaseException:
            close_all([*granted, payload, claim, *(end for pipe in pipes for end in pipe)])
            raise
        extra: list[socket.socket] = []
        own = {STDOUT: pipes[0][1], STDERR: pipes[1][1], REPORT: pipes[2][1], DISPLAY: pipes[3][1], PAYLOAD: payload,
               CLAIM: claim}
        outbox = session.outbox if session is not None else None
        if spec.payload.functions:
            job_end: socket.socket | None
            if session is None:
                channel, job_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
                outbox = Outbox(channel)
            else:
                job_end = session.job_channel
            assert job_end is not None  # checked above, before anything was opened
            extra.append(job_end)
            own[CHANNEL] = job_end.fileno()
        if session is not None:
            extra.append(session.job_control)
            own[CONTROL] = session.job_control.fileno()
        # A session's first step may be handed to the child prepared ahead for it (see prepare_session).
        key = _key(confinement, granted) if session is None or self.prepared.waiting else None
        start = time.monotonic_ns()
        if not self.child.sent():  # cancelled while it was on its way: it never reaches a process
            for fd in [*writes, claim, *(end for pipe in pipes for end in pipe)]:
                os.close(fd)
            if outbox is not None and session is None:
                outbox.close()
            for sock in extra:
                sock.close()
            close_all([payload, *reads])
            return Gathering(handed_over=False)
        try:
            # The children that cannot take this job end before its memory is measured from: counted in the
            # template's cgroup at its start and freed during it, they would be room beyond its limit.
            # The job a prepared child died with goes to a child forked for it: none prepared may take it.
            hand, self._fork_next = not self._fork_next, False
            hand = hand and (not self.prepared.waiting or self._runtime_unchanged())
            given_up = self.prepared.give_up_other_keys(key if hand else None)
            if self.prepared.due and not self.prepared.waiting:
                # None is left to take it, so it is forked for, and the template kills every child it prepared,
                # those whose frames are still on their way too: they are taken and given up (unless one can
                # take it after all), so that their pages are gone before the base is measured again below.
                self._read_while(lambda: bool(self.prepared.due), "prepare its next child")
                given_up += self.prepared.give_up_other_keys(key if hand else None)
            for child in given_up:
                self._discard(child)
            if given_up:
                self._await_released()
            if self.cgroups is not None and self.cgroups.memory is not None:
                if given_up:  # the base was measured with their pages, freed now: measured again without
                    self.cgroups.memory.settle()
                self.cgroups.memory.start(confinement.memory)
                self._mark_budget()
            handed = hand and self._hand_to_prepared(key, own, writes, confinement, hosts)
            if not handed:
                if session is not None:
                    self._await_released()
                metadata, job_metadata = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
                extra.append(job_metadata)
                own[METADATA] = job_metadata.fileno()
                # The steward keeps the write grants' descriptors: the files it may change are found from them.
                self._steward = StewardLife(metadata, writes, *_job_ids(confinement), hosts=hosts)
                job = self.prepared.job(key)  # the template prepares the next child from this job's grants
                order = sent_with_job(confinement.host_channel, confinement.session)
                send_frame(self.sock, Fork(job=job, confinement=confinement),
                           [*(own[target] for target in order), *granted])
        except OSError as exc:
            self.broken = True
            self.child.not_sent()
            self._close_metadata()
            _close_unsent(pipes, claim, outbox if session is None else None)
            raise PoolWorkerError(f"the template is gone: {exc}", started=False) from None
        except PoolWorkerError:
            # The template broke before the job left (its word on the children it prepared never came, see
            # _read_while): nothing else will close what was made here for the job.
            _close_unsent(pipes, claim, outbox if session is None else None)
            raise
        finally:
            for _, w in pipes:
                _close_quietly(w)
            for sock in extra:  # the child has its own copies now
                sock.close()
            close_all([payload, *reads])
        if session is not None:  # its stdout, stderr and report are the session's, for its life
            session.outputs = [pipes[0][0], pipes[1][0], pipes[2][0]]
        try:
            try:
                outcome = self.collect([r for r, _ in pipes], spec, spec.confinement.timeout, max_output, start,
                                       calls=calls, outbox=outbox, session=session is not None, claim=claim,
                                       streamer=streamer, stream=session.stream if session is not None else None)
            except PoolWorkerError as exc:
                if exc.started and take_back(claim):  # no child claimed the job: it never began
                    raise PoolWorkerError(str(exc), started=False) from None
                raise
            if handed and self._lost_before_claimed(outcome, claim):
                self._fork_next = True
                if session is not None:
                    # Its channels went to the child that died: the session makes them again and sends its first
                    # step once more (Session._run_step), from a life that is idle: the child's end is read now.
                    self._read_while(lambda: self.child.state is ChildState.RUNNING, "reap a child that died")
                    if self.child.state is ChildState.ENDED:
                        self._close_metadata()
                        self.child.release()
                raise PoolWorkerError("the child prepared for this job died before it began it", started=False)
            return outcome
        finally:
            os.close(claim)

    def _lost_before_claimed(self, outcome: Gathering, claim: int) -> bool:
        """Whether a job handed to a prepared child ended with nothing of it run, and through no verdict on it:
        the child never claimed the job (the pool takes the claim back now, so it never will), and the pool did
        not end it (its deadline, a cancel, a broken protocol) nor the kernel for its memory. Its setup's own
        failure is not this: it was reported, and the claim taken back then (see _take_word)."""
        if outcome.timed_out or outcome.protocol_violation is not None or outcome.memory_exceeded \
                or self.child.cancelled:
            return False
        return take_back(claim)

    def _runtime_unchanged(self) -> bool:
        """Whether no runtime file was replaced (a new inode: renamed over, or a mount) since this template's
        children waiting were confined: they hold its rules as they were then. If one was, the job is forked:
        before the fork the template reopens what changed, and discards every child it prepared before."""
        seen, self._runtime_seen = self._runtime_seen, self._runtime.changes() + self._rules_moved
        return seen == self._runtime_seen

    def _rules_seen(self, generation: int) -> bool:
        """A child of this template was forked under ``generation`` of its rules (Started, Prepared): True if
        they moved since the last child, which then counts as a change of the runtime, so that the next job is
        forked (the template discards every child it prepared before). The template reopened a rule because a
        path named another file when it refreshed them: a change the watch may never count, if it was a mount
        made and gone again before the watch read the mount table (it compares the table's state). A child
        prepared under it holds a rule of a file the path does not name any longer."""
        if generation == self._rules:
            return False
        self._rules = generation
        self._rules_moved += 1
        return True

    def _enter(self, tenant: cgroups.TenantGroup | None) -> None:
        """Serve the next job in ``tenant``'s cgroups (None: the pool's own). A template serves jobs of every
        tenant: between two jobs of different tenants it moves into a cgroup of its own beneath the next one's
        (its pages already charged stay where they are; what its next child allocates is the tenant's), and the
        children it prepared ahead, forked where it was, are given up."""
        current = self.cgroups.tenant if self.cgroups is not None else None
        if current is tenant:
            return
        if self.cgroups is None:  # the pool refuses a tenant budget where no cgroup can be made (never without)
            raise PoolWorkerError(f"the tenant {tenant.name if tenant else ''!r} has a budget, and this template "
                                  "has no cgroup to hold its jobs", started=False)
        try:
            moved = cgroups.TemplateGroup.confine(cgroups.available(), self.process.pid,
                                                  f"template-{self.process.pid}", self._job_cpu, tenant)
        except OSError as exc:
            self.broken = True
            where = f"tenant {tenant.name!r}'s cgroups" if tenant is not None else "the pool's cgroups"
            raise PoolWorkerError(f"could not move the template into {where}: {exc}", started=False) from None
        left, self.cgroups = self.cgroups, moved
        for prepared in self.prepared.forget():
            self._discard(prepared)
        left.close()  # removed if empty (a child given up may still be exiting: removed with the pool's)
        self._settle_memory()

    def _mark_budget(self) -> None:
        tenant = self.cgroups.tenant if self.cgroups is not None else None
        if tenant is not None:
            self._budget_hits = tenant.budget_mark()

    def _hand_to_prepared(self, key: Key | None, own: dict[int, int], writes: list[int],
                          confinement: Confinement, hosts: AllowList | None) -> bool:
        """Give the job to a child prepared ahead whose confinement and grants are the job's, the next one
        if one is dying; children that do not match are discarded. False: the job goes to the template, to
        fork a child of its own."""
        while True:
            prepared, mismatched = self.prepared.take(key)
            for given_up in mismatched:
                self._discard(given_up)
            if prepared is None:
                return False
            # A killed process keeps its sockets open while its memory is torn down (milliseconds): a job handed
            # to a child being killed, or to the child of a template being killed, would begin, then die. To the
            # template instead, it is never read, so it is taken back and retried (see run). This look is only
            # the cheap way round: a kill it cannot see (one landing after it, or one the kernel took off the
            # pending signals before it marks the task exiting, a window a loaded machine widens) leaves the
            # job unclaimed, and run sends it again to a child forked for it.
            # The template's /proc/<pid>/stat is kept open from its first job on (one read a job, not three calls).
            if self._stat is None:
                self._stat = _open_stat(self.process.pid)
            if _dying_at(self._stat):
                self.prepared.release(prepared)
                return False
            # Its status is read through a descriptor kept for the job's end (_finish): an open, two reads and a
            # close for both, where /proc/<pid>/stat and then /proc/<pid>/status took three calls each.
            if self._status is None:
                self._status = StatusKept()
            if _dying_by_status(self._status.text(prepared.pid)):
                self.prepared.release(prepared)  # the template reports its end, and replaces it
                continue
            try:
                send_frame(prepared.control, HandOver(), [own[target] for target in handed_to_prepared(
                    confinement.host_channel, confinement.session)])
            except OSError:  # it died while it waited (killed from outside): the template reports its end
                self.prepared.release(prepared)
                # And should it live (a send refused for another reason), the EOF ends it, as no Discard will.
                prepared.control.close()
                continue
            break
        self._child_serial = prepared.serial
        self.child.started(prepared.pidfd, prepared.pid)
        # Its listener is waiting on the control socket, sent when it was confined: taken now if it is there (a
        # child confined before its job came, as most are), rather than by a turn of the job's loop.
        self._steward = StewardLife(prepared.control, writes, *_job_ids(confinement), hosts=hosts)
        self._steward.take_listener(waiting=False)
        return True

    def prepare_session(self, spec: JobSpec) -> bool:
        """Before this template serves a session: confine a child ahead with ``spec``'s confinement (a session's
        first request's, as resolved), which the session's first step is handed if its own confinement is the
        same and its grants name the same files (as a job is handed a child prepared from the job before).

        False if it cannot be prepared (a granted path is gone now): the session's child is then forked for its
        first step, as before. Raises :class:`PoolWorkerError` (and marks itself broken) if the template fails."""
        confinement = _confinement(spec)
        try:
            granted = open_grants([*confinement.allow_read, *confinement.allow_write])
        except (RequestError, OSError):
            return False
        try:
            key = _key(confinement, granted)
            if key is None:
                return False
            send_frame(self.sock, Prepare(job=self.prepared.job(key), confinement=confinement), granted)
            self.prepared.announced(1)
            self._await_prepared()  # its Prepared frame comes in the time of a fork
            self._await_released()  # the child it replaces, if one waited
        except OSError as exc:
            self.broken = True
            raise PoolWorkerError(f"the template is gone: {exc}", started=False) from None
        finally:
            close_all(granted)  # the template holds its own copies while the child waits
        self._settle_memory()  # as after a job: the child waiting is the template's, not its session's
        return bool(self.prepared.waiting)

    def _await_prepared(self) -> None:
        """A template waiting for the next session: read until the child it was asked to prepare has arrived,
        even while an older one waits (its arrival gives up that one, whose end _await_released then reads)."""
        self._read_while(lambda: bool(self.prepared.due), "prepare the next session's child")

    def _await_released(self) -> None:
        """Read the end of each prepared child given up (discarded, or found dying): before a job's memory is
        measured from, and before a session's child is forked, so that between the session's steps the template
        has nothing left to say but its child's end (see has_word)."""
        self._read_while(lambda: bool(self.prepared.released), "reap a discarded child")

    def _read_while(self, pending: Callable[[], bool], what: str) -> None:
        """Read the template's frames between jobs while ``pending()``, for at most the grace it has to send them;
        past it the template is broken ("the template did not <what> in time")."""
        deadline = time.monotonic() + _KILL_GRACE
        while pending():
            if not readable(self.sock.fileno(), max(deadline - time.monotonic(), 0)):
                self.broken = True
                raise PoolWorkerError(f"the template did not {what} in time", started=False)
            self._receive_between_jobs()

    def _discard(self, prepared: PreparedChild) -> None:
        """Have the template kill a prepared child given up (released), which will get no job (and prepare
        none from it)."""
        try:
            send_frame(self.sock, Discard(serial=prepared.serial))
        except OSError:
            self.broken = True  # the template is gone: the next job finds out and replaces it

    def collect(self, reads: list[int], spec: JobSpec, timeout: float, max_output: int, start: int, *,
                calls: CallSink | None, outbox: Outbox | None, session: bool,
                claim: int | None = None, return_value: bool | None = None,
                streamer: Streamer | None = None, stream: SessionStream | None = None) -> Gathering:
        """Read a job's pipes to EOF (a session step's to its report), relay host calls, enforce the deadline: what
        the pool gathered of it, which its caller freezes into its outcome once it knows whether a cancel killed it.

        ``claim``: the job's claim (see payload.py), for a job or a session's first step; the pool takes the
        job's word on a setup failure only if no child claimed it, since the code runs only after the claim.
        Once the loop is over, nothing here waits on the job (its deadline is no longer watched): a
        session's child is frozen at once, and the teardown of its pipes and host channel only closes
        and drops, whatever the job still reads or writes; a job's child is then killed (_finish)
        unless it has ended. ``return_value``: the step asked for its trailing value (default: the spec's);
        ``streamer``: the request streams, and its events are sent before this returns. ``stream``: a session
        step's, whose stdout, stderr and report pipes are the session's, kept open: the step is over at its
        report (see capture.py)."""
        outcome = Gathering()
        hosts = self._steward.hosts if self._steward is not None else None  # the steward is closed by _finish
        if hosts is not None:
            hosts.refused.clear()  # a session's earlier steps' refusals explain nothing of this one
        capture = Capture(reads, outcome, max_output,
                          return_value=spec.payload.return_value if return_value is None else return_value,
                          streamer=streamer, session=stream)
        job_calls = calls(outbox) if calls is not None and outbox is not None else None
        if session and outbox is not None:
            outbox.resume()  # it was frozen since its last step: its time to read its answers starts now
        try:
            # poll, not epoll: a job watches a handful of descriptors for a few milliseconds, and epoll would
            # cost a create, an add and a remove per descriptor, each a system call, on every job's path.
            serving = _Serving(_Watched(), capture, outcome, job_calls, session,
                               ServingLife(start + int(timeout * 1e9), _GRACE_NS), max_output,
                               claimed=claim is not None,
                               holds_in_kernel=bool(spec.confinement.allow_write)
                               or spec.confinement.network != "none")
            try:
                self._loop(serving)
                capture.drain_display()
            except BaseException:
                if streamer is not None:
                    streamer.finish()
                raise
            if session:
                # Between steps, nothing of the session runs: not a thread its step left behind, not a
                # call it makes. Stopped before it is measured, so its figures are final; continued as
                # its next step is sent (Session._run_step), under that step's deadline. A child that
                # ended or was killed is not signalled (see ChildLife.signal).
                self.child.signal(signal.SIGSTOP)
        finally:
            capture.close()
            if job_calls is not None:
                outcome.host_calls = job_calls.sent
                job_calls.close()
            if outbox is not None and not session:  # a session's channel lives as long as the session
                outbox.close()  # drops what the job did not read, without waiting for it
        outcome.duration_us = (time.monotonic_ns() - start) // 1000
        try:
            self._finish(serving)
        finally:
            if streamer is not None:
                streamer.finish()  # the job is over (or frozen): its events are all out before its result
        self._take_word(outcome, serving.read_word(), claim)
        if hosts is not None:
            # Before the verdict: an error the verdict replaces (a kill, a timeout) is never a connect's.
            _explain_refused_connect(outcome, spec, hosts)
        return outcome

    def ended_while_idle(self) -> Ended | None:
        """Between two steps of a session: how its child ended, if it did meanwhile (killed from outside,
        say). Consumes the template's Ended frame, which is waiting on the socket."""
        if self.child.state is ChildState.RUNNING and self.has_word():
            self._receive()
        return self.child.ended

    def has_word(self) -> bool:
        """Whether the template has said something nobody has read yet (between steps: that the child ended)."""
        return readable(self.sock.fileno(), 0)

    def kill_child(self) -> None:
        self.child.kill()

    def arm_fork(self, window: ForkWindow | None) -> None:
        """The steward of this session's child lets ``window``'s forks through (None: no more)."""
        if window is not None:
            # The fork is a delegated call, answered by the steward's thread, which otherwise starts only at a
            # job's first such call (see _watch_listener): it serves from now on.
            self._start_steward()
        steward = self._steward.steward if self._steward is not None else None
        if steward is None:
            raise PoolWorkerError("the session's delegated calls are not served: it cannot be forked")
        steward.forks = window

    def fork_lock(self) -> threading.Lock:
        """Held across a session fork of this template's family, one at a time (see _Family.forking)."""
        if self._family is None:  # the original alone: no other session of the family can fork meanwhile
            self._family = _Family(self)
        return self._family.forking

    def served(self) -> set[int]:
        """The pids of the template's children its handles serve: this session's, and every copy's of its family
        (a fork's copy is none of them: a pid said by a fork step that names one is not a new copy)."""
        family = self._family.children() if self._family is not None else set()
        if self.child.pid is not None:
            family.add(self.child.pid)
        return family

    def sweep_strays(self) -> None:
        """After a fork that failed before its copy was checked: every child of the template that none of its
        handles serves (a copy that never said its pid, or said another) is killed and reaped."""
        family = self.served()
        try:
            with open(f"/proc/{self.pid}/task/{self.pid}/children") as listing:
                children = {int(word) for word in listing.read().split()}
        except (OSError, ValueError):
            return
        for stray in children - family:
            with contextlib.suppress(OSError):
                os.kill(stray, signal.SIGKILL)  # a child of the template: only it can reap it, so not reused
            self.let_go(stray)

    def let_go(self, pid: int) -> None:
        """A fork's copy the pool gave up (killed): the template adopts it over a socket closed at once, so
        that it reaps it rather than keep it a zombie as long as it serves."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        ours.close()
        try:
            send_frame(self.sock, Adopt(pid=pid), [theirs.fileno()])
        except OSError:
            pass  # the template is gone: the copy went with it
        finally:
            theirs.close()

    def steward_for_copy(self) -> StewardLife:
        """The steward of a fork's copy of this session's child: the same listener, grants and gate."""
        if self._steward is None:
            raise PoolWorkerError("the session's delegated calls are not served: its copy cannot be adopted")
        return self._steward.for_copy()

    def continue_child(self) -> None:
        """A session's next step is being sent: its child, frozen since its last step (see collect), runs
        again, under this step's deadline."""
        if self.cgroups is not None and self.cgroups.memory is not None:
            # Which limit a kill of this step met is counted from here (unread, a kill says its own limit's).
            try:  # not contextlib.suppress: on every step's path, and a try costs nothing unless it raises
                self.cgroups.memory.mark()
                self._mark_budget()
            except OSError:
                pass
        self.child.signal(signal.SIGCONT)

    # -- the loop ------------------------------------------------------------------------------------------
    def _loop(self, serving: _Serving) -> None:
        """Until the job is over: its process ended (or was answered) and its pipes closed; for a session
        step, its report read (the session's pipes stay open), unless the child died or exited meanwhile."""
        sel, capture = serving.sel, serving.capture
        for fd in capture.reads:
            sel.register(fd, select.POLLIN, functools.partial(self._on_pipe, fd))
        if self.child.state is not ChildState.ENDED:
            sel.register(self.sock, select.POLLIN, self._on_template)
        if serving.job_calls is not None:
            serving.channel_events = select.POLLIN
            sel.register(serving.job_calls.channel, select.POLLIN, self._on_host_channel)
            sel.register(serving.job_calls.outbox.wakeup, select.POLLIN, self._on_answers_waiting)
            self._watch_writes(serving)  # a session's answers may wait from its last step
        if self._steward is not None and self._steward.sock is not None:
            sel.register(self._steward.sock, select.POLLIN, self._on_listener)
        try:
            while capture.open or self._needs_end(serving):
                for handler in sel.wait(self._enforce(serving)):
                    handler(serving)
        except BaseException:
            if self.child.alive:
                self.child.kill()
            raise
        # What its kills were for, as its verdict reads them (outcome.py): the table's word, taken once.
        serving.outcome.timed_out, serving.outcome.protocol_violation = serving.life.timed_out, serving.life.violation

    def _enforce(self, serving: _Serving) -> int:
        """The deadline and the kills, checked between two waits; how long (ns) the next wait may be."""
        self._watch_listener(serving)
        life, job_calls = serving.life, serving.job_calls
        now = time.monotonic_ns()
        stall: int | None = None
        if job_calls is not None and not life.violation:
            violation = job_calls.violation or job_calls.outbox.judge(now)
            if violation is not None:
                life.violated(violation)  # it stopped reading its answers
                self.child.kill()
            else:
                stall = job_calls.outbox.stall_deadline()
        if serving.session and not serving.capture.open and not life.violation and \
                self._broken_step_report(serving):
            # A step's process lives on, so no exit status will speak for it: a report the pool cannot take
            # leaves the step without an outcome. The session is ended now, as a broken channel is, rather
            # than kept waiting until its deadline for an end that is not coming.
            life.violated("its session step left no report the pool could take: its code closed or replaced the "
                          "step's report descriptor (3), or wrote over its report")
            self.child.kill()
        if life.due(now):
            life.time_out(now)
            self.child.kill()
        if life.grace_over(now):
            self.broken = True
            raise PoolWorkerError("the template did not reap a killed job in time")
        if life.timed_out and not serving.watching_pidfd and self.child.pidfd is not None:
            serving.sel.register(self.child.pidfd, select.POLLIN, self._on_pidfd)
            serving.watching_pidfd = True
        wait = life.wake() - now
        if stall is not None:
            wait = min(wait, stall - now)
        streamer = serving.capture.streamer
        if streamer is not None:  # waiting output is sent at its time (see streaming.py)
            streamer.tick(now)
            due = streamer.due()
            if due is not None:
                wait = min(wait, due - now)
        if not serving.capture.open and self.child.pidfd is not None:
            # Its pipes are closed and its exit status is needed: a child that stopped itself at its end
            # (job.report.finish) goes on to exit. It may stop only after its pipes closed, so this is said
            # again every few milliseconds until its end arrives; a running child is not disturbed by it.
            self.child.signal(signal.SIGCONT)
            wait = min(wait, _CONTINUE_EVERY)
        return wait

    def _needs_end(self, serving: _Serving) -> bool:
        """After the pipes closed: is the child's end (its exit status) still needed?

        A complete report says how the code ended, so a job's result need not wait for the exit
        teardown (0.5 to 1.5 ms): the child is measured and killed as the result is answered (see
        _finish), so nothing it might still do after its report happens. Only a missing or broken
        report, a kill, a child not yet killable (its pidfd still on its way), or a session step that
        ended its process needs the status the template reports."""
        if self.child.state is ChildState.ENDED or serving.life.dead:
            return False
        if serving.life.condemned:
            return True
        if self.child.pidfd is None:
            # Its pidfd (the template's Started frame) must be read before the result leaves: a job's
            # child is killed through it, and a session's idle check would take the unread frame for
            # its end.
            return True
        word = serving.read_word()
        if word is None:  # no report the pool can take: the kernel's exit status is all there is
            return True
        # A setup failure ends the process (a later step's cannot be taken: _enforce ends the session).
        return word.shape == "setup" or (serving.session and word.ends)

    def _broken_step_report(self, serving: _Serving) -> bool:
        """A step is over (its report read, or its pipes closed), its process still runs, and its report is none the
        pool can take: missing, not the step's, or not of a step's shapes (a setup failure only on a first step,
        whose claim the pool holds)."""
        if self.child.state is ChildState.ENDED or serving.life.dead:
            return False
        word = serving.read_word()
        if word is None and (self.child.pid is None or _dying(self.child.pid)):
            return False  # killed (memory, a signal): its pipes closed as it died, and its end will say how
        return word is None or (word.shape == "setup" and not serving.claimed)

    def _finish(self, serving: _Serving) -> None:
        """The job is over: measure the process, kill it if its result leaves before its end, release it."""
        outcome, child = serving.outcome, self.child
        if child.state is ChildState.RUNNING and child.pid is not None:
            # Alive as its result leaves (stopped at its end, or a session between steps): measured now,
            # before any kill, whose teardown is not the job's work. A session's process is measured after
            # every step: its status file is kept open for the next.
            if self._status is None:
                self._status = StatusKept()
            measured = self._status.usage(child.pid)  # kept open since the hand-over, if it was handed
            if measured is None or measured[1] is None:
                self._await_end()  # it exited (or was killed): the template's wait4 has its peak memory
            if child.state is ChildState.RUNNING and measured is not None:
                outcome.cpu_us, outcome.max_rss_kb = child.used(*measured)
        if not serving.session and self._status is not None:
            self._status.close()  # a job's is kept from its hand-over to its measure only
        if child.state is ChildState.RUNNING and not serving.session:
            # Answered from the report, which a job could write early and then go on: whatever it still
            # does is killed now. The template reaps it while the result travels; nothing the job still
            # asks is answered (a delegated call it makes now fails, as it dies), and the pool holds no
            # listener or grant of it while idle.
            child.answered(serving.life.deadline)
            self._close_metadata()
        ended = child.ended
        if ended is not None:
            outcome.cpu_us, outcome.max_rss_kb = child.used(ended.cpu_us, ended.max_rss_kb)
            self._close_metadata()
            child.release()
            outcome.ended = True
            if os.WIFSIGNALED(ended.status):
                outcome.signal = os.WTERMSIG(ended.status)
                outcome.exit = 128 + outcome.signal
            else:
                outcome.exit = os.waitstatus_to_exitcode(ended.status)
        if self._steward_thread is not None:
            outcome.delegated_cpu_us = self._steward_thread.take_cpu()
        if self.cgroups is not None and self.cgroups.memory is not None:
            # The kernel's own count: what the job's cgroup held at its peak, and whether it killed the job
            # for its memory (a kill the job cannot fake, nor hide).
            try:
                outcome.memory_peak_kb = self.cgroups.memory.measure()
                if serving.holds_in_kernel:
                    outcome.shmem_kb, outcome.socket_kb = self.cgroups.memory.held_in_kernel()
                outcome.memory_exceeded = outcome.signal == signal.SIGKILL and self.cgroups.memory.killed()
                tenant = self.cgroups.tenant
                # Killed for memory while its tenant met its budget, without meeting its own limit: the budget's.
                if outcome.memory_exceeded and tenant is not None and tenant.memory is not None \
                        and (budget := tenant.budget_hits() - self._budget_hits) > 0 \
                        and not self.cgroups.memory.reached_own_limit(above=budget):
                    outcome.budget = (tenant.name, tenant.memory)
            except OSError as exc:
                self.broken = True
                raise PoolWorkerError(f"cannot read the template's memory cgroup: {exc}") from None

    def _await_end(self) -> None:
        """Give the template a moment to report a child that is exiting on its own."""
        deadline = time.monotonic() + _END_WAIT
        while self.child.state is not ChildState.ENDED:
            if not readable(self.sock.fileno(), deadline - time.monotonic()):
                return  # its peak memory stays unknown; the next job settles its end
            self._receive()

    def after_result(self) -> None:
        """Once a result has left: collect its child's end, and the child the template now prepares if none
        waits, and make the next job's descriptors, while the agent reads the result, rather than on the next
        job's path. A template that fails here is marked broken and replaced before the next job."""
        if self.broken:
            return
        try:
            self._settle()
            self._settle_memory()
            if self._made is None:
                with contextlib.suppress(OSError):  # none to spare now (EMFILE): the job makes its own, or says so
                    self._made = _job_descriptors()
        except PoolWorkerError:
            self.broken = True
        except Exception:  # a bug here must cost this template, never the worker thread (its templates die with it)
            _log.exception("the pool failed while collecting a job's end")
            self.broken = True

    def _settle_memory(self) -> None:
        """What the template's memory cgroup holds between jobs: the base of the next job's limit."""
        if self.cgroups is not None and self.cgroups.memory is not None:
            try:
                self.cgroups.memory.settle()
            except OSError as exc:
                raise PoolWorkerError(f"cannot read the template's memory cgroup: {exc}") from None

    def _settle(self) -> None:
        """Before the next job: collect the end of a child answered from its report (see _finish)."""
        child = self.child
        if child.state is ChildState.ENDED:  # reported after its result left (see _await_end)
            self._close_metadata()
            child.release()
        if child.state is not ChildState.ANSWERED:
            self._settle_prepared()
            return
        assert child.deadline is not None
        clock = ServingLife(child.deadline, _GRACE_NS)  # its job's clock goes on (see serving.py)
        while child.state is ChildState.ANSWERED:
            now = time.monotonic_ns()
            if clock.due(now):
                # Killed when it was answered; its time is up all the same: once more, then the template's grace.
                clock.time_out(now)
                child.kill()
            if clock.grace_over(now):
                self.broken = True
                raise PoolWorkerError("the template did not reap a finished job in time", started=False)
            if self._frame_within((clock.wake() - now) / 1e9):
                self._receive_between_jobs()
        child.release()
        self._settle_prepared()

    def _settle_prepared(self) -> None:
        """Before the next job: read what the template said meanwhile about prepared children (those it is
        preparing now, whose frames are due in the time of a fork; one that died while it waited). While none
        waits, the next job waits for the first that is due; once one waits, the rest come during that job."""
        deadline = time.monotonic() + _KILL_GRACE
        while True:
            due = self.prepared.due and not self.prepared.waiting
            wait = max(deadline - time.monotonic(), 0) if due else 0
            if not self._frame_within(wait):
                if due:
                    self.broken = True
                    raise PoolWorkerError("the template did not prepare its next child in time", started=False)
                return
            self._receive_between_jobs()

    @property
    def preparing(self) -> bool:
        """Whether the template said it is preparing children whose frames have not been read yet (for at
        most the grace a template has to send them: past it, the next job's settling judges it)."""
        return not self.broken and bool(self.prepared.due) and time.monotonic() < self._due_by

    def read_prepared(self) -> None:
        """Between jobs, while no job waits (the worker's loop, see serve.py): read what the template sent
        meanwhile, so that an idle pool holds every child it prepared. Never waits."""
        if self.broken:
            return
        try:
            while self._frame_within(0):
                self._receive_between_jobs()
        except PoolWorkerError:
            self.broken = True
        except Exception:  # a bug here must cost this template, never the worker thread
            _log.exception("the pool failed while reading its template's prepared children")
            self.broken = True

    def _frame_within(self, timeout: float) -> bool:
        """:func:`readable` of the template's socket, through the poller kept for it (``timeout`` in seconds)."""
        return bool(self._between.poll(max(timeout, 0.0) * 1000))

    def _receive_between_jobs(self) -> None:
        try:
            self._receive()
        except PoolWorkerError as exc:  # the template died after the last job: this one was not sent
            raise PoolWorkerError(str(exc), started=False) from None

    # -- what the loop reads ---------------------------------------------------------------------------
    @staticmethod
    def _on_pipe(fd: int, serving: _Serving) -> None:
        if not serving.capture.read(fd, hung_up=bool(serving.sel.events.get(fd, 0) & select.POLLHUP)):
            serving.sel.unregister(fd)

    def _on_pidfd(self, serving: _Serving) -> None:
        assert self.child.pidfd is not None
        serving.sel.unregister(self.child.pidfd)  # the killed child is dead: its result is due now
        serving.life.died()

    def _on_template(self, serving: _Serving) -> None:
        if self._receive(serving.life):
            serving.sel.unregister(self.sock)

    def _on_listener(self, serving: _Serving) -> None:
        assert self._steward is not None and self._steward.sock is not None
        serving.sel.unregister(self._steward.sock)
        self._steward.take_listener()

    def _on_answers_waiting(self, serving: _Serving) -> None:
        assert serving.job_calls is not None
        serving.job_calls.outbox.woken()  # the next _enforce sees when they condemn the job
        self._watch_writes(serving)

    @staticmethod
    def _watch_writes(serving: _Serving) -> None:
        """Watch the channel for writability exactly while answers wait for it (a writable socket would
        otherwise wake the loop at once, every time)."""
        job_calls = serving.job_calls
        if job_calls is None or not serving.channel_events:
            return
        wanted = select.POLLIN | (select.POLLOUT if job_calls.outbox.wants_to_write() else 0)
        if wanted != serving.channel_events:
            serving.sel.modify(job_calls.channel, wanted)
            serving.channel_events = wanted

    def _on_host_channel(self, serving: _Serving) -> None:
        """The channel is readable (calls), or writable while answers wait: one handler, as poll keys one
        registration per descriptor; neither the write nor the read blocks."""
        job_calls = serving.job_calls
        assert job_calls is not None
        if serving.channel_events & select.POLLOUT:
            job_calls.outbox.flush()
        try:
            chunk: bytes | None = job_calls.channel.recv(_READ_CHUNK, socket.MSG_DONTWAIT)
        except BlockingIOError:
            chunk = None  # woken to write only
        except OSError:
            chunk = b""
        if chunk == b"":
            serving.sel.unregister(job_calls.channel)
            serving.channel_events = 0
            return
        if chunk is not None:
            try:
                job_calls.readable(chunk)
            except ProtocolViolation as exc:
                job_calls.violation = str(exc)
                serving.life.violated(job_calls.violation)
                serving.sel.unregister(job_calls.channel)
                serving.channel_events = 0
                self.child.kill()
                return
        self._watch_writes(serving)

    def _receive(self, serving: ServingLife | None = None) -> bool:
        """Handle one frame from the template (``serving``: the life of the job being served, if one is); True
        once the child has ended."""
        try:
            frame, fds = recv_frame(self.sock)
        except (OSError, EOFError, ValueError, msgspec.DecodeError) as exc:
            self.broken = True
            # Even before Started, the template may have forked: the job counts as started.
            raise PoolWorkerError(f"the template died while serving the job ({exc})") from None
        if isinstance(frame, Started) and fds:
            for extra in fds[1:]:
                os.close(extra)
            self._child_serial = frame.serial
            self.child.started(fds[0], frame.pid)
            self._rules_seen(frame.rules)
            if serving is not None and serving.condemned:
                self.child.kill()  # condemned before its pidfd arrived: the kill could not reach it then
            return False
        if isinstance(frame, Prepared) and len(fds) == 2:
            # The runtime's watch is asked now too, not only as a job is handed: the child holds the rules its
            # template reopened before it forked, and a mount on the way gone again before the next job would
            # leave the mount table as the watch last read it (policy/runtime.py compares the table's state).
            self._runtime.changes()
            # At most K wait, for the latest job's key; one whose job was forgotten waits for none. Its control
            # socket is the template's socketpair: named so, rather than asked of the kernel (two getsockopt).
            for given_up in self.prepared.arrived(frame.serial, frame.job, frame.pid, fds[0],
                                                  socket.socket(socket.AF_UNIX, socket.SOCK_STREAM, 0, fds[1])):
                self._discard(given_up)
            if self._rules_seen(frame.rules):  # prepared under rules no job was forked under: given up, all
                for given_up in self.prepared.give_up_other_keys(None):
                    self._discard(given_up)
            return False
        if isinstance(frame, Unprepared):
            self.prepared.unannounced(frame.count)
            return False
        if isinstance(frame, NotForked) and self.child.state is ChildState.SENT:
            # Its template could not fork (a full pids cgroup, RLIMIT_NPROC, no memory) and serves on: nothing
            # of the job ran, and it is still on its way (a worker sends it once more, to this template).
            for fd in fds:
                os.close(fd)
            self.child.not_sent()
            self._close_metadata()
            raise PoolWorkerError(f"the pool could not start a process for this job: its fork failed "
                                  f"({frame.reason}; the pool's process limit is reached, or its memory); "
                                  "nothing of it ran", started=False)
        if isinstance(frame, Ended):
            if frame.prepares:
                self.prepared.announced(frame.prepares)
                self._due_by = time.monotonic() + _KILL_GRACE
            if frame.serial == self._child_serial:
                self._child_serial = None
                self.child.reaped(frame)
                return True
            if self.prepared.ended(frame.serial):  # died while it waited, or given up before
                return False
        for fd in fds:
            os.close(fd)
        self.broken = True
        raise PoolWorkerError(f"the template sent an unexpected {type(frame).__name__} frame")

    def _watch_listener(self, serving: _Serving) -> None:
        """Once the child's listener is here, watch it for the job's first delegated call (most jobs make none:
        the steward thread is then neither woken to serve it nor waited for as it lets go)."""
        steward = self._steward
        if steward is None or steward.phase is not StewardPhase.ARRIVED or serving.watching_listener:
            return
        assert steward.listener is not None
        serving.sel.register(steward.listener, select.POLLIN, self._on_delegated_call)
        serving.watching_listener = True

    def _on_delegated_call(self, serving: _Serving) -> None:
        """The job's first delegated call (or its listener hung up): the steward thread answers from now on."""
        assert self._steward is not None and self._steward.listener is not None
        serving.sel.unregister(self._steward.listener)
        serving.watching_listener = False
        self._start_steward()

    def _start_steward(self) -> None:
        """Answer the child's metadata calls on the steward thread."""
        if self._steward is None or self._steward.phase is not StewardPhase.ARRIVED:
            return
        self._steward.serve()
        if self._steward_thread is None:
            self._steward_thread = StewardThread(f"pynox-steward-{self.pid}")
        self._steward_thread.serve(self._steward)

    def _close_metadata(self) -> None:
        if self._steward is None:
            return
        if self._steward_thread is not None and not self._steward_thread.release(_STEWARD_LETS_GO):
            # A call's cost is bounded (steward.py): a thread that does not let go is a bug. Its descriptors
            # stay open rather than be closed under it (a number reused meanwhile would be another file).
            self.broken = True
            self._steward = None
            raise PoolWorkerError("the pool's steward did not let go of a job's delegated calls in time")
        self._steward.close()
        self._steward = None

    @staticmethod
    def _take_word(outcome: Gathering, word: JobWord | None, claim: int | None) -> None:
        """Take the job's word (report.py) where the pool's own knowledge agrees with it."""
        if outcome.timed_out or word is None:
            return  # the exit status stands alone
        if word.shape == "setup" and (claim is None or not take_back(claim)):
            return  # it claimed its job, so its code may have run: a setup failure is not its to report
        ended = outcome.ended and outcome.signal is None
        if ended and outcome.exit != word.exit:
            return  # the kernel's status says otherwise: the report is not the child's
        outcome.error = word.error
        outcome.setup_error = word.setup_error
        outcome.exited = word.shape == "exited"
        outcome.return_value = word.return_value
        outcome.images, outcome.images_dropped = word.images, word.images_dropped
        if not outcome.ended:  # answered from the report, or a session step whose process lives on
            outcome.exit = word.exit
