"""A job's grants, bound when the job starts: one descriptor per granted path, opened by the server.

Landlock grants inodes, not names. If a child were confined by opening the
granted names itself, ahead of its job or by name in the template, the grant
would mean whatever the names pointed at back then: a directory renamed away,
a file replaced atomically, a symlink a previous job planted. So the server
opens every granted path at the moment the job starts, and the child's rules
are built from exactly those descriptors.

The paths were fully resolved when the request was accepted (and the ceiling
judged that resolution), so they contain no symlink. They are opened with
``RESOLVE_NO_SYMLINKS``: if a component has become a symlink since, the open
fails and the job is refused, rather than following a link nobody checked.
A child prepared ahead serves a job only if every descriptor names the same
file (:func:`identity`), which the template checks at hand-over.

A write grant was refused at acceptance if it overlapped a mount of the
kernel's own settings (cgroups, /proc, /sys: ``grants.refuse_write_grant``).
What is mounted can change while the request waits, so it is checked again
where it is used (:func:`refuse_kernel_filesystems`): the filesystem the opened
descriptor is on (its mount id, from the kernel's fdinfo of that descriptor),
and every mount beneath where it is now. A mount made after the job started
is not seen (a session's later steps included): making one takes root on the
host.
"""

from __future__ import annotations

import ctypes
import errno
import os
from collections.abc import Sequence

from ..errors import KernelSupportError, RequestError
from ..paths import KERNEL_FILESYSTEMS, beneath, mounts
from ._libc import syscall

__all__ = ["close_all", "identity", "open_at", "open_grants", "refuse_kernel_filesystems"]

_SYS_OPENAT2 = 437  # the same number on every architecture
_AT_FDCWD = -100
_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_NO_SYMLINKS = 0x04
_RESOLVE_BENEATH = 0x08


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


def _openat2(dirfd: int, path: bytes, flags: int, resolve: int) -> int:
    how = _OpenHow(flags | os.O_CLOEXEC, 0, resolve)
    return syscall(_SYS_OPENAT2, dirfd, path, ctypes.byref(how), ctypes.c_size_t(ctypes.sizeof(how)),
                   what=f"openat2({os.fsdecode(path)})")


def _open_exactly(path: str) -> int:
    return _openat2(_AT_FDCWD, os.fsencode(path), os.O_PATH, _RESOLVE_NO_SYMLINKS | _RESOLVE_NO_MAGICLINKS)


def open_at(dirfd: int, path: bytes, flags: int, *, beneath: bool) -> int:
    """``openat2`` from ``dirfd``, never through a magic link (``/proc/<pid>/fd/N``); with ``beneath``, also
    never above ``dirfd`` and through no symlink at all."""
    return _openat2(dirfd, path, flags, _RESOLVE_NO_MAGICLINKS | (_RESOLVE_BENEATH | _RESOLVE_NO_SYMLINKS if beneath
                                                                  else 0))


def open_grants(paths: Sequence[str]) -> list[int]:
    """Open each resolved grant path; raises :class:`RequestError` if one changed since it was resolved.

    The caller owns the descriptors (see :func:`close_all`)."""
    opened: list[int] = []
    try:
        for path in paths:
            try:
                opened.append(_open_exactly(path))
            except OSError as exc:
                raise _changed(path, exc) from None
    except BaseException:
        close_all(opened)
        raise
    return opened


def refuse_kernel_filesystems(paths: Sequence[str], fds: Sequence[int]) -> None:
    """At the job's start, for its write grants (``paths`` and their descriptors): :class:`RequestError` if
    one is now on a filesystem of the kernel's own settings, or has one mounted beneath it."""
    if not fds:
        return
    seen = mounts()
    kinds = {mount_id: kind for mount_id, _, kind in seen}
    for path, fd in zip(paths, fds, strict=True):
        kind = kinds.get(_mount_id(fd), "")
        where = os.readlink(f"/proc/self/fd/{fd}")
        inside = next((f"{point} ({what})" for _, point, what in seen
                       if what in KERNEL_FILESYSTEMS and beneath(point, where)), None)
        if kind in KERNEL_FILESYSTEMS or inside is not None:
            what = f"it is now on a {kind} filesystem" if inside is None else f"{inside} is now mounted in it"
            raise RequestError(f"the write grant {path} changed after the request was accepted ({what}, where "
                               "the kernel keeps its own settings: cgroups, /proc, /sys); nothing ran")


def _mount_id(fd: int) -> int:
    """The id of the mount the descriptor is on (``mnt_id`` of its fdinfo), as mountinfo numbers them."""
    with open(f"/proc/self/fdinfo/{fd}", "rb") as info:
        for line in info:
            if line.startswith(b"mnt_id:"):
                return int(line.split()[1])
    return -1


def _changed(path: str, exc: OSError) -> Exception:
    if exc.errno == errno.ENOSYS:
        return KernelSupportError("this kernel has no openat2 (Linux 5.6+): grants cannot be bound safely")
    if exc.errno == errno.ELOOP:
        why = "it (or a directory on its way) became a symlink"
    elif exc.errno in (errno.ENOENT, errno.ENOTDIR):
        why = "it no longer exists"
    else:
        why = os.strerror(exc.errno or 0)
    return RequestError(f"the granted path {path} changed after the request was accepted ({why}); "
                        "nothing ran: send the request again")


def identity(fds: Sequence[int]) -> tuple[tuple[int, int], ...]:
    """What the descriptors name: (device, inode) each. While a descriptor is open its inode cannot be
    freed, so its number cannot be reused for another file: equal identities mean the same files."""
    identities = []
    for fd in fds:
        info = os.fstat(fd)
        identities.append((info.st_dev, info.st_ino))
    return tuple(identities)


def close_all(fds: Sequence[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass
