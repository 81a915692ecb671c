"""seccomp: no new programs or processes, sockets only as granted, no kernel attack surface.

This is the main filter; :mod:`.own_process` adds a second one, written per
child, so that calls naming a process can name only the job itself (merged
with this one into the one program a child installs: ``LoadableFilter.merged``).

The filter is built with libseccomp (``pyseccomp``) and compiled to BPF once,
in the template; a child only installs the bytes with one ``seccomp`` call, which
is about five times cheaper than building and loading a filter per job.

It is a deny list over an allow-by-default filter: ordinary Python needs
hundreds of system calls and numpy more, and the list below is what a job must
never do. Denials return an errno (never kill), so Python raises a readable
``OSError`` and the hint can say what happened. A few calls (changing a file's
mode, owner or times, and ``sysinfo``) are neither allowed nor denied but
delegated: the pool answers them through the filter's listener
(:mod:`pynox.server.steward`, :mod:`pynox.server.own_view`).
"""

from __future__ import annotations

import ctypes
import errno
import importlib
import os
import platform
import socket
import stat
import sys
import types
from typing import TYPE_CHECKING

import msgspec

from ..wire.spec import NetworkMode
from ._libc import syscall


def _import_pyseccomp() -> types.ModuleType:
    """pyseccomp, imported without ``ctypes.util``.

    pyseccomp finds libc and libseccomp with ``ctypes.util.find_library``, and ``ctypes.util`` imports shutil
    (with zlib, bz2 and lzma and their libraries), subprocess and tempfile (random, hashlib's sha512), then runs
    ldconfig. Imported so, they sit in every template and in every job forked from one: 46 mappings and 1.4 MiB
    of private memory that every ``fork()`` copies again (about 45 µs of each, docs/performance.md, "The
    template's fork, third pass"), for modules no job needs unless it imports them itself. Both libraries are
    found by their sonames here, as ``find_library`` would name them on glibc; where either does not load so,
    the real ``ctypes.util`` is used. A job importing ``ctypes.util`` gets the real one: the stand-in is
    gone once pyseccomp is imported."""
    sonames = {"c": "libc.so.6", "seccomp": "libseccomp.so.2"}
    if "ctypes.util" not in sys.modules and "pyseccomp" not in sys.modules:
        try:
            for soname in sonames.values():
                ctypes.CDLL(soname)
        except OSError:
            pass
        else:
            stand_in = types.ModuleType("ctypes.util")
            stand_in.find_library = sonames.get  # type: ignore[attr-defined]  # the one name pyseccomp uses
            sys.modules["ctypes.util"] = stand_in
            ctypes.util = stand_in  # type: ignore[attr-defined]  # `ctypes.util.find_library` reads it here
            try:
                return importlib.import_module("pyseccomp")
            finally:
                del sys.modules["ctypes.util"]
                del ctypes.util  # type: ignore[attr-defined]
    return importlib.import_module("pyseccomp")


if TYPE_CHECKING:
    import pyseccomp

    from .own_process import OwnProcessFilter
else:
    pyseccomp = _import_pyseccomp()

__all__ = ["DELEGATED_SYSCALLS", "DENIED_SYSCALLS", "FORK_SYSCALLS", "NETWORK_MODES", "TRUNCATE_ABI", "CompiledFilter",
           "LoadableFilter", "compile_filter", "install", "syscall_number"]

NETWORK_MODES: tuple[NetworkMode, ...] = ("none", "hosts", "all")

