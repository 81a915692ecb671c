"""Changing the mode, owner or times of a job's own files, done by the pool on the job's behalf.

Landlock governs contents and names, not metadata, and a job that keeps uid 0
owns most of the host's files: if the kernel ran ``chmod``, ``chown`` or
``utimensat`` for the job, it could make ``/etc/shadow`` world-readable. So the
job's seccomp filter delegates those calls (``SECCOMP_RET_USER_NOTIF``) and its
listener is handed to the pool before the job's code runs; the job never holds
it. For each call the :class:`Steward` reads the arguments from the job's
memory, opens what they name as the job would (from its working directory or
its descriptor, reopened ``O_PATH`` through ``/proc/<tid>``: the pool never
holds the job's open file, whose last close could block it, a lingering socket
say), and performs the change itself, with its own system call on the very
inode it checked, only if:

* that inode is beneath one of the job's write grants (found again from the
  grant's descriptor, by the name the kernel gives it now, and compared by
  device and inode), and
* the job's uid would be allowed by the kernel without capabilities: the owner
  changes mode and times, and group to its own gid; anyone who may write the
  file sets its times to now; and no one sets the setuid bit, or the setgid bit
  of a file (in a write grant that would be a program of the pool's uid any
  host user could run).

Otherwise the call fails with the errno the kernel would give (``EPERM`` for a
file outside the write grants). The job's memory may change after it was read:
the answer is for what was read, as if the job had passed that. A pool that is
not allowed to reach into its jobs (not root) answers ``EPERM`` to every call.

The steward also answers the job's ``sysinfo`` with the job's own view (see
:mod:`.own_view`): it is the one holder of the job's listener.
The steward's phases, for one job, as the server sees them (:class:`StewardLife`)::

    AWAITING ──listener──▶ ARRIVED ──serve──▶ SERVING ──hung up──▶ GONE
       │                      │                  │                  │
       │ no listener (EOF)    │                  │                  │
       ▼                      │                  │                  │
    UNSENT ───────────────────┴──────close───────┴──────────────────┴──▶ CLOSED
       (and from AWAITING, close)

``AWAITING``: the job was sent; its child sends its listener on a socket of
its own (or, prepared ahead, on its control socket) before its code runs.
``ARRIVED``: the listener is here; the serving loop starts answering at its
next turn. ``UNSENT``: the socket closed without one (the child failed before
it confined itself): nothing will be delegated. ``SERVING``: each call is
answered as it comes (:meth:`Steward.answer`); a session's steward serves every
step of it. ``GONE``: the listener hung up, the job's tasks are gone.
``CLOSED``: the listener and the write grants' descriptors are closed: the pool
holds nothing of the job's once its result left (or the child was reaped).
Any other move is a bug in the server, refused as a :class:`PoolWorkerError`
(the template is then replaced).

Where calls are answered. Not on the worker thread that enforces the job's
deadline: a call's cost is the pool's, but its arguments are the job's, and no
work the job can make bigger may stand between a deadline and its kill. Each
template has a :class:`StewardThread`, which answers the delegated calls (and
watches the blocking connects) of the job it serves while the worker thread
only watches the clock and kills. Until the job's first delegated call the worker's loop watches the
listener itself (a readable listener takes no work the job chooses) and hands it over at that call: most
jobs make none, and then cost no wake-up of the thread. Every call has a bounded cost: a path of at
most ``PATH_MAX`` bytes, a ``sockaddr_storage``, fixed-size ``/proc`` files, a
walk over the job's write grants; none reads anything whose size the job
chooses (``sysinfo`` writes without reading ``maps``, see :mod:`.own_view`).
The CPU the thread spends on a job is counted for it (:meth:`StewardThread.take_cpu`).
"""

from __future__ import annotations

