"""The server's handle on one template: start it, run a job through it, capture output, enforce the deadline.

A :class:`Template` serves one job at a time. Output is read from the job's own
pipes with a cap per stream; past the cap it is still drained (and dropped) so
a flood never blocks the job. The deadline is enforced here, from outside the
sandbox, by SIGKILL through the pidfd the template handed over: no pid reuse
race, and the job cannot ignore it.
"""

from __future__ import annotations

import os
import select
import selectors
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import msgspec

import pynox

from ..errors import KernelSupportError, PoolWorkerError
from ..job import Confinement, JobSpec, Report
from ..policy import tasks
from ..policy.grants import close_all, open_grants
from .descriptors import CHANNEL, CLAIM, CONTROL, METADATA, PAYLOAD, REPORT, STDERR, STDOUT, sent_with_job
from .frames import Ended, Init, Ready, Started, TemplateFailed, recv_frame, send_frame
from .hostcalls import JobCalls, ProtocolViolation
from .metadata import Steward, receive_listener
from .outcome import Outcome
from .payload import new_claim, take_back, write_payload

__all__ = ["SessionChannels", "Template", "template_environment"]

_READ_CHUNK = 1 << 16
_MAX_REPORT = 1 << 20
# After SIGKILL the kernel tears the process down; a template that does not report by then is broken.
_KILL_GRACE = 5.0
_START_TIMEOUT = 300.0  # preloading pandas on a cold disk takes seconds, not minutes
# Hardware tuning the host may need for BLAS on this processor (see the env notes); not secrets.
_PASSTHROUGH = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
_report_decoder = msgspec.json.Decoder(Report)
CallSink = Callable[[socket.socket], JobCalls]


def _close_quietly(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


def _job_ids(confinement: Confinement) -> tuple[int, int]:
    """The uid and gid the job runs as (see policy.confine): the operator's, or the pool's own."""
    if confinement.uid is None:
        return os.geteuid(), os.getegid()
    return confinement.uid, confinement.gid if confinement.gid is not None else confinement.uid


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
class _StewardToBe:
    """What a job's :class:`Steward` is made of, until its child's listener has arrived on ``sock``."""

    sock: socket.socket | None
    writes: list[int]
    uid: int
    gid: int
    listener: int | None = None

    def take_listener(self) -> None:
        """The child sent its listener (or closed the socket: its setup failed before)."""
        assert self.sock is not None
        self.listener = receive_listener(self.sock)
        self.sock.close()
        self.sock = None

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
        close_all([*([self.listener] if self.listener is not None else []), *self.writes])


@dataclass
class SessionChannels:
    """The pool's and the child's ends of a session's control and host-call channels."""

    control: socket.socket
    job_control: socket.socket
    channel: socket.socket | None
    job_channel: socket.socket | None

    @classmethod
    def create(cls, with_functions: bool) -> SessionChannels:
        control, job_control = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        channel, job_channel = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM) if with_functions else (None, None)
        return cls(control, job_control, channel, job_channel)

    def close(self) -> None:
        for sock in (self.control, self.job_control, self.channel, self.job_channel):
            if sock is not None:
                sock.close()