_CLONE_THREAD = 0x00010000
_SOCK_TYPE_MASK = 0xF  # the socket type in socketpair's second argument; the rest are flags
_F_SETLEASE = 1024
_F_NOTIFY = 1026
_F_SETOWN_EX = 15
_FIOSETOWN = 0x8901
_SOCKET_IOCTLS = 0x8900  # the 0x89xx range of <linux/sockios.h>
_MSG_FASTOPEN = 0x20000000  # sendto/sendmsg on a TCP socket not yet connected: connect there, with data
# Socket options that send a connection elsewhere than the address it was made to, or out of another
# interface (level, option name): IPv6 routing headers, sticky or not, in the RFC 2292 forms and the current
# ones (a segment routing header makes any address the packets' real destination, unprivileged), hop-by-hop
# and destination options, the flow label manager; IPv4 options (source routing); the interface a socket
# sends from (SO_BINDTODEVICE, SO_BINDTOIFINDEX, IP_UNICAST_IF, IPV6_UNICAST_IF).
_REDIRECTING_OPTIONS = (
    (41, 5), (41, 6), (41, 32), (41, 54), (41, 55), (41, 57), (41, 59), (41, 76),
    (0, 4), (0, 50),
    (1, 25), (1, 62),
)
_SIOCSPGRP = 0x8902
_TIOCSTI = 0x5412
_TIOCLINUX = 0x541C
# Inode flags and the like, set through ioctl on any descriptor, even one opened read-only: a job keeping
# uid 0 owns the runtime's files (chattr +S on libpython slows every program; +A, +d change backups).
# fs-verity, once enabled, makes a file read-only for good. SETFLAGS, SETVERSION (each also in its
# 32-bit form), FSSETXATTR, SET_ENCRYPTION_POLICY, ENABLE_VERITY.
_FILE_FLAG_IOCTLS = (0x40086602, 0x40046602, 0x40087602, 0x40047602, 0x401C5820, 0x800C6613, 0x40806685)
_PER_QUERY = 0xFFFFFFFF
_SECCOMP_SET_MODE_FILTER = 1
_SECCOMP_FILTER_FLAG_NEW_LISTENER = 1 << 3