import ctypes
import enum
import errno
import logging
import os
import re
import select
import socket
import stat
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import PoolWorkerError
from ..hosts import AllowList
from ..policy._libc import libc
from ..policy.grants import close_all, open_at
from ..policy.seccomp import syscall_number
from .egress import CONNECT, Connector, descriptor_flags
from .egress import Refused as _Refused
from .fork_gate import FORKS, ForkWindow
from .own_view import write_sysinfo
from .waiting import readable

_log = logging.getLogger(__name__)

__all__ = ["Steward", "StewardLife", "StewardPhase", "StewardThread", "receive_listener"]

# <linux/seccomp.h>: struct seccomp_notif (80 bytes) and seccomp_notif_resp (24), and their ioctls.
_NOTIF = struct.Struct("=QII iIQ 6Q")
_RESPONSE = struct.Struct("=QqiI")
_NOTIF_RECV = 0xC0502100
_NOTIF_SEND = 0xC0182101
_NOTIF_ID_VALID = 0x40082102
_CONTINUE = 1  # SECCOMP_USER_NOTIF_FLAG_CONTINUE: the kernel runs the call as the job made it
_AT_FDCWD = -100
_AT_SYMLINK_NOFOLLOW = 0x100
_AT_EMPTY_PATH = 0x1000
_PATH_MAX = 4096
_PAGE = os.sysconf("SC_PAGE_SIZE")
_UTIME_NOW = (1 << 30) - 1
_UTIME_OMIT = (1 << 30) - 2
_NO_ID = 0xFFFF_FFFF  # (uid_t) -1: leave it as it is

libc.ioctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p]
libc.process_vm_readv.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_ulong,
                                  ctypes.c_ulong]
libc.process_vm_readv.restype = ctypes.c_ssize_t
libc.fchownat.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32, ctypes.c_uint32, ctypes.c_int]
libc.utimensat.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_int]


class _Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


class _Gone(Exception):
    """The calling task is gone (killed): there is no one to answer."""


@dataclass(frozen=True)
class _Call:
    """A delegated call, as ``(dirfd, path, follow)`` plus what to change; ``path`` None: ``dirfd`` itself."""

    kind: str  # "mode", "owner" or "times"
    dirfd: int
    path: int | None  # address in the job's memory
    flags: int
    values: tuple[int, ...]


def _signed(value: int) -> int:
    value &= 0xFFFF_FFFF
    return value - (1 << 32) if value >= 1 << 31 else value


# How each delegated call lays out its arguments: (kind, dirfd, path address, flags, values).
_Decoder = Callable[[tuple[int, ...]], _Call]
_CALLS: dict[str, _Decoder] = {
    "chmod": lambda a: _Call("mode", _AT_FDCWD, a[0], 0, (a[1],)),
    "fchmodat": lambda a: _Call("mode", _signed(a[0]), a[1], 0, (a[2],)),
    "fchmodat2": lambda a: _Call("mode", _signed(a[0]), a[1], _signed(a[3]), (a[2],)),
    "fchmod": lambda a: _Call("mode", _signed(a[0]), None, 0, (a[1],)),
    "chown": lambda a: _Call("owner", _AT_FDCWD, a[0], 0, (a[1], a[2])),
    "lchown": lambda a: _Call("owner", _AT_FDCWD, a[0], _AT_SYMLINK_NOFOLLOW, (a[1], a[2])),
    "fchownat": lambda a: _Call("owner", _signed(a[0]), a[1], _signed(a[4]), (a[2], a[3])),
    "fchown": lambda a: _Call("owner", _signed(a[0]), None, 0, (a[1], a[2])),
    # utimensat(fd, NULL, times, 0) is futimens(fd, times): the descriptor itself.
    "utimensat": lambda a: _Call("times", _signed(a[0]), a[1] or None, _signed(a[3]), (a[2],)),
}
_BY_NUMBER = {number: decode for name, decode in _CALLS.items() if (number := syscall_number(name)) >= 0}
# Not metadata: the job's own view of the system, written into its memory (see own_view.py).
_SYSINFO = syscall_number("sysinfo")


