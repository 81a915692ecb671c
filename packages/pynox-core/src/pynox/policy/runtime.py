"""The paths a confined CPython needs to start, import and format text, granted read-only to every job.

Computed once in the template, after preloading, from the live interpreter: its
prefixes, every ``sys.path`` entry, the shared libraries it links, locale,
time zone and certificate data. Nothing here is writable by a job, and a write
grant that overlaps any of these paths is refused, so a job can never change
the code the next job imports.
"""

from __future__ import annotations

import _thread
import ctypes
import errno
import os
import select
import site
import struct
import sys
from collections.abc import Iterable

from ..paths import beneath
from ._libc import libc

__all__ = [
    "DEVICE_READ", "DEVICE_WRITE", "NETWORK_FILES", "OWN_PROC_DIRECTORIES", "OWN_PROC_ENTRIES", "RuntimeWatch",
    "rule_paths", "runtime_paths", "runtime_watch",
]


def _warn(message: str, *args: object) -> None:
    """Log a warning. logging is imported here, not with this module: every template imports this module, and
    logging, once imported, registers fork hooks that run around each of the template's forks (its lock taken
    before, released after, and set up again in the child), and imports threading, whose own after-fork hook
    would run in every job's child (~110 copy-on-write faults). The watch is the server's, and it warns rarely."""
    import logging

    logging.getLogger(__name__).warning(message, *args)


_SYSTEM = (
    "/lib", "/lib64", "/lib32", "/usr/lib", "/usr/lib64", "/usr/lib32", "/usr/local/lib",
    "/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d",
    "/usr/share/locale", "/usr/lib/locale", "/etc/locale.alias",
    "/usr/share/zoneinfo", "/etc/localtime", "/etc/timezone",
    "/etc/ssl", "/etc/pki", "/etc/ca-certificates", "/usr/share/ca-certificates",
    "/sys/devices/system/cpu",  # BLAS libraries size their thread pools from it
)
DEVICE_READ = ("/dev/zero", "/dev/urandom", "/dev/random", "/dev/full")
DEVICE_WRITE = ("/dev/null",)
# What a job may read of its own /proc/<pid>: its memory, maps, status, limits, descriptors, command
# line, environment. Not the whole directory: net/ lists the host's listening ports, unix socket paths,
# routes and neighbours; mountinfo and cgroup show the host's mount table and cgroup path; task/ holds
# all of that again per thread.
# Each is a rule a child adds while it is confined, on the way of the next job when jobs come back to back:
# the list is what Python and its usual libraries (psutil, resource reports) read, and no more.
OWN_PROC_ENTRIES = ("stat", "statm", "status", "maps", "mem", "fd", "limits", "cmdline", "comm", "environ")
OWN_PROC_DIRECTORIES = ("fd",)
# Name resolution; granted only with the network.
NETWORK_FILES = ("/etc/resolv.conf", "/etc/hosts", "/etc/nsswitch.conf", "/etc/gai.conf",
                 "/etc/host.conf", "/etc/services", "/etc/protocols")


def _python_paths(package_dirs: Iterable[str]) -> list[str]:
    paths = {sys.base_prefix, sys.prefix, sys.exec_prefix, sys.base_exec_prefix}
    paths.update(site.getsitepackages())
    paths.update(entry for entry in sys.path if entry)
    paths.update(package_dirs)
    return sorted(paths)


def runtime_paths(package_dirs: Iterable[str] = (), data_dirs: Iterable[str] = ()) -> list[str]:
    """Existing runtime paths, each also by its resolved name (Landlock rules attach to inodes).
    ``data_dirs``: what the runtime's libraries read in every job (matplotlib's prepared font cache)."""
    found: set[str] = set()
    for path in (*_python_paths(package_dirs), *_SYSTEM, *data_dirs):
        if os.path.exists(path):
            found.add(os.path.abspath(path))
            found.add(os.path.realpath(path))
    # A child of another listed path adds nothing to the read grant; keep the list short.
    return _minimal(found)


def _minimal(paths: Iterable[str]) -> list[str]:
    result: list[str] = []
    for path in sorted(paths):
        if not any(beneath(path, kept) for kept in result):
            result.append(path)
    return result


def rule_paths(read_paths: Iterable[str]) -> tuple[str, ...]:
    """Every path a template holds a Landlock rule of (policy.RuntimeRules), from its runtime paths (``Ready``)."""
    return (*read_paths, *DEVICE_READ, *DEVICE_WRITE, *NETWORK_FILES)