# Starting programs: a job is one Python process and stays one.
_NO_PROGRAMS = ("execve", "execveat")
# Making a process (and clone without CLONE_THREAD, below): refused as well; a plain job's by the filter, a
# session's child's by the pool (compile_filter's session). That filter hands each to the steward
# (SECCOMP_RET_USER_NOTIF), which answers EPERM, the same errno the filter gave, unless the pool armed it for
# the one fork of a session fork it asked for (see pynox.server.fork_gate and docs/architecture.md, "Forking a
# session"): only a listener can let one call through (SECCOMP_USER_NOTIF_FLAG_CONTINUE), a filter's answer is
# the same for every call.
FORK_SYSCALLS = ("fork", "vfork")
# Reaching other processes or the kernel's less-travelled paths.
_ATTACK_SURFACE = (
    "ptrace", "process_vm_readv", "process_vm_writev", "process_madvise", "kcmp", "pidfd_getfd",
    "mount", "umount2", "mount_setattr", "open_tree", "move_mount", "fsopen", "fsconfig", "fsmount",
    "fspick", "unshare", "setns", "chroot", "pivot_root",
    "bpf", "perf_event_open", "userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register",
    "keyctl", "add_key", "request_key", "kexec_load", "kexec_file_load",
    "init_module", "finit_module", "delete_module",
    "shmget", "shmat", "shmdt", "shmctl", "semget", "semop", "semctl", "semtimedop",
    "msgget", "msgsnd", "msgrcv", "msgctl",
    "acct", "swapon", "swapoff", "reboot", "quotactl", "open_by_handle_at", "name_to_handle_at",
    "fanotify_init", "lookup_dcookie", "sethostname", "setdomainname", "iopl", "ioperm", "uselib",
    "vhangup", "syslog", "adjtimex", "clock_adjtime", "settimeofday", "clock_settime", "open_tree_attr",
    # Another process's capabilities: capget takes its pid in memory the filter cannot read. A job has none.
    "capget", "process_mrelease",
    # The host's mount table, as /proc/self/mountinfo would show it (Linux 6.8 and later).
    "listmount", "statmount",
)
# Kernel budgets shared by every process of a uid, which one job could exhaust for all of them (and
# for the pool, when it runs as that uid too): inotify instances (128 per uid by default) and POSIX
# message queues (RLIMIT_MSGQUEUE bytes per uid; mq_open(O_CREAT) creates the queue even when the
# open is then refused, so leftovers outlive the job). Pending queued signals are bounded by
# RLIMIT_SIGPENDING instead (limits.py).
_SHARED_BUDGETS = (
    "inotify_init", "inotify_init1",
    "mq_open", "mq_unlink", "mq_timedsend", "mq_timedreceive", "mq_notify", "mq_getsetattr",
    # Kernel AIO contexts: fs.aio-max-nr is one budget for the whole machine (glibc's aio uses threads).
    "io_setup",
)
# Without the network a job reaches no socket outside its own process: its sockets are the ends of
# socketpairs (and the descriptors the pool hands it, already connected), and none may be bound to an
# address, connected to one or listen. A datagram socketpair end could otherwise send to a host's
# pathname socket (Landlock does not govern that) or bind an abstract name and receive from anyone.
_ADDRESSING = ("bind", "connect", "listen", "accept", "accept4")
# Changing a file's mode, owner or times. Landlock does not govern metadata, and a job that keeps uid 0
# owns most of the host's files: it could chmod /etc/shadow world-readable or set the setuid bit on a
# runtime binary it may only read. These calls are not run by the kernel for the job: the filter hands
# each to the pool (SECCOMP_RET_USER_NOTIF), which performs it on the job's behalf only on a file in a
# write grant (see pynox.server.steward). The older forms (utime, utimes, futimesat), which libc no longer
# uses, are refused.
# sysinfo gives the host's RAM, task count, load and uptime; refused, it would leave glibc's
# sysconf(_SC_PHYS_PAGES) reading an uninitialised struct. The pool answers it with the job's own view
# instead (see pynox.server.own_view).
DELEGATED_SYSCALLS = (
    "chmod", "fchmod", "fchmodat", "fchmodat2", "chown", "fchown", "lchown", "fchownat", "utimensat",
    "sysinfo",
)
# Extended attributes (ACLs are xattrs) and the flags of file_setattr: refused wherever the file is.
_FILE_METADATA = (
    "setxattr", "lsetxattr", "fsetxattr", "removexattr", "lremovexattr", "fremovexattr",
    "setxattrat", "removexattrat", "file_setattr", "utime", "utimes", "futimesat",
)
# Memory no limit of the job counts: pages written into a memfd are neither RLIMIT_DATA's nor RLIMIT_AS's
# (a job with memory=128m held 2 GiB in memfds). Until a job's memory is counted by a cgroup, a job may not
# make one (memfd_secret's pages are locked memory, counted by nothing of the job's either).
_UNCOUNTED_MEMORY = ("memfd_create", "memfd_secret")
DENIED_SYSCALLS = (*_NO_PROGRAMS, *_ATTACK_SURFACE, *_FILE_METADATA, *_SHARED_BUDGETS, *_UNCOUNTED_MEMORY)
# System calls numbered from 424 on have one number on every architecture below; a libseccomp older
# than the kernel does not know their names but can still deny them by number.
_UNIFIED_NUMBERS = {"fchmodat2": 452, "statmount": 457, "listmount": 458, "setxattrat": 463, "removexattrat": 466,
                    "open_tree_attr": 467, "file_setattr": 469}
_UNIFIED_ARCHES = ("x86_64", "aarch64", "riscv64", "s390x", "ppc64le", "loongarch64")


class CompiledFilter(msgspec.Struct, frozen=True):  # not a dataclass: see Runtime (policy/__init__.py)
    network: NetworkMode
    bpf: bytes
    # Names this libseccomp or architecture does not know; reported by `pynox check`.
    unknown: tuple[str, ...]


def _deny(f: pyseccomp.SyscallFilter, name: str | int, *args: pyseccomp.Arg, err: int = errno.EPERM) -> bool:
    return _add(f, pyseccomp.ERRNO(err), name, *args)


def _add(f: pyseccomp.SyscallFilter, action: int, name: str | int, *args: pyseccomp.Arg) -> bool:
    try:
        f.add_rule(action, name, *args)
    except (OSError, ValueError, RuntimeError):
        return False
    return True


def _add_named(f: pyseccomp.SyscallFilter, action: int, name: str) -> bool:
    if _add(f, action, name):
        return True
    number = syscall_number(name)
    return number >= 0 and _add(f, action, number)


def syscall_number(name: str) -> int:
    """The number of a system call on this architecture, -1 if it has none (or this libseccomp and the
    unified table below do not know it)."""
    try:
        number = int(pyseccomp.resolve_syscall(pyseccomp.Arch.NATIVE, name))
    except (OSError, ValueError, RuntimeError):
        number = -1
    if number < 0 and platform.machine() in _UNIFIED_ARCHES:
        number = _UNIFIED_NUMBERS.get(name, -1)
    return number


def _socket_rules(f: pyseccomp.SyscallFilter, network: NetworkMode) -> None:
    # socket(family, ...): with the network granted, IPv4 and IPv6 (TCP and UDP); without it none at all
    # (Landlock covers TCP only, so UDP needs this); with allow_hosts, IPv4 and IPv6 TCP only (below).
    # Never a unix socket: Landlock does not govern connecting to a pathname socket, so one would reach
    # any local daemon the uid may open (a Docker socket, a database), outside every grant. Netlink,
    # packet, vsock and every other family: never.
    allowed = {socket.AF_INET, socket.AF_INET6} if network != "none" else set()
    for family in range(socket.AF_INET6 + 1):
        if family not in allowed:
            _deny(f, "socket", pyseccomp.Arg(0, pyseccomp.EQ, family))
    _deny(f, "socket", pyseccomp.Arg(0, pyseccomp.GT, socket.AF_INET6))
    # socketpair is a private channel (asyncio's self-pipe uses it): unix and stream only. A connected
    # stream socket cannot be connected elsewhere, cannot listen and ignores a destination address; a
    # datagram one could do all of that.
    _deny(f, "socketpair", pyseccomp.Arg(0, pyseccomp.NE, socket.AF_UNIX))
    for kind in range(_SOCK_TYPE_MASK + 1):
        if kind != socket.SOCK_STREAM:
            _deny(f, "socketpair", pyseccomp.Arg(1, pyseccomp.MASKED_EQ, _SOCK_TYPE_MASK, kind))
    if network == "hosts":
        _host_rules(f)
    if network == "none":
        for name in _ADDRESSING:
            _deny(f, name)
        # The socket ioctls (0x89xx: SIOCGIFCONF, SIOCGIFHWADDR, SIOCGIFADDR...) answer about the host's
        # network interfaces on any socket, a socketpair end included: without the network a job learns
        # nothing of the host's interfaces, addresses or MACs. None of them means anything on a socketpair.
        _deny(f, "ioctl", pyseccomp.Arg(1, pyseccomp.MASKED_EQ, 0xFFFFFF00, _SOCKET_IOCTLS))