def receive_listener(sock: socket.socket, flags: int = 0) -> int | None:
    """The listener a child sends on its metadata socket (see ``job/setup.py``); None at EOF. With
    ``socket.MSG_DONTWAIT``: :class:`BlockingIOError` if it has not been sent yet."""
    try:
        _, fds, _, _ = socket.recv_fds(sock, 1, 1, flags)
    except BlockingIOError:
        if flags & socket.MSG_DONTWAIT:
            raise
        return None
    except OSError:
        return None
    for extra in fds[1:]:
        os.close(extra)
    return fds[0] if fds else None


class Steward:
    """Answers one job's delegated calls. Owns the listener and the write grants' descriptors it is given."""

    def __init__(self, listener: int, write_grants: list[int], uid: int, gid: int,
                 hosts: AllowList | None = None, family: list[ForkWindow | None] | None = None) -> None:
        """``family``: the fork window the stewards of a session and of its fork's copies share (they serve one
        listener, so any of them may receive the session's fork); None: one of its own."""
        self.listener = listener
        self._grants = write_grants
        self._uid, self._gid = uid, gid
        self._poll = select.poll()
        self._poll.register(listener, select.POLLIN)
        # With allow_hosts: the job's connects, made here (see egress.py); None: every connect is refused.
        self.connector = Connector(hosts, listener) if hosts is not None else None
        # A session fork the pool asked for (see fork_gate.py); None: every fork is refused.
        self.family: list[ForkWindow | None] = family if family is not None else [None]

    @property
    def forks(self) -> ForkWindow | None:
        return self.family[0]

    @forks.setter
    def forks(self, window: ForkWindow | None) -> None:
        self.family[0] = window

    def duplicates(self) -> tuple[int, list[int]]:
        """Copies of the listener and of the write grants' descriptors, for the steward of a fork's copy."""
        listener = os.dup(self.listener)
        return listener, [os.dup(fd) for fd in self._grants]

    def close(self) -> None:
        if self.connector is not None:
            self.connector.close()
        close_all([self.listener, *self._grants])
        self._grants = []

    def answer(self) -> bool:
        """Receive one call and answer it. False once the job is gone (the listener will say nothing more)."""
        # Receiving blocks until a call comes: only when one is pending (a caller interrupted since then
        # makes it fail with ENOENT instead, never block).
        events = dict(self._poll.poll(0)).get(self.listener, 0)
        if not events & select.POLLIN:
            return not events & (select.POLLHUP | select.POLLERR | select.POLLNVAL)
        raw = ctypes.create_string_buffer(_NOTIF.size)  # zeroed, as the kernel requires
        if libc.ioctl(self.listener, _NOTIF_RECV, raw) != 0:
            return True  # ENOENT: the caller was interrupted meanwhile; EINTR: ours was
        notif_id, tid, _, nr, _, _, *args = _NOTIF.unpack(raw.raw)
        if nr in FORKS:  # refused as the filter refused it, unless the pool armed a session fork
            window = self.forks
            if window is not None and window.admit(tid, nr, tuple(args), lambda: self._valid(notif_id)):
                self._send(notif_id, 0, 0, _CONTINUE)
            else:
                self._send(notif_id, 0, -errno.EPERM, 0)
            return True
        try:
            value = self._perform(notif_id, tid, nr, tuple(args))
            if value is None:  # a connect in progress: answered once it is made (connected)
                return True
            answer = (notif_id, value, 0, 0)
        except _Refused as refused:
            answer = (notif_id, 0, -refused.errno, 0)
        except _Gone:
            return True
        except Exception:  # fail closed: whatever went wrong here, the change is not made
            answer = (notif_id, 0, -errno.EPERM, 0)
        self._send(*answer)
        return True

    def _send(self, notif_id: int, value: int, error: int, flags: int) -> None:
        response = ctypes.create_string_buffer(_RESPONSE.pack(notif_id, value, error, flags), _RESPONSE.size)
        libc.ioctl(self.listener, _NOTIF_SEND, response)  # ENOENT: the caller is gone; nothing to answer

    def connected(self, sock: int) -> None:
        """A socket whose blocking connect the job waits for became writable: answer the job's call."""
        assert self.connector is not None
        notif_id, error = self.connector.connected(sock)
        self._send(notif_id, 0, error, 0)

    def _valid(self, notif_id: int) -> bool:
        """Whether the call is still waiting for its answer, so its tid still names the job's task."""
        buffer = ctypes.c_uint64(notif_id)
        return bool(libc.ioctl(self.listener, _NOTIF_ID_VALID, ctypes.byref(buffer)) == 0)

    def _perform(self, notif_id: int, tid: int, nr: int, args: tuple[int, ...]) -> int | None:
        if nr == CONNECT:
            if self.connector is None:  # only a job with allow_hosts delegates its connects
                raise _Refused(errno.EPERM)
            return self.connector.begin(notif_id, tid, _signed(args[0]), args[1], args[2] & 0xFFFF_FFFF, _read,
                                        self._valid, _thread_group)
        if nr == _SYSINFO:
            try:
                if not write_sysinfo(tid, args[0], lambda: self._valid(notif_id)):
                    raise _Gone
            except OSError as exc:  # EFAULT as the kernel gives it; anything else (no reach): EPERM
                raise _Refused(errno.EFAULT if exc.errno == errno.EFAULT else errno.EPERM) from None
            return 0
        decode = _BY_NUMBER.get(nr)
        if decode is None:
            raise _Refused(errno.ENOSYS)
        call = decode(args)
        if call.flags & ~(_AT_SYMLINK_NOFOLLOW | _AT_EMPTY_PATH):
            raise _Refused(errno.EINVAL)
        if call.path is None and call.dirfd == _AT_FDCWD:  # fchmod(AT_FDCWD), utimensat(AT_FDCWD, NULL)
            raise _Refused(errno.EFAULT if call.kind == "times" else errno.EBADF)
        if call.path is None and call.kind == "times" and call.flags:
            raise _Refused(errno.EINVAL)
        times = _read_times(tid, call.values[0]) if call.kind == "times" and call.values[0] else None
        if times is not None and _nanoseconds(times) == (_UTIME_OMIT, _UTIME_OMIT):
            return 0  # nothing to change: the kernel answers 0 before it looks the path up
        path = _read_path(tid, call.path) if call.path is not None else None
        dirfd = call.dirfd
        own = _own_descriptor(path, tid) if path is not None else None
        if own is not None:  # /proc/self/fd/N names the job's descriptor N, as the kernel follows it
            dirfd, path = own, b""
            call = _Call(call.kind, dirfd, call.path, call.flags | _AT_EMPTY_PATH, call.values)
        elif path is None and _is_o_path(tid, dirfd):
            raise _Refused(errno.EBADF)  # fchmod, fchown, futimens do not take an O_PATH descriptor
        base = self._base(tid, dirfd, needed=path is None or not path.startswith(b"/"))
        try:
            # Everything of the job's is read; only now can we trust that it was this job's (the tid of a
            # killed job could name another process by now).
            if not self._valid(notif_id):
                raise _Gone
            target = self._open(base, path, call.flags)
        finally:
            if base is not None:
                os.close(base)
        try:
            info = os.fstat(target)
            if not self._in_write_grant(target, info):
                raise _Refused(errno.EPERM)
            return self._change(call, target, info, times)
        finally:
            os.close(target)

    @staticmethod
    def _base(tid: int, dirfd: int, *, needed: bool) -> int | None:
        """The directory (or file) a call starts from, as the job has it: its working directory or its
        descriptor, opened O_PATH here (never a copy of the job's open file: see the module's docstring)."""
        if not needed:
            return None
        where = f"/proc/{tid}/cwd" if dirfd == _AT_FDCWD else f"/proc/{tid}/fd/{dirfd}"
        if dirfd != _AT_FDCWD and dirfd < 0:
            raise _Refused(errno.EBADF)
        try:
            return os.open(where, os.O_PATH | os.O_CLOEXEC)
        except OSError as exc:
            raise _Refused(errno.EBADF if exc.errno == errno.ENOENT and dirfd != _AT_FDCWD
                           else exc.errno or errno.EPERM) from None

    @staticmethod
    def _open(base: int | None, path: bytes | None, flags: int) -> int:
        if path is None or (path == b"" and flags & _AT_EMPTY_PATH):
            assert base is not None
            return os.dup(base)
        if path == b"":
            raise _Refused(errno.ENOENT)
        nofollow = os.O_NOFOLLOW if flags & _AT_SYMLINK_NOFOLLOW else 0
        try:
            # The pool's own view of the path: /proc/self here is the pool's, which is no grant of the job.
            return open_at(base if base is not None else _AT_FDCWD, path, os.O_PATH | nofollow, beneath=False)
        except OSError as exc:
            raise _Refused(exc.errno or errno.EPERM) from None

    def _in_write_grant(self, target: int, info: os.stat_result) -> bool:
        """Whether the file is a write grant or beneath one: found again from the grant's descriptor by the
        name the kernel gives the file now, without following a symlink, and compared by inode."""
        name = _name(target)
        for grant in self._grants:
            granted = os.fstat(grant)
            if (granted.st_dev, granted.st_ino) == (info.st_dev, info.st_ino):
                return True
            root = _name(grant)
            if name is None or root is None or not stat.S_ISDIR(granted.st_mode):
                continue
            prefix = root.rstrip(b"/") + b"/"
            if not name.startswith(prefix):
                continue
            try:
                again = open_at(grant, name[len(prefix):], os.O_PATH | os.O_NOFOLLOW, beneath=True)
            except OSError:
                continue
            try:
                found = os.fstat(again)
            finally:
                os.close(again)
            if (found.st_dev, found.st_ino) == (info.st_dev, info.st_ino):
                return True
        return False

    def _change(self, call: _Call, target: int, info: os.stat_result, times: bytes | None) -> int:
        owner = info.st_uid == self._uid
        if call.kind == "mode":
            mode = call.values[0] & 0o7777
            if stat.S_ISLNK(info.st_mode):
                raise _Refused(errno.EOPNOTSUPP)  # as the kernel answers for a symlink's own mode
            if not owner:
                raise _Refused(errno.EPERM)
            if mode & stat.S_ISUID or (mode & stat.S_ISGID and not stat.S_ISDIR(info.st_mode)):
                raise _Refused(errno.EPERM)
            os.chmod(f"/proc/self/fd/{target}", mode)
            return 0
        if call.kind == "owner":
            uid, gid = call.values[0] & _NO_ID, call.values[1] & _NO_ID
            if not owner or uid not in (_NO_ID, info.st_uid) or gid not in (_NO_ID, info.st_gid, self._gid):
                raise _Refused(errno.EPERM)
            _check(libc.fchownat(target, b"", uid, gid, _AT_EMPTY_PATH))
            return 0
        touch = times is None or _nanoseconds(times) == (_UTIME_NOW, _UTIME_NOW)
        if not owner and not (touch and self._may_write(info)):
            raise _Refused(errno.EPERM if not touch else errno.EACCES)
        pointer = ctypes.create_string_buffer(times, len(times)) if times is not None else None
        _check(libc.utimensat(target, b"", pointer, _AT_EMPTY_PATH))
        return 0

    def _may_write(self, info: os.stat_result) -> bool:
        """The permission bits' answer for the job's uid and gid (it holds no capability to override them)."""
        if info.st_uid == self._uid:
            return bool(info.st_mode & stat.S_IWUSR)
        if info.st_gid == self._gid:
            return bool(info.st_mode & stat.S_IWGRP)
        return bool(info.st_mode & stat.S_IWOTH)



