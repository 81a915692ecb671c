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

The job's memory may change after it was read: the connection goes where the copy said. Letting the
kernel run the job's call instead (``SECCOMP_USER_NOTIF_FLAG_CONTINUE``) would read the address again,
after the check; it is never done.

The pool connects without blocking. A job's non-blocking socket gets ``EINPROGRESS`` at once, as the
kernel would give it, and the job waits for it as it would for its own. A blocking socket's call is
answered when the connection is made or fails (:meth:`Connector.connected`, called by the job's serving
loop when the socket becomes writable); its flags are the job's again before that. Until a blocking
connect is answered, another thread of the job reading the same socket may see ``EAGAIN``.

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
import struct
from collections.abc import Callable

from ..hosts import AllowList
from ..policy._libc import libc
from ..policy.seccomp import syscall_number

__all__ = ["CONNECT", "MAX_WAITING", "Connector", "Refused"]

CONNECT = syscall_number("connect")
_PIDFD_GETFD = syscall_number("pidfd_getfd")
_SOCKADDR_STORAGE = 128  # the kernel refuses a longer address with EINVAL
# Blocking connects of one job the pool waits on at once, each holding a descriptor of the pool's: past it,
# EAGAIN, as the kernel says when it has no port left (a job that opens hundreds waits on a blackholed host).
MAX_WAITING = 64
_IN = struct.Struct("!H4s")  # sin_port, sin_addr after sin_family
_IN6 = struct.Struct("!HI16s")  # sin6_port, sin6_flowinfo, sin6_addr after sin6_family
_FAMILY = struct.Struct("=H")

libc.connect.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
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


class Connector:
    """Connects one job's sockets for it, to what its :class:`AllowList` allows. Owns the descriptors of the
    sockets whose blocking connects are in progress (:attr:`waiting`)."""

    def __init__(self, allowed: AllowList) -> None:
        self.allowed = allowed
        # Our descriptor of a job's socket -> the id of the call waiting for its connection.
        self.waiting: dict[int, int] = {}
        self.new: list[int] = []  # waiting since the serving loop last looked (it watches them for writing)

    def begin(self, notif_id: int, tid: int, args: tuple[int, ...], read: Reader,
              valid: Callable[[int], bool], thread_group: Callable[[int], int]) -> int | None:
        """Answer a delegated ``connect``: 0, or None when the answer comes later (:meth:`connected`);
        :class:`Refused` with the errno the job gets."""
        fd = _signed(args[0])
        length = args[2] & 0xFFFF_FFFF
        if length > _SOCKADDR_STORAGE:
            raise Refused(errno.EINVAL)
        raw = read(tid, args[1], length)
        if len(raw) < length:
            raise Refused(errno.EFAULT)
        address, port = _destination(raw)
        if not self.allowed.allows(address, port):
            self.allowed.refuse(address, port)
            raise Refused(errno.EPERM)
        sock = self._socket_of(notif_id, tid, fd, valid, thread_group)
        try:
            return self._connect(notif_id, sock, raw)
        except BaseException:
            os.close(sock)
            raise

    @staticmethod
    def _socket_of(notif_id: int, tid: int, fd: int, valid: Callable[[int], bool],
                   thread_group: Callable[[int], int]) -> int:
        """Our descriptor of the job's socket ``fd``: an IPv4 or IPv6 stream socket, or Refused."""
        group = thread_group(tid)
        if group < 0:
            raise Refused(errno.EPERM)
        try:
            pidfd = os.pidfd_open(group)
        except OSError:
            raise Refused(errno.EPERM) from None
        try:
            if not valid(notif_id):  # only now does the pidfd surely name the job (the tid could be reused)
                raise Refused(errno.EINTR)
            sock = libc.syscall(ctypes.c_long(_PIDFD_GETFD), pidfd, fd, 0)
            if sock < 0:
                err = ctypes.get_errno()
                raise Refused(errno.EBADF if err == errno.EBADF else errno.EPERM)
        finally:
            os.close(pidfd)
        try:
            with socket.socket(fileno=os.dup(sock)) as probe:
                kind = (probe.family, probe.type)
        except OSError:
            os.close(sock)
            raise Refused(errno.ENOTSOCK) from None
        if kind not in ((socket.AF_INET, socket.SOCK_STREAM), (socket.AF_INET6, socket.SOCK_STREAM)):
            os.close(sock)
            raise Refused(errno.EPERM)
        return int(sock)

    def _connect(self, notif_id: int, sock: int, raw: bytes) -> int | None:
        flags = fcntl.fcntl(sock, fcntl.F_GETFL)
        blocking = not flags & os.O_NONBLOCK
        if blocking and len(self.waiting) >= MAX_WAITING:
            raise Refused(errno.EAGAIN)  # before it starts: the job's socket stays unconnected
        if blocking:
            fcntl.fcntl(sock, fcntl.F_SETFL, flags | os.O_NONBLOCK)
        try:
            result = libc.connect(sock, raw, len(raw))
            err = ctypes.get_errno() if result != 0 else 0
        finally:
            if blocking:
                fcntl.fcntl(sock, fcntl.F_SETFL, flags)
        if err == 0:
            os.close(sock)
            return 0
        if blocking and err in (errno.EINPROGRESS, errno.EALREADY):
            self.waiting[sock] = notif_id
            self.new.append(sock)
            return None
        raise Refused(err)

    def connected(self, sock: int) -> tuple[int, int]:
        """A waiting socket became writable: (the waiting call's id, its answer: 0 or -errno). Our
        descriptor is closed."""
        notif_id = self.waiting.pop(sock)
        try:
            with socket.socket(fileno=os.dup(sock)) as probe:
                err = probe.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        except OSError as exc:
            err = exc.errno or errno.EIO
        finally:
            os.close(sock)
        return notif_id, -err

    def close(self) -> None:
        for sock in self.waiting:
            os.close(sock)
        self.waiting.clear()
        self.new.clear()


def _signed(value: int) -> int:
    value &= 0xFFFF_FFFF
    return value - (1 << 32) if value >= 1 << 31 else value
