"""The server's handle on one template: start it, run a job through it, capture output, enforce the deadline.

A :class:`Template` serves one job at a time. Output is read from the job's own
pipes with a cap per stream; past the cap it is still drained (and dropped) so
a flood never blocks the job. The deadline is enforced here, from outside the
sandbox, by SIGKILL through the pidfd the template handed over: no pid reuse
race, and the job cannot ignore it.
"""

from __future__ import annotations

import os
import selectors
import signal
import socket
import subprocess
import sys
import time

import msgspec

import pynox

from ..errors import KernelSupportError, PoolWorkerError
from ..job import JobSpec, Report
from .outcome import Outcome
from .frames import Ended, Init, Ready, Started, TemplateFailed, recv_frame, send_frame

__all__ = ["Template", "template_environment"]

_READ_CHUNK = 1 << 16
_MAX_REPORT = 1 << 20
# After SIGKILL the kernel tears the process down; a template that does not report by then is broken.
_KILL_GRACE = 5.0
_START_TIMEOUT = 300.0  # preloading pandas on a cold disk takes seconds, not minutes
# Hardware tuning the host may need for BLAS on this processor (see the env notes); not secrets.
_PASSTHROUGH = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
_report_decoder = msgspec.json.Decoder(Report)


def template_environment() -> dict[str, str]:
    """The template's whole environment: a minimal base, BLAS pinned to one thread, nothing of the host's."""
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
    # Preloaded numpy must not start a thread pool: a template has to stay single-threaded to fork.
    for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS",
                 "VECLIB_MAXIMUM_THREADS", "BLIS_NUM_THREADS"):
        env[name] = "1"
    env.update({name: os.environ[name] for name in _PASSTHROUGH if name in os.environ})
    return env


class Template:
    """One warm template process and the socket to it."""

    def __init__(self, preload: list[str], package_dirs: list[str], *, stderr: int | None = None) -> None:
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        # -I: no PYTHON* variables, no user site, no current directory on sys.path.
        source_root = os.path.dirname(os.path.dirname(os.path.abspath(pynox.__file__)))
        bootstrap = f"import sys; sys.path.insert(0, {source_root!r}); from pynox.pool.template import main; main()"
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
        try:
            send_frame(parent, Init(preload=preload, package_dirs=package_dirs))
            parent.settimeout(_START_TIMEOUT)
            frame, _ = recv_frame(parent)
            parent.settimeout(None)
        except (OSError, EOFError, ValueError, msgspec.DecodeError) as exc:
            self.close()
            raise PoolWorkerError(f"the template did not start: {exc}") from None
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

    def run(self, spec: JobSpec, *, max_output: int) -> Outcome:
        """Run one job to its end. Raises :class:`PoolWorkerError` (and marks itself broken) if the template fails."""
        pipes = [os.pipe2(os.O_CLOEXEC) for _ in range(3)]
        outcome = Outcome()
        start = time.monotonic_ns()
        try:
            send_frame(self.sock, spec, [w for _, w in pipes])
        except OSError as exc:
            self.broken = True
            for r, w in pipes:
                os.close(r)
                os.close(w)
            raise PoolWorkerError(f"the template is gone: {exc}") from None
        for _, w in pipes:
            os.close(w)
        try:
            report = self._collect(pipes[0][0], pipes[1][0], pipes[2][0], outcome, start, spec, max_output)
        finally:
            for r, _ in pipes:
                try:
                    os.close(r)
                except OSError:
                    pass
        self._read_report(outcome, report)
        outcome.conclude(spec)
        return outcome

    def _collect(self, out: int, err: int, rep: int, outcome: Outcome, start: int, spec: JobSpec,
                 max_output: int) -> bytes:
        report = bytearray()
        deadline = start + int(spec.timeout * 1e9)
        pidfd: int | None = None
        ended: Ended | None = None
        kill_deadline: int | None = None
        with selectors.DefaultSelector() as sel:
            for fd in (out, err, rep):
                sel.register(fd, selectors.EVENT_READ)
            sel.register(self.sock, selectors.EVENT_READ)
            open_pipes = 3
            try:
                while ended is None or open_pipes:
                    now = time.monotonic_ns()
                    if kill_deadline is None and now >= deadline:
                        outcome.timed_out = True
                        kill_deadline = now + int(_KILL_GRACE * 1e9)
                        if pidfd is not None:
                            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
                    if kill_deadline is not None and now >= kill_deadline:
                        self.broken = True
                        raise PoolWorkerError("the template did not reap a killed job in time")
                    limit = (kill_deadline if kill_deadline is not None else deadline) - now
                    for key, _ in sel.select(max(limit, 0) / 1e9):
                        fd = key.fd
                        if fd == self.sock.fileno():
                            frame, fds = self._receive()
                            if isinstance(frame, Started):
                                pidfd = fds[0] if fds else None
                                if outcome.timed_out and pidfd is not None:
                                    signal.pidfd_send_signal(pidfd, signal.SIGKILL)
                            elif isinstance(frame, Ended):
                                ended = frame
                                outcome.duration_us = (time.monotonic_ns() - start) // 1000
                                sel.unregister(self.sock)
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
                if pidfd is not None and ended is None:
                    signal.pidfd_send_signal(pidfd, signal.SIGKILL)
                raise
            finally:
                if pidfd is not None:
                    os.close(pidfd)
        outcome.cpu_us, outcome.max_rss_kb = ended.cpu_us, ended.max_rss_kb
        status = ended.status
        if os.WIFSIGNALED(status):
            outcome.signal = os.WTERMSIG(status)
            outcome.exit = 128 + outcome.signal
        else:
            outcome.exit = os.waitstatus_to_exitcode(status)
        return bytes(report)

    def _receive(self) -> tuple[Started | Ended, list[int]]:
        try:
            frame, fds = recv_frame(self.sock)
        except (OSError, EOFError, ValueError, msgspec.DecodeError) as exc:
            self.broken = True
            raise PoolWorkerError(f"the template died while running the job ({exc})") from None
        if not isinstance(frame, Started | Ended):
            self.broken = True
            for fd in fds:
                os.close(fd)
            raise PoolWorkerError(f"the template sent an unexpected {type(frame).__name__} frame")
        return frame, fds

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