# inotify(7): a directory entry made, removed or renamed; the watched directory itself gone or moved; events lost.
_IN_MOVED_FROM, _IN_MOVED_TO, _IN_CREATE, _IN_DELETE = 0x40, 0x80, 0x100, 0x200
_IN_DELETE_SELF, _IN_MOVE_SELF, _IN_Q_OVERFLOW, _IN_IGNORED = 0x400, 0x800, 0x4000, 0x8000
_IN_ONLYDIR = 0x01000000
_ENTRY_EVENTS = _IN_MOVED_FROM | _IN_MOVED_TO | _IN_CREATE | _IN_DELETE
_WATCHED = _ENTRY_EVENTS | _IN_DELETE_SELF | _IN_MOVE_SELF | _IN_ONLYDIR
_ALWAYS = _IN_DELETE_SELF | _IN_MOVE_SELF | _IN_Q_OVERFLOW | _IN_IGNORED
_EVENT = struct.Struct("=iIII")  # wd, mask, cookie, len; then the name, padded with NULs to len
_MAX_NAMES = 4096  # names followed at most (a loop of symlinks ends here: the kernel refuses it anyway)
# statx(2): what names a path's file exactly: its inode, device and the mount it is reached through, by the
# mount's id that is never reused (Linux 6.8; before it, the reusable one, and before 5.8, none).
_STATX_INO, _STATX_MNT_ID, _STATX_MNT_ID_UNIQUE = 0x100, 0x1000, 0x4000
_STATX = struct.Struct("=I28xQ96xIIQ")  # stx_mask; stx_ino; stx_dev_major, stx_dev_minor; stx_mnt_id
_STATX_SIZE = 256


