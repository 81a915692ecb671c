"""Every template, a worker's or a session's, forked from one warm zygote, instead of each started by exec and
importing its preloads.

Why a session has a template of its own: a template's cgroups (memory,
threads, CPU, see policy/cgroups.py) are its job's, its limit set before each
job from what the template holds, and a template serves one child at a time;
a session's child lives for the whole session, so its template is held as long.
That stays: each session still has its own template process, its own cgroups,
its own child, and its template serves nobody else and ends with it; each
worker still has its own template, which serves that worker's jobs only.

What changes is where a template comes from. A zygote is a template (the
same bootstrap, preloads, proofs and prepared policy) that forks templates and
never a job's child, so it has never held anything of any job. A template is a
fork of it, which the pool puts in cgroups of its own before it sends the
template its Init (:class:`~pynox.server.templates.Template` does so for every
template, forked or started), so it forks nothing before its child's bounds are
its own; it refuses an Init other than the zygote's own, and proves its
descriptors again. Pages of the preloaded interpreter are shared copy-on-write
by the zygote and every template and child: an idle session costs what its
template and child have written since, not a whole interpreter with its
preloads, and so does a worker's template. Pages the zygote dirtied stay charged
to the zygote's cgroup; a template and its child are charged for what they
write themselves.

The zygote is its templates' parent: it reaps them and reports each one's end
(:class:`~pynox.wire.frames.Reaped`: wait status and usage, as a template
reports its child's ``Ended``), which :class:`ForkedProcess` gives the pool as
``subprocess.Popen`` gives a template it started: a forked template's death is
logged with its signal, counted and replaced as any other's.

One zygote per pool, started on a thread of its own that lives as long as the
zygote (a template dies with the thread that started it, see set_parent_death_signal)
and reads its reports: the preload of the pool. The templates it forked outlive
it (no parent-death signal: each ends when the pool closes its socket, which the
pool's death does too), so a zygote's death takes no job and no session; it is
logged (``zygote_died``), those templates' ends are no longer reported, and the
next template is forked from a new zygote; if none can be started, templates are
started by exec, as before, and the log says why.
"""

from __future__ import annotations

import logging
import os
import select
import signal
import socket
import subprocess
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

import msgspec

from ..errors import PoolWorkerError
from ..protocol import PoolEventName
from ..wire.frames import Reaped, Spawn, Spawned, recv_frame, send_frame
from .waiting import readable

if TYPE_CHECKING:
    from .lifecycle import ChildLife
    from .templates import Template

__all__ = ["ForkedProcess", "SessionTemplates"]

_log = logging.getLogger(__name__)

_SPAWN_TIMEOUT = 30.0  # seconds for the zygote to fork: milliseconds, unless the machine is swapping
# Seconds from a template's end (its pidfd) to the zygote's report of it: the zygote reaps it at once.
_REPORT_TIMEOUT = 2.0
_LET_GO_TIMEOUT = 0.2  # seconds for the watch to let its zygote go once woken (see SessionTemplates._wake)


class ForkedProcess:
    """A template forked by the zygote, as the pool sees it: the zygote is its parent and reaps it, and reports its
    end (:class:`~pynox.wire.frames.Reaped`); the pool holds its pidfd (no pid reuse) to know whether it lives.
    Its status and usage are the zygote's report; a template whose zygote died first is reaped by whoever adopted
    it (init, a subreaper), and its status is lost: ``lost``, and ``returncode`` stays None."""

    def __init__(self, pid: int, pidfd: int) -> None:
        self.pid = pid
        self._pidfd: int | None = pidfd
        self.returncode: int | None = None  # as subprocess.Popen's: negative for a signal
        self.cpu_us: int | None = None
        self.max_rss_kb: int | None = None
        self.lost = False
        self._over = threading.Event()  # reported, or lost

    def reaped(self, report: Reaped) -> None:
        """The zygote's report of its end."""
        self.returncode = os.waitstatus_to_exitcode(report.status)
        self.cpu_us, self.max_rss_kb = report.cpu_us, report.max_rss_kb
        self._over.set()

    def orphaned(self) -> None:
        """Its zygote ended before reporting it: no report will come (it may still live and serve)."""
        self.lost = True
        self._over.set()

    def poll(self) -> int | None:
        """None while it lives; else its status (-1 where it is lost)."""
        if self.returncode is not None:
            return self.returncode
        if self._pidfd is not None and not readable(self._pidfd, 0):
            return None
        self._over.wait(_REPORT_TIMEOUT)
        return self.returncode if self.returncode is not None else -1

    def wait(self, timeout: float | None = None) -> int:
        """Its status once it ended and its report came (-1 where it is lost, or the report is late); its pidfd
        is closed then."""
        if self.returncode is not None:
            self._close()
            return self.returncode
        if self._pidfd is not None and not readable(self._pidfd, timeout):
            raise subprocess.TimeoutExpired("pynox-template", timeout or 0.0)
        self._over.wait(_REPORT_TIMEOUT)
        self._close()
        return self.returncode if self.returncode is not None else -1

    def kill(self) -> None:
        if self._pidfd is not None:
            try:
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def describe_end(self) -> str | None:
        """Its usage, for the line that says how it ended; None if its zygote did not report it."""
        if self.cpu_us is None or self.max_rss_kb is None:
            return None
        return f"after {self.cpu_us / 1e6:.2f} s of CPU, {self.max_rss_kb / 1024:.1f} MiB at most"

    def _close(self) -> None:
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None


