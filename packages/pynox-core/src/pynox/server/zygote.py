"""Sessions' templates forked from one warm zygote, instead of each started by exec and importing its preloads.

Why a session has a template of its own: a template's cgroups (memory,
threads, CPU, see policy/cgroups.py) are its job's, its limit set before each
job from what the template holds, and a template serves one child at a time;
a session's child lives for the whole session, so its template is held as long.
That stays: each session still has its own template process, its own cgroups,
its own child, and its template serves nobody else and ends with it.

What changes is where that template comes from. A zygote is a template (the
same bootstrap, preloads, proofs and prepared policy) that forks templates and
never a job's child, so it has never held anything of any job. A session's
template is a fork of it, which the pool puts in cgroups of its own before it
sends the template its Init (:class:`~pynox.server.templates.Template` does so
for every template, forked or started), so it forks nothing before its child's
bounds are its own. Pages of the preloaded interpreter are shared copy-on-write
by the zygote and every session's template and child: an idle session costs
what its template and child have written since, not a whole interpreter with
its preloads. Pages the zygote dirtied stay charged to the zygote's cgroup; a
session's template and child are charged for what they write themselves.

One zygote per pool, started on a thread of its own that lives as long as the
pool (a template dies with the thread that started it, see set_parent_death_signal):
the preload of the pool, as the workers'. The templates it forked die with it
(their parent-death signal), and with them the sessions they serve, as a job
dies with its worker's template. A zygote that died or stopped answering is
replaced for the next session; if one cannot be started, sessions start their
own templates by exec, as before, and the log says why.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

import msgspec

from ..errors import PoolWorkerError
from ..wire.frames import Spawn, Spawned, recv_frame, send_frame
from .waiting import readable

if TYPE_CHECKING:
    from .templates import Template

__all__ = ["ForkedProcess", "SessionTemplates"]

_log = logging.getLogger(__name__)

_SPAWN_TIMEOUT = 30.0  # seconds for the zygote to fork: milliseconds, unless the machine is swapping


class ForkedProcess:
    """A template forked by the zygote, as the pool sees it: the zygote is its parent and reaps it, so the pool
    holds its pidfd (no pid reuse) and knows whether it lives, not its exit status."""

    def __init__(self, pid: int, pidfd: int) -> None:
        self.pid = pid
        self._pidfd: int | None = pidfd

    def poll(self) -> int | None:
        """None while it lives, else -1 (its status is the zygote's)."""
        if self._pidfd is None:
            return -1
        return -1 if readable(self._pidfd, 0) else None

    def wait(self, timeout: float | None = None) -> int:
        if self._pidfd is not None and not readable(self._pidfd, timeout):
            raise subprocess.TimeoutExpired("pynox-template", timeout or 0.0)
        self._close()
        return -1

    def kill(self) -> None:
        if self._pidfd is not None:
            try:
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def _close(self) -> None:
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None


class SessionTemplates:
    """Templates for sessions: forked from the pool's zygote, or (none can be had) started by exec.

    ``start``: a template started by exec, with ``zygote=True`` a zygote, or with ``spawn`` one forked by it."""

    def __init__(self, start: Callable[..., Template]) -> None:
        self._start = start
        self._lock = threading.Lock()  # one Spawn at a time on the zygote's socket
        self._changed = threading.Condition()
        self._zygote: Template | None = None
        self._starting = self._closed = False
        self._failed: str | None = None
        self._thread: threading.Thread | None = None

    def new_template(self) -> Template:
        zygote = self._ready_zygote()
        if zygote is not None:
            try:
                return self._start(spawn=lambda: self._spawn(zygote))
            except PoolWorkerError as exc:
                if not zygote.broken:
                    raise  # the forked template failed, not the zygote: as a template started by exec would
                _log.warning("the zygote failed (%s); this session's template is started by exec, the next "
                             "session's forked from a new zygote", exc)
        return self._start()

    def close(self) -> None:
        with self._changed:
            self._closed = True
            zygote, self._zygote = self._zygote, None
            self._changed.notify_all()
        if zygote is not None:
            zygote.close()

    def _ready_zygote(self) -> Template | None:
        """The zygote, started (on its own thread) if there is none or it died; None if it cannot be had."""
        dead: Template | None = None
        with self._changed:
            zygote = self._zygote
            if zygote is not None and (zygote.broken or zygote.process.poll() is not None):
                dead, zygote = zygote, None
                self._zygote = None
                self._changed.notify_all()  # its thread lets go of it
            while zygote is None and not self._closed:
                if self._failed is not None:
                    return None
                if not self._starting:
                    self._starting = True
                    self._thread = threading.Thread(target=self._keep_zygote, name="pynox-zygote", daemon=True)
                    self._thread.start()
                self._changed.wait()
                zygote = self._zygote
        if dead is not None:
            dead.close()
        return zygote

    def _keep_zygote(self) -> None:
        """Start the zygote, then live as long as it is needed: it dies with the thread that started it."""
        zygote: Template | None
        try:
            zygote = self._start(zygote=True)
        except Exception as exc:  # sessions start their own templates, as before; the log says why
            _log.warning("could not start the zygote sessions' templates are forked from (%s: %s); each session "
                         "starts its own template", type(exc).__name__, exc)
            zygote = None
            failed: str | None = f"{type(exc).__name__}: {exc}"
        else:
            failed = None
        with self._changed:
            self._starting = False
            if self._closed and zygote is not None:
                closing, zygote = zygote, None
            else:
                closing = None
                self._zygote, self._failed = zygote, failed
            self._changed.notify_all()
            started = zygote
            # Live while it is this zygote: a later one (this one died) is started by a thread of its own.
            while not self._closed and self._zygote is started and started is not None:
                self._changed.wait(timeout=1.0)
                if started.process.poll() is not None:
                    break
        if closing is not None:
            closing.close()

    def _spawn(self, zygote: Template) -> tuple[ForkedProcess, socket.socket]:
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            with self._lock:
                try:
                    send_frame(zygote.sock, Spawn(), [child.fileno()])
                    zygote.sock.settimeout(_SPAWN_TIMEOUT)
                    frame, fds = recv_frame(zygote.sock)
                    zygote.sock.settimeout(None)
                except (OSError, EOFError, ValueError, msgspec.DecodeError) as exc:
                    zygote.broken = True
                    raise PoolWorkerError(f"the zygote did not fork a template: {exc}", transient=True) from None
            if not isinstance(frame, Spawned) or len(fds) != 1:
                for fd in fds:
                    os.close(fd)
                zygote.broken = True
                raise PoolWorkerError(f"the zygote sent {type(frame).__name__} instead of Spawned", transient=True)
        except BaseException:
            parent.close()
            raise
        finally:
            child.close()
        return ForkedProcess(frame.pid, fds[0]), parent