def _host_rules(f: pyseccomp.SyscallFilter) -> None:
    """allow_hosts: a TCP client, whose every connection the pool makes. A socket is IPv4 or IPv6, stream,
    TCP (not SCTP or MPTCP, which take addresses elsewhere); ``connect`` is delegated to the pool, which
    connects the job's socket itself to the address it read and checked (pynox.server.steward), so no
    later change of the job's memory can redirect it. Nothing reaches an address any other way: no UDP
    (names are resolved by the pool), no bind, listen or accept, no TCP Fast Open (sendto or sendmsg with
    MSG_FASTOPEN connects to the address it is given), no interface ioctls, and no socket option that
    routes a connection elsewhere than its address or out of another interface (``_REDIRECTING_OPTIONS``).
    Landlock (ABI 4 and later) refuses the job's own TCP connect and bind besides."""
    for family in (socket.AF_INET, socket.AF_INET6):
        for kind in range(_SOCK_TYPE_MASK + 1):
            if kind != socket.SOCK_STREAM:
                _deny(f, "socket", pyseccomp.Arg(0, pyseccomp.EQ, family),
                      pyseccomp.Arg(1, pyseccomp.MASKED_EQ, _SOCK_TYPE_MASK, kind))
        # The protocol is 0 (TCP for a stream) or IPPROTO_TCP; compared on all 64 bits, so a value the kernel
        # would cut to 0 or 6 is refused too.
        _deny(f, "socket", pyseccomp.Arg(0, pyseccomp.EQ, family),
              pyseccomp.Arg(2, pyseccomp.GT, socket.IPPROTO_TCP))
        for protocol in range(1, socket.IPPROTO_TCP):
            _deny(f, "socket", pyseccomp.Arg(0, pyseccomp.EQ, family), pyseccomp.Arg(2, pyseccomp.EQ, protocol))
    for name in ("bind", "listen", "accept", "accept4"):
        _deny(f, name)
    # Before the connect or after it (the kernel drops the cached route when a routing header is set): never.
    for level, option in _REDIRECTING_OPTIONS:
        _deny(f, "setsockopt", pyseccomp.Arg(1, pyseccomp.MASKED_EQ, 0xFFFFFFFF, level),
              pyseccomp.Arg(2, pyseccomp.MASKED_EQ, 0xFFFFFFFF, option))
    _add(f, pyseccomp.NOTIFY, "connect")
    for name, flags in (("sendto", 3), ("sendmsg", 2), ("sendmmsg", 3)):
        _deny(f, name, pyseccomp.Arg(flags, pyseccomp.MASKED_EQ, _MSG_FASTOPEN, _MSG_FASTOPEN))
    _deny(f, "ioctl", pyseccomp.Arg(1, pyseccomp.MASKED_EQ, 0xFFFFFF00, _SOCKET_IOCTLS))


# Where each call that creates a file takes its flags and mode (None: it has no flags, it always creates).
_CREATING = {"open": (1, 2), "openat": (2, 3), "creat": (None, 1), "mknod": (None, 1), "mknodat": (None, 2)}
_O_TMPFILE_BIT = 0o20000000  # O_TMPFILE is this bit with O_DIRECTORY


def _set_id_rules(f: pyseccomp.SyscallFilter) -> None:
    """No file created with the setuid or setgid bit: in a write grant that would be a program of the
    pool's uid (often root) any user of the host could run. The metadata rules keep the bits from being
    set afterwards; these keep them from being set at birth. openat2 passes its mode in memory the filter
    cannot read: ENOSYS, which nothing in Python uses and libc falls back from."""
    for name, (flags, mode) in _CREATING.items():
        for bit in (stat.S_ISUID, stat.S_ISGID):
            if flags is None:
                _deny(f, name, pyseccomp.Arg(mode, pyseccomp.MASKED_EQ, bit, bit))
                continue
            for creates in (os.O_CREAT, _O_TMPFILE_BIT):
                _deny(f, name, pyseccomp.Arg(flags, pyseccomp.MASKED_EQ, creates, creates),
                      pyseccomp.Arg(mode, pyseccomp.MASKED_EQ, bit, bit))
    _deny(f, "openat2", err=errno.ENOSYS)


def _truncate_rules(f: pyseccomp.SyscallFilter) -> None:
    """Below Landlock ABI 3 (Linux 6.2) Landlock does not govern truncation, so a job could cut any file its
    uid may write, a file granted read-only among them, by name (truncate) or by opening it read-only with
    O_TRUNC, which Linux honours. Both are refused here: a job truncates a file it opened for writing
    (ftruncate, which needs a descriptor Landlock let it open for writing), or opens it with "w"."""
    _deny(f, "truncate")
    for name, (flags, _) in _CREATING.items():
        if flags is None:
            continue
        # Access mode 3 ("for ioctl only") opens with neither read nor write in the file's mode, so Landlock
        # asks for no right at all, and O_TRUNC still truncates: refused as the read-only mode is.
        for mode in (os.O_RDONLY, os.O_ACCMODE):
            _deny(f, name, pyseccomp.Arg(flags, pyseccomp.MASKED_EQ, os.O_ACCMODE | os.O_TRUNC, mode | os.O_TRUNC))