class SessionTemplates:
    """Templates forked from the pool's zygote, sessions' and workers' alike; or (none can be had) started by exec.

    ``start``: a template started by exec, with ``zygote=True`` a zygote, or with ``spawn`` one forked by it.
    ``event``: the pool's log of its own events (a zygote that died, with its status)."""

    def __init__(self, start: Callable[..., Template],
                 event: Callable[[PoolEventName, str], None] = lambda event, message: None) -> None:
        self._start = start
        self._event = event
        self._lock = threading.Lock()  # one reader of the zygote's socket at a time: a Spawn, or the watch
        self._changed = threading.Condition()
        self._zygote: Template | None = None
        self._starting = self._closed = False
        self._failed: str | None = None
        self._thread: threading.Thread | None = None
        # By zygote pid: the templates each forked, not reported ended yet (read and changed under _lock).
        self._forked: dict[int, dict[int, ForkedProcess]] = {}
        # Each watch's wake-up (the write end of a pipe it polls beside its zygote's socket), by zygote (``id``, added
        # and removed under _changed): it waits for one or the other, never looking on a timer (five looks a
        # second cost the pool's CPU ~4 µs per session step at a hundred steps a second).
        self._wakes: dict[int, int] = {}

    def new_template(self, life: ChildLife | None = None) -> Template:
        """A template forked from the zygote (started by exec when there is none). ``life``: a worker's child
        life, which outlives its templates (see lifecycle.py)."""
        zygote = self._ready_zygote()
        if zygote is not None:
            try:
                return self._start(life=life, spawn=lambda: self._spawn(zygote))
            except PoolWorkerError as exc:
                if not zygote.broken:
                    raise  # the forked template failed, not the zygote: as a template started by exec would
                _log.warning("the zygote failed (%s); this template is started by exec, the next is forked from "
                             "a new zygote", exc)
        return self._start(life=life)

    def close(self) -> None:
        """No more templates are forked; the zygote ends (its templates do not: each is closed by its owner)."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()
            self._wake()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=_LET_GO_TIMEOUT + 2 * _REPORT_TIMEOUT)

    def _wake(self) -> None:
        """(Under _changed, its state changed:) every watch looks whether its zygote is still wanted."""
        for fd in self._wakes.values():
            try:
                os.write(fd, b"\0")
            except BlockingIOError:  # woken already, and not yet read: it looks anyway
                pass

    def _ready_zygote(self) -> Template | None:
        """The zygote, started (on its own thread) if there is none or it died; None if it cannot be had."""
        with self._changed:
            zygote = self._zygote
            if zygote is not None and (zygote.broken or zygote.process.poll() is not None):
                zygote = self._zygote = None
                self._changed.notify_all()
                self._wake()  # its thread lets go of it
            while zygote is None and not self._closed:
                if self._failed is not None:
                    return None
                if not self._starting:
                    self._starting = True
                    self._thread = threading.Thread(target=self._keep_zygote, name="pynox-zygote", daemon=True)
                    self._thread.start()
                self._changed.wait()
                zygote = self._zygote
        return zygote

    def _keep_zygote(self) -> None:
        """Start the zygote, then live as long as it is needed (it dies with the thread that started it), reading
        its reports of its templates' ends; then close it."""
        zygote: Template | None
        try:
            zygote = self._start(zygote=True)
        except Exception as exc:  # templates are started by exec, as before; the log says why
            _log.warning("could not start the zygote templates are forked from (%s: %s); each template is started "
                         "by exec", type(exc).__name__, exc)
            zygote = None
            failed: str | None = f"{type(exc).__name__}: {exc}"
        else:
            failed = None
        with self._changed:
            self._starting = False
            self._failed = failed
            if zygote is not None and not self._closed:
                self._zygote = zygote
            self._changed.notify_all()
        if zygote is None:
            return
        died = self._watch(zygote)
        with self._changed:
            if self._zygote is zygote:
                self._zygote = None
                self._changed.notify_all()
        with self._lock:
            self._read_reports(zygote)  # the ends it reported before it ended, or before it was let go
        zygote.close()
        with self._lock:
            orphans = self._forked.pop(zygote.pid, {})
        for forked in orphans.values():
            forked.orphaned()
        if died or zygote.process.poll() not in (None, 0):
            self._event("zygote_died", f"the zygote {zygote.pid} {_ended(zygote.process.poll())}; the "
                                       f"{len(orphans)} templates it forked still running serve on (their ends "
                                       "are not reported), and the next template is forked from a new zygote")

    def _watch(self, zygote: Template) -> bool:
        """Read the zygote's reports until it is no longer wanted (False) or it is over (True: it died)."""
        wake, woken = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        poller = select.poll()
        poller.register(zygote.sock.fileno(), select.POLLIN)
        poller.register(wake, select.POLLIN)
        try:
            with self._changed:
                self._wakes[id(zygote)] = woken
            while True:
                with self._changed:
                    if self._closed or self._zygote is not zygote:
                        return False
                for fd, _ in poller.poll():
                    if fd == wake:
                        os.read(wake, 64)
                    else:
                        with self._lock:
                            if not self._read_reports(zygote):
                                return True
        finally:
            with self._changed:
                del self._wakes[id(zygote)]
            os.close(wake)
            os.close(woken)

    def _read_reports(self, zygote: Template) -> bool:
        """Read what the zygote has sent (under _lock): its reports of templates' ends. False once it is over."""
        while readable(zygote.sock.fileno(), 0):
            try:
                frame, fds = recv_frame(zygote.sock)
            except (OSError, EOFError, ValueError, msgspec.DecodeError):
                zygote.broken = True
                return False
            for fd in fds:
                os.close(fd)
            if not isinstance(frame, Reaped):
                zygote.broken = True
                return False
            self._reaped(zygote, frame)
        return True

    def _reaped(self, zygote: Template, report: Reaped) -> None:
        forked = self._forked.get(zygote.pid, {}).pop(report.pid, None)
        if forked is not None:
            forked.reaped(report)

    def _spawn(self, zygote: Template) -> tuple[ForkedProcess, socket.socket]:
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            with self._lock:
                try:
                    send_frame(zygote.sock, Spawn(), [child.fileno()])
                    zygote.sock.settimeout(_SPAWN_TIMEOUT)
                    while True:  # the ends it reported meanwhile, then its answer
                        frame, fds = recv_frame(zygote.sock)
                        if not isinstance(frame, Reaped) or fds:
                            break
                        self._reaped(zygote, frame)
                    zygote.sock.settimeout(None)
                except (OSError, EOFError, ValueError, msgspec.DecodeError) as exc:
                    zygote.broken = True
                    raise PoolWorkerError(f"the zygote did not fork a template: {exc}", transient=True) from None
                if not isinstance(frame, Spawned) or len(fds) != 1:
                    for fd in fds:
                        os.close(fd)
                    zygote.broken = True
                    raise PoolWorkerError(f"the zygote sent {type(frame).__name__} instead of Spawned",
                                          transient=True)
                forked = ForkedProcess(frame.pid, fds[0])
                self._forked.setdefault(zygote.pid, {})[frame.pid] = forked
        except BaseException:
            parent.close()
            raise
        finally:
            child.close()
        return forked, parent


def _ended(status: int | None) -> str:
    """How a process ended, from its status as subprocess.Popen gives it."""
    if status is None:
        return "stopped answering"
    if status < 0:
        try:
            return f"was killed by {signal.Signals(-status).name}"
        except ValueError:
            return f"was killed by signal {-status}"
    return f"exited with status {status}"