class Template:
    """One warm template process and the socket to it."""

    def __init__(self, preload: list[str], package_dirs: list[str], *, stderr: int | None = None) -> None:
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        # -I: no PYTHON* variables, no user site, no current directory on sys.path.
        source_root = os.path.dirname(os.path.dirname(os.path.abspath(pynox.__file__)))
        # typing_extensions, when msgspec finds it, patches the standard typing module, and every job would
        # inherit the patch: hidden while pynox loads (msgspec then uses typing's own), importable again after.
        bootstrap = (f"import sys; sys.path.insert(0, {source_root!r}); sys.modules['typing_extensions'] = None; "
                     "from pynox.pool.template import main; del sys.modules['typing_extensions']; main()")
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-I", "-c", bootstrap, str(child.fileno())],
                env=template_environment(), pass_fds=[child.fileno()], stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=stderr, cwd="/",
            )
        finally:
            child.close()
        self.sock = parent
        self.broken = False
        self.cgroup: str | None = None
        # The child being served: its pidfd (for SIGKILL) and, once the template reaped it, how it ended.
        self.child_pidfd: int | None = None
        self.child_ended: Ended | None = None
        # A job answered before the template reaped it: its deadline still holds until it is reaped.
        self._unreaped_deadline: int | None = None
        # The child's delegated metadata calls (see metadata.py): the socket its listener arrives on, the
        # job's write grants and its uid and gid until then, and the steward answering them from then on.
        self._metadata: _StewardToBe | None = None
        self.steward: Steward | None = None
        limit, _ = tasks.available()
        try:
            if limit is not None:  # before the template can fork anything: every job it forks is bounded
                self.cgroup = limit.confine_template(self.process.pid, f"template-{self.process.pid}")
        except OSError as exc:
            self.close()
            raise PoolWorkerError(f"could not put the template in its pids cgroup: {exc}") from None
        try:
            send_frame(parent, Init(preload=preload, package_dirs=package_dirs))
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

    @property
    def pid(self) -> int:
        return self.process.pid

    def close(self) -> None:
        """Stop the template: closing its socket ends it; a stuck one is killed."""
        self.sock.close()
        try:
            self.process.wait(timeout=2)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        # A session's child is served until the session closes, and a broken template may leave its job's
        # pidfd behind: either way it is the pool's descriptor, and closing the template must release it.
        self._close_child()
        if self.cgroup is not None:
            # Its children die with it (parent-death signal); what is still exiting is removed at exit.
            tasks.remove(self.cgroup, wait=0.5)
            self.cgroup = None

    def run(self, spec: JobSpec, *, max_output: int, calls: CallSink | None = None,
            session: SessionChannels | None = None) -> Outcome:
        """Run one job (or a session's first step) to its end.

        Raises :class:`PoolWorkerError` (and marks itself broken) if the template fails, and
        :class:`RequestError` (nothing ran) if a granted path changed since the job was resolved. With
        ``session``, the call returns when the first step is over and the child stays alive for the next ones.
        """
        self._settle()
        if spec.functions and session is not None and session.job_channel is None:
            raise PoolWorkerError("a session with host functions has no channel for them", started=False)
        confinement = spec.confinement(tasks.MAX_JOB_TASKS if self.cgroup is not None else None)
        # The grants bind now, when the job starts (RequestError if a path changed since it was resolved).
        granted = open_grants([*confinement.allow_read, *confinement.allow_write])
        reads, writes = granted[:len(confinement.allow_read)], granted[len(confinement.allow_read):]
        try:
            payload = write_payload(spec.payload())
        except BaseException:
            close_all(granted)
            raise
        claim = new_claim()
        metadata, job_metadata = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        # The steward keeps the write grants' descriptors: the files it may change are found from them.
        self._metadata = _StewardToBe(metadata, writes, *_job_ids(confinement))
        pipes = [os.pipe2(os.O_CLOEXEC) for _ in range(3)]
        extra: list[socket.socket] = []
        own = {STDOUT: pipes[0][1], STDERR: pipes[1][1], REPORT: pipes[2][1], PAYLOAD: payload, CLAIM: claim,
               METADATA: job_metadata.fileno()}
        channel = session.channel if session is not None else None
        if spec.functions:
            job_end: socket.socket | None
            if session is None:
                channel, job_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            else:
                job_end = session.job_channel
            assert job_end is not None  # checked above, before anything was opened
            extra.append(job_end)
            own[CHANNEL] = job_end.fileno()
        if session is not None:
            extra.append(session.job_control)
            own[CONTROL] = session.job_control.fileno()
        start = time.monotonic_ns()
        try:
            order = sent_with_job(confinement.host_channel, confinement.session)
            send_frame(self.sock, confinement, [*(own[target] for target in order), *granted])
        except OSError as exc:
            self.broken = True
            self._close_metadata()
            for r, _ in pipes:
                os.close(r)  # the write ends are closed below, once
            if channel is not None and session is None:
                channel.close()
            os.close(claim)
            raise PoolWorkerError(f"the template is gone: {exc}", started=False) from None
        finally:
            for _, w in pipes:
                _close_quietly(w)
            for sock in [*extra, job_metadata]:  # the child has its own copies now
                sock.close()
            close_all([payload, *reads])
        try:
            return self.collect([r for r, _ in pipes], spec, spec.timeout, max_output, start,
                                calls=calls, channel=channel, session=session is not None)
        except PoolWorkerError as exc:
            if exc.started and take_back(claim):  # no child claimed the job: it never began
                raise PoolWorkerError(str(exc), started=False) from None
            raise
        finally:
            os.close(claim)

    def collect(self, reads: list[int], spec: JobSpec, timeout: float, max_output: int, start: int, *,
                calls: CallSink | None, channel: socket.socket | None, session: bool) -> Outcome:
        """Read a job's (or a step's) pipes to EOF, relay host calls, enforce the deadline, then conclude."""
        outcome = Outcome()
        job_calls = calls(channel) if calls is not None and channel is not None else None
        try:
            report = self._loop(reads, outcome, start, start + int(timeout * 1e9), max_output, job_calls, session)
        finally:
            for fd in reads:
                _close_quietly(fd)
            if job_calls is not None:
                job_calls.close()
            if channel is not None and not session:  # a session's channel lives as long as the session
                channel.close()
        self._read_report(outcome, report)
        outcome.conclude(spec, timeout)
        return outcome

    def ended_while_idle(self) -> Ended | None:
        """Between two steps of a session: how its child ended, if it did meanwhile (killed from outside,
        say). Consumes the template's Ended frame, which is waiting on the socket."""
        if self.child_ended is None and self.has_word():
            self._receive(Outcome())
        return self.child_ended

    def has_word(self) -> bool:
        """Whether the template has said something nobody has read yet (between steps: that the child ended)."""
        return bool(select.select([self.sock], [], [], 0)[0])

    def kill_child(self) -> None:
        if self.child_pidfd is not None:
            try:
                signal.pidfd_send_signal(self.child_pidfd, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def _loop(self, reads: list[int], outcome: Outcome, start: int, deadline: int, max_output: int,
              job_calls: JobCalls | None, session: bool) -> bytes:
        out, _err, rep = reads
        report = bytearray()
        kill_deadline: int | None = None
        child_dead = False  # seen through its pidfd: the template may be slow to say so (stopped, busy)
        watching_pidfd = False
        with selectors.DefaultSelector() as sel:
            for fd in reads:
                sel.register(fd, selectors.EVENT_READ)
            if self.child_ended is None:
                sel.register(self.sock, selectors.EVENT_READ)
            if job_calls is not None:
                sel.register(job_calls.channel, selectors.EVENT_READ)
            if self._metadata is not None and self._metadata.sock is not None:
                sel.register(self._metadata.sock, selectors.EVENT_READ)
            if self.steward is not None:  # a session's, from its first step
                sel.register(self.steward.listener, selectors.EVENT_READ)
            open_pipes = 3
            try:
                # A job is over when its process ended and its pipes closed; a session step when its
                # pipes closed (the child hands them back), unless the child died or exited meanwhile.
                while open_pipes or (self.child_ended is None and not child_dead
                                     and self._must_wait_for_end(report, session, outcome,
                                                                 self.child_pidfd is not None)):
                    self._start_steward(sel)
                    if job_calls is not None and job_calls.violation is not None and not outcome.protocol_violation:
                        outcome.protocol_violation = job_calls.violation  # it stopped reading its answers
                        self.kill_child()
                    now = time.monotonic_ns()
                    if kill_deadline is None and now >= deadline:
                        outcome.timed_out = True
                        kill_deadline = now + int(_KILL_GRACE * 1e9)
                        self.kill_child()
                    if kill_deadline is not None and now >= kill_deadline:
                        self.broken = True
                        raise PoolWorkerError("the template did not reap a killed job in time")
                    if kill_deadline is not None and not watching_pidfd and self.child_pidfd is not None:
                        sel.register(self.child_pidfd, selectors.EVENT_READ)
                        watching_pidfd = True
                    limit = (kill_deadline if kill_deadline is not None else deadline) - now
                    for key, _ in sel.select(max(limit, 0) / 1e9):
                        fd = key.fd
                        if watching_pidfd and fd == self.child_pidfd:
                            sel.unregister(fd)  # the killed child is dead: its result is due now
                            child_dead = True
                            continue
                        if fd == self.sock.fileno():
                            if self._receive(outcome):
                                sel.unregister(self.sock)
                            continue
                        if self._metadata is not None and self._metadata.sock is not None \
                                and fd == self._metadata.sock.fileno():
                            sel.unregister(fd)
                            self._metadata.take_listener()
                            continue
                        if self.steward is not None and fd == self.steward.listener:
                            if not self.steward.answer():
                                sel.unregister(fd)
                            continue
                        if job_calls is not None and fd == job_calls.channel.fileno():
                            if not self._relay(job_calls, sel):
                                outcome.protocol_violation = job_calls.violation
                                self.kill_child()
                            continue
                        chunk = os.read(fd, _READ_CHUNK)
                        if not chunk:
                            sel.unregister(fd)
                            open_pipes -= 1
                        elif fd == rep:
                            if len(report) + len(chunk) > _MAX_REPORT:
                                report.clear()  # an oversized report is ignored, the exit status still counts
                            else:
                                report += chunk
                        else:
                            self._capture(outcome, fd == out, chunk, max_output)
            except BaseException:
                if self.child_ended is None:
                    self.kill_child()
                raise
        outcome.duration_us = (time.monotonic_ns() - start) // 1000
        if self.child_ended is None and not session:
            # Answered from the report, which a job could write early and then go on: whatever it still
            # does is killed now (an honest child is already exiting: the kill changes nothing for it).
            # The template reaps it while the result travels.
            self.kill_child()
            self._unreaped_deadline = deadline
            # Answered: nothing the job still asks is answered (a delegated call it makes now fails, as
            # it dies), and the pool holds no listener or grant of it while idle.
            self._close_metadata()
        ended = self.child_ended
        if ended is not None:
            self._close_child()
            outcome.ended = True
            outcome.cpu_us, outcome.max_rss_kb = ended.cpu_us, ended.max_rss_kb
            if os.WIFSIGNALED(ended.status):
                outcome.signal = os.WTERMSIG(ended.status)
                outcome.exit = 128 + outcome.signal
            else:
                outcome.exit = os.waitstatus_to_exitcode(ended.status)
        return bytes(report)

    @staticmethod
    def _must_wait_for_end(report: bytearray, session: bool, outcome: Outcome, can_kill: bool) -> bool:
        """After the pipes closed: is the child's end (its exit status) still needed?

        A complete report says how the code ended, so a job's result need not wait for the exit
        teardown (0.5 to 1.5 ms): the child is killed as the result is answered (see _loop), so
        nothing it might still do after its report happens. Only a missing or broken report, a kill,
        a child not yet killable (its pidfd still on its way), or a session step that ended its process
        needs the status the template reports."""
        if outcome.timed_out or outcome.protocol_violation is not None or not report:
            return True
        if not session and not can_kill:
            return True
        try:
            decoded = _report_decoder.decode(report)
        except msgspec.DecodeError:
            return True
        return decoded.exited if session else decoded.setup_error is not None

    def _settle(self) -> None:
        """Before the next job: collect the end of a child answered from its report (see _loop)."""
        deadline = self._unreaped_deadline
        if deadline is None:
            return
        self._unreaped_deadline = None
        kill_deadline = None
        while self.child_ended is None:
            now = time.monotonic_ns()
            if kill_deadline is None and now >= deadline:
                # It closed its output and kept running: its time is up all the same.
                self.kill_child()
                kill_deadline = now + int(_KILL_GRACE * 1e9)
            if kill_deadline is not None and now >= kill_deadline:
                self.broken = True
                raise PoolWorkerError("the template did not reap a finished job in time", started=False)
            ready, _, _ = select.select([self.sock], [], [], ((kill_deadline or deadline) - now) / 1e9)
            if ready:
                try:
                    self._receive(Outcome())
                except PoolWorkerError as exc:  # the template died after the last job: this one was not sent
                    raise PoolWorkerError(str(exc), started=False) from None
        self._close_child()

    def _relay(self, job_calls: JobCalls, sel: selectors.BaseSelector) -> bool:
        try:
            chunk = job_calls.channel.recv(_READ_CHUNK)
        except OSError:
            chunk = b""
        if not chunk:
            sel.unregister(job_calls.channel)
            return True
        try:
            job_calls.readable(chunk)
        except ProtocolViolation as exc:
            job_calls.violation = str(exc)
            sel.unregister(job_calls.channel)
            return False
        return True

    def _receive(self, outcome: Outcome) -> bool:
        """Handle one frame from the template; True once the child has ended."""
        try:
            frame, fds = recv_frame(self.sock)
        except (OSError, EOFError, ValueError, msgspec.DecodeError) as exc:
            self.broken = True
            # Even before Started, the template may have forked: the job counts as started.
            raise PoolWorkerError(f"the template died while serving the job ({exc})") from None
        if isinstance(frame, Started) and fds:
            self.child_pidfd = fds[0]
            for extra in fds[1:]:
                os.close(extra)
            if outcome.protocol_violation is not None or outcome.timed_out:
                self.kill_child()  # condemned before its pidfd arrived: the kill could not reach it then
            return False
        if isinstance(frame, Ended):
            self.child_ended = frame
            return True
        for fd in fds:
            os.close(fd)
        self.broken = True
        raise PoolWorkerError(f"the template sent an unexpected {type(frame).__name__} frame")

    def _start_steward(self, sel: selectors.BaseSelector) -> None:
        """Answer the child's metadata calls once its listener is here."""
        to_be = self._metadata
        if to_be is None or to_be.listener is None:
            return
        self._metadata = None
        self.steward = Steward(to_be.listener, to_be.writes, to_be.uid, to_be.gid)
        sel.register(self.steward.listener, selectors.EVENT_READ)

    def _close_metadata(self) -> None:
        if self._metadata is not None:
            self._metadata.close()
            self._metadata = None
        if self.steward is not None:
            self.steward.close()
            self.steward = None

    def _close_child(self) -> None:
        self._close_metadata()
        if self.child_pidfd is not None:
            os.close(self.child_pidfd)
        self.child_pidfd = None
        self.child_ended = None

    @staticmethod
    def _capture(outcome: Outcome, is_stdout: bool, chunk: bytes, max_output: int) -> None:
        buffer = outcome.stdout if is_stdout else outcome.stderr
        room = max_output - len(buffer)
        if len(chunk) > room:
            chunk = chunk[: max(room, 0)]
            if is_stdout:
                outcome.stdout_truncated = True
            else:
                outcome.stderr_truncated = True
        buffer += chunk

    @staticmethod
    def _read_report(outcome: Outcome, raw_report: bytes) -> None:
        if outcome.timed_out or not raw_report:
            return
        try:
            report = _report_decoder.decode(raw_report)
        except msgspec.DecodeError:
            return  # the job wrote garbage over its report channel: the exit status stands alone
        outcome.error = report.error
        outcome.setup_error = report.setup_error
        outcome.exited = report.exited
        if not outcome.ended:  # a session step: the process lives on, the step's status is in its report
            outcome.exit = report.exit