class StewardPhase(enum.Enum):
    __hash__ = object.__hash__  # by identity, as lifecycle.ChildState's (a C slot, not a Python call)
    AWAITING = "awaiting"
    ARRIVED = "arrived"
    UNSENT = "unsent"
    SERVING = "serving"
    GONE = "gone"
    CLOSED = "closed"


_MOVES: dict[StewardPhase, frozenset[StewardPhase]] = {
    StewardPhase.AWAITING: frozenset({StewardPhase.ARRIVED, StewardPhase.UNSENT, StewardPhase.CLOSED}),
    StewardPhase.ARRIVED: frozenset({StewardPhase.SERVING, StewardPhase.CLOSED}),
    StewardPhase.UNSENT: frozenset({StewardPhase.CLOSED}),
    StewardPhase.SERVING: frozenset({StewardPhase.GONE, StewardPhase.CLOSED}),
    StewardPhase.GONE: frozenset({StewardPhase.CLOSED}),
    StewardPhase.CLOSED: frozenset(),
}


class StewardLife:
    """One job's steward, from the socket its listener arrives on until it is closed (see the module's
    diagram). Owns the socket, the listener and the write grants' descriptors it is given."""

    def __init__(self, sock: socket.socket | None, writes: list[int], uid: int, gid: int,
                 hosts: AllowList | None = None) -> None:
        """``sock``: None only for a copy's (see for_copy)."""
        self.phase = StewardPhase.AWAITING
        self.hosts = hosts
        self.sock: socket.socket | None = sock  # AWAITING: where the listener arrives
        self._writes = writes
        self._uid, self._gid = uid, gid
        self._listener: int | None = None  # ARRIVED: not yet served
        self.steward: Steward | None = None  # SERVING and GONE: it answers, and owns listener and grants
        self._family: list[ForkWindow | None] | None = None

    def for_copy(self) -> StewardLife:
        """The steward of a session fork's copy, ARRIVED: the same listener (the copy inherited the filter),
        grants and ids, and the same fork window. Only while this one serves."""
        if self.steward is None or self.phase is not StewardPhase.SERVING:
            raise PoolWorkerError("the session's delegated calls are not served: it cannot be forked")
        listener, writes = self.steward.duplicates()
        copy = StewardLife(None, writes, self._uid, self._gid, self.hosts)
        copy._listener = listener
        copy._family = self.steward.family
        copy.phase = StewardPhase.ARRIVED
        return copy

    def _check(self, phase: StewardPhase) -> None:
        if phase not in _MOVES[self.phase]:
            raise PoolWorkerError(f"the pool lost track of its job's delegated calls "
                                  f"({self.phase.value} -> {phase.value})")

    def _move(self, phase: StewardPhase) -> None:
        self._check(phase)
        self.phase = phase

    def take_listener(self, *, waiting: bool = True) -> bool:
        """AWAITING -> ARRIVED, the child sent its listener; or -> UNSENT, it closed the socket (its setup
        failed before). ``waiting=False``: only if it is there already (False: nothing read, still AWAITING),
        one ``recvmsg`` where a poll asked first and a ``recvmsg`` followed (a child prepared ahead sent it
        before its job came: on every handed job's path)."""
        self._check(StewardPhase.ARRIVED)
        assert self.sock is not None
        try:
            listener = receive_listener(self.sock, 0 if waiting else socket.MSG_DONTWAIT)
        except BlockingIOError:
            return False
        self.sock.close()
        self.sock = None
        self._listener = listener
        self._move(StewardPhase.ARRIVED if listener is not None else StewardPhase.UNSENT)
        return True

    @property
    def listener(self) -> int | None:
        """ARRIVED: the listener, which the worker watches until the job's first call (see StewardThread)."""
        return self._listener

    def serve(self) -> Steward:
        """ARRIVED -> SERVING: from now on its calls are answered; the caller waits on its listener."""
        self._move(StewardPhase.SERVING)
        assert self._listener is not None
        self.steward = Steward(self._listener, self._writes, self._uid, self._gid, self.hosts, self._family)
        self._listener, self._writes = None, []
        return self.steward

    def answer(self) -> bool:
        """SERVING: answer one call; False (-> GONE) once the job is gone and the listener says no more."""
        self._check(StewardPhase.GONE)
        assert self.steward is not None
        if self.steward.answer():
            return True
        self._move(StewardPhase.GONE)
        return False

    def close(self) -> None:
        """-> CLOSED, from any phase: the pool lets go of everything of the job's (closing twice is one close)."""
        if self.phase is StewardPhase.CLOSED:
            return
        self._move(StewardPhase.CLOSED)
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        if self.steward is not None:
            self.steward.close()
        close_all([*([self._listener] if self._listener is not None else []), *self._writes])
        self._listener, self._writes = None, []