class RuntimeWatch:
    """Whether a path of the runtime's rules may name another file than it did (a new inode): every directory
    entry on the way to each path (and to where a symlink among them leads) is watched with inotify, and the
    mount table with ``/proc/self/mountinfo`` (a mount over a path changes what it names, with no entry made).
    When the table changes, only the mounts at a path on the way, and what each path names (statx: inode and
    the mount's unique id), are compared: a mount elsewhere (a container started, another program's tmpfs)
    names nothing a rule holds, and counted, it discarded every child prepared ahead each time. An unmount
    under a watched directory is inotify's ``IN_UNMOUNT``/``IN_IGNORED``. The table is a state compared, not
    events counted: the server asks as each child prepared arrives as well as before it hands a job, so that
    a mount made and gone between two jobs is seen if a child was prepared under it (server/templates.py).

    A child prepared ahead holds the rules its template had when it was confined; a template reopens a
    changed rule before it forks (``RuntimeRules.refresh``), not for a child already waiting. :meth:`changes`
    is what the server asks before it hands a job to such a child: one ``poll`` of two descriptors when
    nothing happened, where comparing the paths' identities would be a ``stat`` each. It counts every change
    seen (and events it cannot tell apart from one: an overflow, an unreadable mount table); the server forks the job
    when the count moved since its template's children were prepared, and the template discards them then.
    A change inotify cannot see (made by another host on a network filesystem) is seen, as before, only by the
    children forked after it.
    """

    def __init__(self, paths: Iterable[str]) -> None:
        self._paths = tuple(paths)
        self._lock = _thread.allocate_lock()  # one watch serves every worker's template
        self._changes = 0
        self._blind = False
        fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"inotify_init1: {os.strerror(err)}")
        self._inotify = fd
        self._names: dict[int, set[bytes]] = {}  # watch descriptor -> the entries of that directory that matter
        try:
            self._mounts = os.open("/proc/self/mountinfo", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            os.close(fd)
            raise
        self._on_the_way: frozenset[bytes] = frozenset()  # every path whose mount would change what a rule names
        self._mounted: frozenset[tuple[bytes, ...]] | None = None
        self._named: tuple[tuple[int, ...], ...] | None = None  # what each path named when the table was last read
        try:
            self._watch()
        except OSError:
            self.close()
            raise
        self._poller = select.poll()
        self._poller.register(self._inotify, select.POLLIN)
        self._poller.register(self._mounts, select.POLLPRI)  # the kernel says POLLPRI once per change of the table

    def _entries(self) -> dict[str, set[bytes]]:
        """Each directory on the way to a path, and the entries in it that lead there: every symlink on the way
        followed, each hop of a chain (a -> b -> c: retargeting b changes what a names) as well as its end."""
        wanted: dict[str, set[bytes]] = {}
        names = [os.path.abspath(path) for path in self._paths] + [os.path.realpath(path) for path in self._paths]
        seen: set[str] = set()
        while names and len(seen) < _MAX_NAMES:
            name = names.pop()
            if name in seen:
                continue
            seen.add(name)
            while True:
                parent, entry = os.path.split(name)
                if not entry:
                    break
                wanted.setdefault(parent, set()).add(os.fsencode(entry))
                try:
                    target = os.readlink(name)
                except OSError:  # not a symlink, or not there
                    pass
                else:  # the hop: where it leads, from the directory the link is in
                    names.append(os.path.normpath(os.path.join(parent, target)))
                name = parent
        return wanted

    def _watch(self) -> None:
        """Watch every directory on the way. OSError if one that is there cannot be watched (ENOSPC: the user's
        inotify watches used up; EACCES): a change in it would go unseen."""
        self._names.clear()
        entries = self._entries()
        self._on_the_way = frozenset(os.fsencode(directory) for directory in entries) | frozenset(
            os.path.join(os.fsencode(directory), name) for directory, names in entries.items() for name in names)
        self._mounted = self._mounts_on_the_way()
        self._named = self._identities()
        for directory, names in entries.items():
            wd = libc.inotify_add_watch(self._inotify, os.fsencode(directory), _WATCHED)
            if wd < 0:
                err = ctypes.get_errno()
                if err in (errno.ENOENT, errno.ENOTDIR):  # missing: its parent's entry is watched
                    continue
                raise OSError(err, f"inotify_add_watch {directory}: {os.strerror(err)}")
            self._names.setdefault(wd, set()).update(names)

    def changes(self) -> int:
        """How many times a path may have come to name another file, up to now (see the class's docstring)."""
        with self._lock:
            if self._blind:  # a directory on the way could not be watched again: every call is a change
                self._changes += 1
                return self._changes
            ready = self._poller.poll(0)
            if ready:
                # Each poll of the mount table takes its news (POLLPRI once per change): read them here.
                self._read(any(fd == self._mounts for fd, _ in ready))
            return self._changes

    def _mounts_on_the_way(self) -> frozenset[tuple[bytes, ...]] | None:
        """The mounts at a path on the way, each as its id, device, root and mount point name it (None: the
        table could not be read, which never compares equal)."""
        try:
            with open("/proc/self/mountinfo", "rb") as table:
                lines = table.read().splitlines()
        except OSError:
            return None
        mounted = set()
        for line in lines:
            fields = line.split(b" ", 5)
            if len(fields) > 4:
                # proc_pid_mountinfo(5): space, tab, newline and backslash in a path are octal escapes.
                point = fields[4].replace(b"\\040", b" ").replace(b"\\011", b"\t").replace(
                    b"\\012", b"\n").replace(b"\\134", b"\\")
                if point in self._on_the_way:
                    mounted.add((fields[0], fields[2], fields[3], point))
        return frozenset(mounted)

    def _identities(self) -> tuple[tuple[int, ...], ...] | None:
        """What each path names, as statx(2) says it (a symlink followed, as a rule's open does): its inode, its
        device and the id of the mount it is reached through; () for a path that is not there. None where the C
        library has no statx (before glibc 2.28): every change of the mount table then counts."""
        if not hasattr(libc, "statx"):
            return None
        buffer = ctypes.create_string_buffer(_STATX_SIZE)
        named: list[tuple[int, ...]] = []
        for path in self._paths:
            if libc.statx(-100, os.fsencode(path), 0, _STATX_INO | _STATX_MNT_ID | _STATX_MNT_ID_UNIQUE, buffer) < 0:
                named.append(())
                continue
            mask, inode, major, minor, mount = _STATX.unpack_from(buffer)
            named.append((inode, major, minor, mount if mask & (_STATX_MNT_ID | _STATX_MNT_ID_UNIQUE) else 0))
        return tuple(named)

    def _read(self, mounted: bool) -> None:
        changed = False
        if mounted:
            # The mount lines at a path on the way, and what each path names now: a mount's id is reused (the
            # lowest free one), so a bind mount made again at the same place of a directory that took the old
            # one's name shows the very line it showed before; only the path's file (the mount's unique id, and
            # the inode, which the template's rule and the children's hold, so never reused) tells them apart.
            now, named = self._mounts_on_the_way(), self._identities()
            changed = now is None or named is None or now != self._mounted or named != self._named
        try:
            while True:
                data = os.read(self._inotify, 1 << 16)
                offset = 0
                while offset + _EVENT.size <= len(data):
                    wd, mask, _, length = _EVENT.unpack_from(data, offset)
                    name = data[offset + _EVENT.size:offset + _EVENT.size + length].rstrip(b"\0")
                    offset += _EVENT.size + length
                    if mask & _ALWAYS or name in self._names.get(wd, ()):
                        changed = True
        except BlockingIOError:
            pass
        if changed:
            self._changes += 1
            try:
                self._watch()  # a directory replaced on the way, or a symlink that leads elsewhere now
            except OSError as exc:
                _warn("cannot watch the runtime's files for changes any longer (%s): every job is forked "
                      "from now, none is handed a child prepared ahead", exc)
                self._blind = True

    def close(self) -> None:
        os.close(self._inotify)
        os.close(self._mounts)


class _Unwatched:
    """Where no watch can be made (inotify's instances used up, no /proc): every job is forked, never handed a
    child prepared before it (each call is a change)."""

    def __init__(self) -> None:
        self._changes = 0

    def changes(self) -> int:
        self._changes += 1
        return self._changes


_watches: dict[tuple[str, ...], RuntimeWatch | _Unwatched] = {}
_watches_lock = _thread.allocate_lock()


def runtime_watch(paths: Iterable[str]) -> RuntimeWatch | _Unwatched:
    """The process's one watch of ``paths`` (every template of a pool holds the same rules)."""
    key = tuple(paths)
    with _watches_lock:
        watch = _watches.get(key)
        if watch is None:
            try:
                watch = RuntimeWatch(key)
            except OSError as exc:
                _warn("cannot watch the runtime's files for changes (%s): every job is forked, none is "
                      "handed a child prepared ahead", exc)
                watch = _Unwatched()
            _watches[key] = watch
        return watch