# The first Landlock ABI that governs truncation.
TRUNCATE_ABI = 3


# libseccomp's binary tree of the system call numbers (SCMP_FLTATR_CTL_OPTIMIZE = 2, libseccomp 2.5) in place
# of one linear list: the same decisions (tests/sandbox/test_filter_forms.py runs both programs on every
# system call), and every child loads it in about 60 % of the time (the kernel checks and translates a
# program at each install: 330 -> 195 us per job here, bench/floor_job.py's machine).
_TREE = 2


def _as_tree(f: pyseccomp.SyscallFilter) -> None:
    """Ask for the tree; an older libseccomp that does not know it keeps the linear list, the same rules."""
    try:
        f.set_attr(pyseccomp.Attr.CTL_OPTIMIZE, _TREE)
    except OSError:  # EINVAL (or EOPNOTSUPP) from a libseccomp before 2.5
        pass


def compile_filter(network: NetworkMode, landlock_abi: int, *, session: bool,
                   tree: bool = True) -> CompiledFilter:
    """The main filter for jobs with no network, the listed hosts, or all of it, confined with Landlock ABI
    ``landlock_abi`` (rules that make up for what an older ABI does not govern are added below it);
    ``tree=False``: as one linear list (the form an older libseccomp gives, compared with the tree by the
    tests). ``session``: a session's child, whose forks go to the steward (its fork gate); a plain job's are
    refused by the filter itself, as a session's are outside the gate's window: only a session is ever
    forked, so no other job's fork needs a listener's answer."""
    f = pyseccomp.SyscallFilter(pyseccomp.ALLOW)
    # A syscall through a foreign ABI (int 0x80 on x86_64) would dodge the rules: refuse it.
    f.set_attr(pyseccomp.Attr.ACT_BADARCH, pyseccomp.ERRNO(errno.ENOSYS))
    if tree:
        _as_tree(f)
    unknown = [name for name in DENIED_SYSCALLS if not _add_named(f, pyseccomp.ERRNO(errno.EPERM), name)]
    unknown += [name for name in DELEGATED_SYSCALLS if not _add_named(f, pyseccomp.NOTIFY, name)]
    forks = pyseccomp.NOTIFY if session else pyseccomp.ERRNO(errno.EPERM)
    unknown += [name for name in FORK_SYSCALLS if not _add_named(f, forks, name)]
    # clone without CLONE_THREAD is fork (a session's to the steward, as fork is); threads keep working.
    _add(f, forks, "clone", pyseccomp.Arg(0, pyseccomp.MASKED_EQ, _CLONE_THREAD, 0))
    # clone3 passes its flags in memory seccomp cannot read: ENOSYS makes glibc fall back to clone.
    _deny(f, "clone3", err=errno.ENOSYS)
    _socket_rules(f, network)
    _set_id_rules(f)
    # A filter of the job's own with a listener would take the delegated calls before the pool's (the
    # newest filter's answer wins among equals) and could let them run unchecked: no listener, ever.
    # The kernel already refuses a second listener while the pool holds its own; this holds after too.
    _deny(f, "seccomp", pyseccomp.Arg(0, pyseccomp.EQ, _SECCOMP_SET_MODE_FILTER),
          pyseccomp.Arg(1, pyseccomp.MASKED_EQ, _SECCOMP_FILTER_FLAG_NEW_LISTENER, _SECCOMP_FILTER_FLAG_NEW_LISTENER))
    # Typing into the controlling terminal, and file flags; compare the low 32 bits as the kernel does.
    for request in (_TIOCSTI, _TIOCLINUX, *_FILE_FLAG_IOCTLS):
        _deny(f, "ioctl", pyseccomp.Arg(1, pyseccomp.MASKED_EQ, 0xFFFFFFFF, request))
    _deny(f, "personality", pyseccomp.Arg(0, pyseccomp.NE, _PER_QUERY))
    # A lease on a file makes every other opener wait for its break (fs.lease-break-time, 45 s): a job
    # keeping uid 0 owns the runtime's files, so a lease on /etc/ld.so.cache would stall every program
    # the host starts. Directory notifications (dnotify) are inotify's elder: a per-uid budget too.
    # F_SETOWN_EX names the process to signal in memory the filter cannot read (F_SETOWN, which passes a
    # pid, is checked against the job's own by the own-process filter): refused, and so are the socket
    # ioctls that set an owner through a pointer. See own_process.py.
    for command in (_F_SETLEASE, _F_NOTIFY, _F_SETOWN_EX):
        _deny(f, "fcntl", pyseccomp.Arg(1, pyseccomp.EQ, command))
    for request in (_FIOSETOWN, _SIOCSPGRP):
        _deny(f, "ioctl", pyseccomp.Arg(1, pyseccomp.MASKED_EQ, 0xFFFFFFFF, request))
    if landlock_abi < TRUNCATE_ABI:
        _truncate_rules(f)
    # prlimit64 on another process (the kernel allows it between processes of one uid: a job keeping
    # uid 0 could lower the pool's limits) is refused by the own-process filter, which knows the job's pid.
    # A memfd, not tempfile: tempfile would remember /tmp as every later job's temporary directory.
    with os.fdopen(os.memfd_create("pynox-bpf", os.MFD_CLOEXEC), "w+b") as out:
        f.export_bpf(out)
        out.seek(0)
        bpf = out.read()
    return CompiledFilter(network=network, bpf=bpf, unknown=tuple(unknown))


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