class StewardThread:
    """Answers the delegated calls of the job its template serves, on a thread of its own (see the module's
    docstring): started once per template, at its first job that delegates a call, so a job pays no thread
    start. :meth:`serve` hands it a job's steward at that job's first call (until then the worker's loop
    watches the listener: a job that delegates nothing costs no wake-up of this thread); :meth:`release` takes
    it back, and returns once the thread no longer touches it (a call being answered is finished first: its
    cost is bounded), so that the steward may then be closed."""

    def __init__(self, name: str) -> None:
        self._wake_read, self._wake_write = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self._lock = threading.Lock()
        self._life: StewardLife | None = None
        self._stopping = False
        self._idle = threading.Event()
        self._idle.set()
        self._cpu_ns = 0  # spent answering since take_cpu last asked
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def serve(self, life: StewardLife) -> None:
        """Answer ``life``'s calls (it is SERVING) from now on, until :meth:`release`."""
        with self._lock:
            assert self._life is None, "one job's steward at a time"
            self._life = life
            self._idle.clear()
        self._wake()

    def release(self, timeout: float) -> bool:
        """Stop answering; True once the thread let go of the steward (False: not within ``timeout``). A thread
        that holds none (the job delegated no call) is neither woken nor waited for."""
        with self._lock:
            if self._life is None and self._idle.is_set():
                return True
            self._life = None
        self._wake()
        return self._idle.wait(timeout)

    def take_cpu(self) -> int:
        """CPU time (µs) the thread spent on delegated calls since last asked: the pool's work for the job."""
        with self._lock:
            used, self._cpu_ns = self._cpu_ns, 0
        return used // 1000

    def close(self, timeout: float) -> None:
        with self._lock:
            self._life, self._stopping = None, True
        self._wake()
        self._thread.join(timeout)
        if not self._thread.is_alive():
            os.close(self._wake_read)
            os.close(self._wake_write)

    def _wake(self) -> None:
        try:
            os.write(self._wake_write, b"x")
        except BlockingIOError:
            pass  # already woken

    def _run(self) -> None:
        while True:
            with self._lock:
                life, stopping = self._life, self._stopping
                if life is None:
                    self._idle.set()
            if stopping:
                return
            if life is None:
                readable(self._wake_read)
                self._drain()
                continue
            try:
                self._serve_once(life)
            except Exception:  # a bug here must not leave the job's calls unanswered for ever, nor the pool
                _log.exception("the pool failed while answering a job's delegated call")
                with self._lock:
                    if self._life is life:
                        self._life = None

    def _serve_once(self, life: StewardLife) -> None:
        steward = life.steward
        assert steward is not None
        poll = select.poll()
        poll.register(self._wake_read, select.POLLIN)
        if life.phase is StewardPhase.SERVING:
            poll.register(steward.listener, select.POLLIN)
        connector = steward.connector
        if connector is not None:
            for sock in connector.waiting:
                poll.register(sock, select.POLLOUT)
        for fd, events in poll.poll():
            if fd == self._wake_read:
                self._drain()
                return  # asked to let go, or to look again
            if fd == steward.listener and not events & select.POLLIN:
                life.answer()  # hung up: the job is gone, nothing to answer (nor to count)
                continue
            started = time.thread_time_ns()
            if fd == steward.listener:
                life.answer()
            else:
                steward.connected(fd)
            with self._lock:
                self._cpu_ns += time.thread_time_ns() - started

    def _drain(self) -> None:
        try:
            os.read(self._wake_read, 64)
        except BlockingIOError:
            pass


