"""A job's TCP connections under ``allow_hosts``, made by the pool on the job's own socket.

Landlock's TCP rules match ports, not addresses, and seccomp cannot read the address a ``connect``
passes. So a job with ``allow_hosts`` does not connect: its filter delegates every ``connect`` to the
pool (``SECCOMP_RET_USER_NOTIF``, see :func:`pynox.policy.seccomp._host_rules`), and here the pool

1. reads the address once from the job's memory (at most a ``sockaddr_storage``),
2. decides on that copy (:class:`pynox.hosts.AllowList`: a listed network, or an address a listed name
   had when the job started, on a listed port),
3. takes the job's socket itself (``pidfd_getfd``, after checking that the call is still waiting, so
   that the thread id still names the job), and
4. connects it with its own system call, to the copy it checked.

Where the pool may not take a job's socket (a container's default seccomp profile refuses
``pidfd_getfd`` without CAP_SYS_PTRACE), it connects a socket of its own to the checked copy instead, and
puts it in the job at the job's descriptor number, in place of the unconnected socket the job made
(``SECCOMP_IOCTL_NOTIF_ADDFD`` with ``SETFD``, as ``dup2``: it needs no reach into the job, Linux 5.9).
The descriptor keeps its close-on-exec and non-blocking flags; the socket options the job set before
connecting (``TCP_NODELAY``, ``SO_KEEPALIVE``, timeouts) are not carried over, since nothing lets the
pool read them there.

The job's memory may change after it was read: the connection goes where the copy said. Letting the
kernel run the job's call instead (``SECCOMP_USER_NOTIF_FLAG_CONTINUE``) would read the address again,
after the check; it is never done.

The pool connects without blocking. A job's non-blocking socket gets ``EINPROGRESS`` at once, as the
kernel would give it, and the job waits for it as it would for its own. A blocking socket's call is
answered when the connection is made or fails (:meth:`Connector.connected`, called by the steward's
thread when the socket becomes writable: :class:`pynox.server.steward.StewardThread`). The pool makes the
job's own socket non-blocking for its one ``connect`` call and gives it back its flags at once: another
thread of the job using that socket in those microseconds may see ``EAGAIN``.

A refused address gets ``EPERM`` (Python's ``PermissionError``), and is remembered for the hint, which
names the entry that would allow it.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import ipaddress
import os
import socket
import stat
import struct
from collections.abc import Callable
from dataclasses import dataclass

from ..hosts import AllowList
from ..policy._libc import libc
from ..policy.seccomp import syscall_number

__all__ = ["CONNECT", "MAX_WAITING", "Connector", "Refused", "descriptor_flags"]

CONNECT = syscall_number("connect")
_PIDFD_GETFD = syscall_number("pidfd_getfd")
_SOCKADDR_STORAGE = 128  # the kernel refuses a longer address with EINVAL
# Blocking connects of one job the pool waits on at once, each holding a descriptor of the pool's: past it,
# EAGAIN, as the kernel says when it has no port left (a job that opens hundreds waits on a blackholed host).
MAX_WAITING = 64
_IN = struct.Struct("!H4s")  # sin_port, sin_addr after sin_family
_IN6 = struct.Struct("!HI16s")  # sin6_port, sin6_flowinfo, sin6_addr after sin6_family
_FAMILY = struct.Struct("=H")
# struct seccomp_notif_addfd (id, flags, srcfd, newfd, newfd_flags) and its ioctl; SETFD: at newfd, as dup2.
_ADDFD = struct.Struct("=QIIII")
_NOTIF_ADDFD = 0x40182103
_ADDFD_FLAG_SETFD = 1

libc.connect.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
libc.ioctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p]
libc.syscall.restype = ctypes.c_long


class Refused(Exception):
    """The call fails with ``errno`` in the job."""

    def __init__(self, err: int) -> None:
        super().__init__(os.strerror(err))
        self.errno = err


Reader = Callable[[int, int, int], bytes]  # (tid, address, size) -> the job's bytes; raises Refused


def _destination(raw: bytes) -> tuple[str, int]:
    """The address and port of a ``sockaddr_in`` or ``sockaddr_in6``; Refused for any other family."""
    if len(raw) < _FAMILY.size:
        raise Refused(errno.EINVAL)
    (family,) = _FAMILY.unpack_from(raw)
    if family == socket.AF_INET:
        if len(raw) < 2 + _IN.size:
            raise Refused(errno.EINVAL)
        port, address = _IN.unpack_from(raw, 2)
        return str(ipaddress.IPv4Address(address)), port
    if family == socket.AF_INET6:
        if len(raw) < 2 + _IN6.size:
            raise Refused(errno.EINVAL)
        port, _, address = _IN6.unpack_from(raw, 2)
        return str(ipaddress.IPv6Address(address)), port
    # AF_UNSPEC (disconnecting) and every other family: a job with allow_hosts only connects to a listed host.
    raise Refused(errno.EPERM)


class _Unreachable(Exception):
    """The pool may not take the job's socket here (``pidfd_getfd`` refused: a container's profile)."""


@dataclass
class _Waiting:
    """A blocking connect in progress: the call waiting for it, and where a socket of the pool's goes once
    it is made (None: it is the job's own socket)."""

    notif_id: int
    replace: tuple[int, int] | None  # (the job's descriptor number, the O_CLOEXEC it had)


class Connector:
    """Connects one job's sockets for it, to what its :class:`AllowList` allows. Owns the descriptors of the
    sockets whose blocking connects are in progress (:attr:`waiting`)."""

    def __init__(self, allowed: AllowList, listener: int) -> None:
        self.allowed = allowed
        self._listener = listener
        # Our descriptor of a socket being connected -> what waits for it.
        self.waiting: dict[int, _Waiting] = {}
        self._takes_sockets = True  # until pidfd_getfd is refused: then every socket is replaced

    def begin(self, notif_id: int, tid: int, fd: int, address_at: int, length: int, read: Reader,
              valid: Callable[[int], bool], thread_group: Callable[[int], int]) -> int | None:
        """Answer a delegated ``connect(fd, address_at, length)``, its arguments as the kernel reads them: 0,
        or None when the answer comes later (:meth:`connected`); :class:`Refused` with the errno the job gets."""
        if length > _SOCKADDR_STORAGE:
            raise Refused(errno.EINVAL)
        raw = read(tid, address_at, length)
        if len(raw) < length:
            raise Refused(errno.EFAULT)
        address, port = _destination(raw)
        if not self.allowed.allows(address, port):
            self.allowed.refuse(address, port)
            raise Refused(errno.EPERM)
        if self._takes_sockets:
            try:
                sock = self._socket_of(notif_id, tid, fd, valid, thread_group)
            except _Unreachable:
                self._takes_sockets = False
            else:
                return self._connect(notif_id, sock, raw, None)
        return self._replace(notif_id, tid, fd, raw, valid)

    @staticmethod
    def _socket_of(notif_id: int, tid: int, fd: int, valid: Callable[[int], bool],
                   thread_group: Callable[[int], int]) -> int:
        """Our descriptor of the job's socket ``fd``: an IPv4 or IPv6 stream socket, or Refused."""
        try:
            pidfd = os.pidfd_open(tid)  # the job's main thread: its tid is the process's pid
        except OSError:
            group = thread_group(tid)  # another thread: its process, from /proc/<tid>/status
            try:
                pidfd = os.pidfd_open(group) if group > 0 else -1
            except OSError:
                pidfd = -1
            if pidfd < 0:
                raise Refused(errno.EPERM) from None
        try:
            if not valid(notif_id):  # only now does the pidfd surely name the job (the tid could be reused)
                raise Refused(errno.EINTR)
            sock = libc.syscall(ctypes.c_long(_PIDFD_GETFD), pidfd, fd, 0)
            if sock < 0:
                err = ctypes.get_errno()
                if err == errno.EBADF:
                    raise Refused(errno.EBADF)
                raise _Unreachable  # EPERM (or ENOSYS before Linux 5.6)
        finally:
            os.close(pidfd)
        try:
            kind = _kind(sock)
        except OSError:
            kind = None
        if kind is None or kind[0] not in (socket.AF_INET, socket.AF_INET6) or kind[1:] != _TCP:
            os.close(sock)  # at once: a descriptor of the job's held here (a pipe's end) would hold it open
            raise Refused(errno.ENOTSOCK if kind is None else errno.EPERM)
        return int(sock)

    def _replace(self, notif_id: int, tid: int, fd: int, raw: bytes, valid: Callable[[int], bool]) -> int | None:
        """Where the pool may not take the job's socket: connect a socket of the pool's own to the checked
        address, and put it in the job at the job's descriptor number (``SECCOMP_IOCTL_NOTIF_ADDFD``, which
        needs no reach into the job), in place of the unconnected socket the job made. The job's socket
        options set before the connect are not carried over (see the module's docstring)."""
        flags = descriptor_flags(tid, fd)
        if flags is None:
            raise Refused(errno.EBADF)
        if not _is_socket(tid, fd):
            raise Refused(errno.ENOTSOCK)
        if not valid(notif_id):  # what was read of /proc/<tid> was the job's
            raise Refused(errno.EINTR)
        (family,) = _FAMILY.unpack_from(raw)
        ours = socket.socket(family, socket.SOCK_STREAM | socket.SOCK_CLOEXEC).detach()
        replace = (fd, flags & os.O_CLOEXEC)
        if not flags & os.O_NONBLOCK:
            return self._connect(notif_id, ours, raw, replace)
        os.set_blocking(ours, False)
        try:
            err = _connect(ours, raw)
            if err not in (0, errno.EINPROGRESS):
                raise Refused(err)
            self._install(notif_id, ours, replace)
        finally:
            os.close(ours)
        if err:
            raise Refused(err)
        return 0

    def _install(self, notif_id: int, sock: int, replace: tuple[int, int]) -> None:
        fd, cloexec = replace
        request = ctypes.create_string_buffer(
            _ADDFD.pack(notif_id, _ADDFD_FLAG_SETFD, sock, fd, os.O_CLOEXEC if cloexec else 0), _ADDFD.size)
        if libc.ioctl(self._listener, _NOTIF_ADDFD, request) < 0:
            err = ctypes.get_errno()
            # ENOENT: the call is gone; EINVAL or ENOTTY: a kernel before 5.9, which cannot install one.
            raise Refused(errno.EINTR if err == errno.ENOENT else errno.EPERM)

    def _connect(self, notif_id: int, sock: int, raw: bytes, replace: tuple[int, int] | None) -> int | None:
        """Connect ``sock`` (ours: the job's own, or one to replace it) without blocking the pool."""
        try:
            flags = fcntl.fcntl(sock, fcntl.F_GETFL)
            blocking = not flags & os.O_NONBLOCK
            if blocking and len(self.waiting) >= MAX_WAITING:
                raise Refused(errno.EAGAIN)  # before it starts: the job's socket stays unconnected
            if blocking:
                fcntl.fcntl(sock, fcntl.F_SETFL, flags | os.O_NONBLOCK)
            try:
                err = _connect(sock, raw)
            finally:
                if blocking:
                    fcntl.fcntl(sock, fcntl.F_SETFL, flags)
            if blocking and err in (errno.EINPROGRESS, errno.EALREADY):
                self.waiting[sock] = _Waiting(notif_id, replace)
                return None
            if replace is not None and err == 0:
                self._install(notif_id, sock, replace)
        except BaseException:
            os.close(sock)
            raise
        os.close(sock)
        if err:
            raise Refused(err)
        return 0

    def connected(self, sock: int) -> tuple[int, int]:
        """A waiting socket became writable: (the waiting call's id, its answer: 0 or -errno). A socket of
        the pool's that connected is put in the job first. Our descriptor is closed."""
        waiting = self.waiting.pop(sock)
        try:
            err = _socket_error(sock)
            if err == 0 and waiting.replace is not None:
                self._install(waiting.notif_id, sock, waiting.replace)
        except Refused as refused:
            err = refused.errno
        except OSError as exc:
            err = exc.errno or errno.EIO
        finally:
            os.close(sock)
        return waiting.notif_id, -err

    def close(self) -> None:
        for sock in self.waiting:
            os.close(sock)
        self.waiting.clear()


_TCP = (socket.SOCK_STREAM, socket.IPPROTO_TCP)


def _kind(fd: int) -> tuple[int, int, int] | None:
    """(family, type, protocol) of the socket ``fd``, None if it is not a socket; ``fd`` stays open."""
    if not stat.S_ISSOCK(os.fstat(fd).st_mode):
        return None
    probe = socket.socket(fileno=fd)  # reads the socket's family, type and protocol
    try:
        return probe.family, probe.type, probe.proto
    finally:
        probe.detach()


def _socket_error(fd: int) -> int:
    """The socket's pending error (SO_ERROR), which reading clears; ``fd`` stays open."""
    probe = socket.socket(fileno=fd)
    try:
        return int(probe.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR))
    finally:
        probe.detach()


def _connect(sock: int, raw: bytes) -> int:
    """``connect`` with the very bytes that were checked: 0 or the errno."""
    return 0 if libc.connect(sock, raw, len(raw)) == 0 else ctypes.get_errno()


def descriptor_flags(tid: int, fd: int) -> int | None:
    """The open flags of the job's descriptor ``fd``, with O_CLOEXEC, as its fdinfo shows them (in octal);
    None if the job has no such descriptor."""
    if fd < 0:
        return None
    try:
        with open(f"/proc/{tid}/fdinfo/{fd}", "rb") as info:
            return next(int(line.split()[1], 8) for line in info if line.startswith(b"flags:"))
    except (OSError, ValueError, StopIteration):
        return None


def _is_socket(tid: int, fd: int) -> bool:
    try:
        return os.readlink(f"/proc/{tid}/fd/{fd}").startswith("socket:")
    except OSError:
        return False