class LoadableFilter:
    """A compiled filter laid out in memory once (in the template), so a child installs it with one call.
    ``merged``: the own-process filter and this one as one program (``OwnProcessFilter.before``), which a
    job's child installs with its pid written in, instead of the two stacked (None: stacked)."""

    def __init__(self, compiled: CompiledFilter, merged: OwnProcessFilter | None = None) -> None:
        self.compiled = compiled
        self.merged = merged
        self._program = ctypes.create_string_buffer(compiled.bpf, len(compiled.bpf))
        self._fprog = _SockFprog(len(compiled.bpf) // 8, ctypes.addressof(self._program))
        self._address = ctypes.addressof(self._fprog)
        self._seccomp = syscall_number("seccomp")

    def install(self, pid: int | None = None) -> int:
        """Install the filter on the calling thread (no_new_privs must already be set) and return its
        listener: the descriptor on which the delegated calls arrive, for the pool to answer. Whoever
        holds it answers for the job, so the job itself must never keep it. With ``pid`` and ``merged``:
        the merged program, for process ``pid`` (the own-process filter is then installed with it)."""
        if pid is None or self.merged is None:
            return syscall(self._seccomp, _SECCOMP_SET_MODE_FILTER, _SECCOMP_FILTER_FLAG_NEW_LISTENER,
                           ctypes.c_void_p(self._address), what="seccomp filter")
        program = self.merged.for_pid(pid)
        buffer = ctypes.create_string_buffer(program, len(program))
        fprog = _SockFprog(len(program) // 8, ctypes.addressof(buffer))
        return syscall(self._seccomp, _SECCOMP_SET_MODE_FILTER, _SECCOMP_FILTER_FLAG_NEW_LISTENER,
                       ctypes.c_void_p(ctypes.addressof(fprog)), what="seccomp filter")


def install(compiled: CompiledFilter) -> int:
    """Install a filter on the calling thread; no_new_privs must already be set. Returns its listener."""
    return LoadableFilter(compiled).install()


def supported() -> bool:
    """Whether the kernel has seccomp filters (``/proc/self/status`` shows a Seccomp line)."""
    try:
        with open("/proc/self/status") as status:
            return any(line.startswith("Seccomp:") for line in status)
    except OSError:
        return os.path.exists("/proc/sys/kernel/seccomp/actions_avail")