_OWN_DESCRIPTOR = re.compile(rb"/(?:proc/(?:self|thread-self|(\d+))|dev)/fd/(\d+)")


def _own_descriptor(path: bytes, tid: int) -> int | None:
    """N, when ``path`` is the job's own ``/proc/self/fd/N`` (libc's fchmodat falls back to it): resolved
    by the pool, /proc/self would be the pool's, and its magic links are never followed."""
    match = _OWN_DESCRIPTOR.fullmatch(path)
    if match is None or (match.group(1) is not None and int(match.group(1)) != tid
                         and int(match.group(1)) != _thread_group(tid)):
        return None
    return int(match.group(2))


def _thread_group(tid: int) -> int:
    try:
        with open(f"/proc/{tid}/status", "rb") as status:
            for line in status:
                if line.startswith(b"Tgid:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return -1


def _is_o_path(tid: int, fd: int) -> bool:
    """Whether the job's descriptor was opened O_PATH."""
    flags = descriptor_flags(tid, fd)
    return flags is not None and bool(flags & os.O_PATH)


def _check(result: int) -> None:
    if result != 0:
        raise _Refused(ctypes.get_errno())


def _name(fd: int) -> bytes | None:
    try:
        return os.readlink(f"/proc/self/fd/{fd}".encode())
    except OSError:
        return None


def _read(tid: int, address: int, size: int) -> bytes:
    buffer = ctypes.create_string_buffer(size)
    local = _Iovec(ctypes.addressof(buffer), size)
    remote = _Iovec(address, size)
    got = libc.process_vm_readv(tid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
    if got < 0:
        err = ctypes.get_errno()
        raise _Refused(errno.EFAULT if err in (errno.EFAULT, errno.EIO) else errno.EPERM)
    return buffer.raw[:got]


def _read_path(tid: int, address: int) -> bytes:
    """A NUL-terminated path from the job's memory, one page at a time (the next page may be unmapped)."""
    path = b""
    while len(path) < _PATH_MAX:
        size = min(_PAGE - (address % _PAGE), _PATH_MAX - len(path))
        chunk = _read(tid, address, size)
        end = chunk.find(b"\0")
        if end >= 0:
            return path + chunk[:end]
        if len(chunk) < size:
            raise _Refused(errno.EFAULT)
        path += chunk
        address += size
    raise _Refused(errno.ENAMETOOLONG)


def _nanoseconds(times: bytes) -> tuple[int, int]:
    """The tv_nsec of both timespecs of utimensat's ``times`` (where UTIME_NOW and UTIME_OMIT are said)."""
    _, access, _, modification = struct.unpack("=qqqq", times)
    return access, modification


def _read_times(tid: int, address: int) -> bytes:
    times = _read(tid, address, 32)
    if len(times) < 32:
        raise _Refused(errno.EFAULT)
    for nsec in _nanoseconds(times):
        if not (0 <= nsec < 1_000_000_000 or nsec in (_UTIME_NOW, _UTIME_OMIT)):
            raise _Refused(errno.EINVAL)
    return times
