"""Landlock through raw system calls: files, TCP and scoping, for every right the ABI knows.

Landlock denies every access right a ruleset *handles* unless a rule grants it.
We handle every right the running kernel's ABI defines, so an access type the
policy forgot about is denied rather than silently allowed, and grant:

* read-only (execute, read file, read directory) on the runtime paths and the
  request's ``allow_read``;
* every right on the request's ``allow_write``;
* no TCP bind or connect unless the network is granted (ABI 4 and later);
* signal and abstract unix socket scoping (ABI 6 and later), so a job can
  neither signal nor connect to anything outside its own domain: not the
  template, not the pool, not another job.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
from collections.abc import Iterable

from ._libc import syscall

__all__ = [
    "ACCESS_FS_READ",
    "FILE_RIGHTS",
    "abi_version",
    "build_ruleset",
    "fitting",
    "fs_rights",
    "nest",
    "open_rule",
    "restrict_self",
    "ruleset_attr",
]

_SYS_CREATE_RULESET = 444  # the same number on every architecture
_SYS_ADD_RULE = 445
_SYS_RESTRICT_SELF = 446
_CREATE_RULESET_VERSION = 1 << 0
_RULE_PATH_BENEATH = 1

EXECUTE = 1 << 0
WRITE_FILE = 1 << 1
READ_FILE = 1 << 2
READ_DIR = 1 << 3
REFER = 1 << 13  # ABI 2
TRUNCATE = 1 << 14  # ABI 3
IOCTL_DEV = 1 << 15  # ABI 5
ACCESS_FS_READ = EXECUTE | READ_FILE | READ_DIR
# Rights that mean something on a file (not a directory); a file rule with any other is EINVAL.
FILE_RIGHTS = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV

NET_BIND_TCP = 1 << 0  # ABI 4
NET_CONNECT_TCP = 1 << 1
SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0  # ABI 6
SCOPE_SIGNAL = 1 << 1


class _RulesetAttr(ctypes.Structure):
    _fields_ = [
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    ]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def abi_version() -> int:
    """The Landlock ABI of the running kernel, or 0 when Landlock is absent, disabled or blocked."""
    return probe()[0]


def probe() -> tuple[int, str]:
    """The Landlock ABI this process can use, and when it is 0, why, in words an operator can act on."""
    try:
        return syscall(_SYS_CREATE_RULESET, None, ctypes.c_size_t(0), _CREATE_RULESET_VERSION,
                       what="landlock_create_ruleset"), ""
    except OSError as exc:
        return 0, _ABSENT.get(exc.errno or 0, f"landlock_create_ruleset failed: {exc.strerror}")


_ABSENT = {
    errno.ENOSYS: "this kernel has no Landlock (Linux 5.13 or later built with CONFIG_SECURITY_LANDLOCK), or "
                  "a seccomp profile answers its system calls with ENOSYS",
    errno.EOPNOTSUPP: "Landlock is built into this kernel but not enabled at boot: add landlock to the lsm= "
                      "kernel parameter (see /sys/kernel/security/lsm)",
    # Landlock never answers EPERM to a version query: something in front of the kernel refused it.
    errno.EPERM: "the Landlock system calls are blocked (EPERM), most likely by a container's seccomp profile: "
                 "Docker's default profile allows them from Docker 20.10.18 on; otherwise run the container "
                 "with a profile that allows landlock_create_ruleset, landlock_add_rule and "
                 "landlock_restrict_self",
}


def fs_rights(abi: int) -> int:
    """Every filesystem right the ABI defines."""
    rights = (1 << 13) - 1  # EXECUTE .. MAKE_SYM, ABI 1
    if abi >= 2:
        rights |= REFER
    if abi >= 3:
        rights |= TRUNCATE
    if abi >= 5:
        rights |= IOCTL_DEV
    return rights


def _attr_size(abi: int) -> int:
    # The struct grew with the ABI; an older kernel rejects a larger one with non-zero tail.
    if abi >= 6:
        return 24
    if abi >= 4:
        return 16
    return 8


def ruleset_attr(abi: int, *, network: bool) -> tuple[int, int, int, int]:
    """What a ruleset of ``abi`` handles (filesystem, TCP unless ``network``, scopes) and the size of the
    attribute the kernel is given: everything the ABI defines, so what no rule grants is denied."""
    return (fs_rights(abi), NET_BIND_TCP | NET_CONNECT_TCP if abi >= 4 and not network else 0,
            SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if abi >= 6 else 0, _attr_size(abi))


def open_rule(path: str, rights: int, *, missing_ok: bool) -> tuple[int, int] | None:
    """Open ``path`` for a rule: an ``O_PATH`` descriptor and the rights that fit it (a file takes fewer)."""
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except FileNotFoundError:
        if missing_ok:
            return None
        raise FileNotFoundError(errno.ENOENT, "granted path does not exist", path) from None
    try:
        return fd, fitting(fd, rights)
    except BaseException:
        os.close(fd)
        raise


def fitting(fd: int, rights: int) -> int:
    """The part of ``rights`` that a rule on what ``fd`` names may carry: a file takes fewer than a directory."""
    return rights if stat.S_ISDIR(os.fstat(fd).st_mode) else rights & FILE_RIGHTS


def build_ruleset(
    abi: int,
    *,
    network: bool,
    prepared: Iterable[tuple[int, int]] = (),
    optional: Iterable[tuple[str, int]] = (),
) -> int:
    """Create a ruleset and return its descriptor; the caller enforces it with :func:`restrict_self`.

    ``prepared`` rules are descriptors with their rights: the runtime paths the template opened once,
    and the job's grants the server opened when the job started (see :mod:`pynox.policy.grants`).
    ``optional`` paths, with the rights that fit them, are opened here and skipped when absent (the
    entries of the child's own ``/proc/<pid>``).
    """
    handled_fs, handled_net, scoped, size = ruleset_attr(abi, network=network)
    attr = _RulesetAttr(handled_fs, handled_net, scoped)
    ruleset = syscall(_SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), 0,
                      what="landlock_create_ruleset")
    try:
        for fd, rights in prepared:
            _add_rule(ruleset, fd, rights)
        for path, rights in optional:
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except FileNotFoundError:
                continue
            try:
                _add_rule(ruleset, fd, rights)
            finally:
                os.close(fd)
    except BaseException:
        os.close(ruleset)
        raise
    return ruleset


def _add_rule(ruleset: int, fd: int, rights: int) -> None:
    rule = _PathBeneathAttr(rights, fd)
    syscall(_SYS_ADD_RULE, ruleset, _RULE_PATH_BENEATH, ctypes.byref(rule), 0, what="landlock_add_rule")


def nest(abi: int) -> None:
    """Put this process in a domain of its own below its current one, taking nothing away from it: a session
    fork's copy (job/session_fork.py), which inherited the original's domain. Landlock lets a process reach
    another (``ptrace``, and through it ``/proc/<pid>/mem``, ``environ``, ``fd``) only in its own domain or one
    nested below; from ABI 6 signals and abstract unix sockets too. So the copy no longer reaches the original
    through the original's ``/proc/<pid>`` entries, which its inherited rules still grant, and the original
    (whose domain is the parent) keeps no rule that names the copy's. The layer handles ``MAKE_BLOCK`` (which
    a job, without ``CAP_MKNOD``, never has) and ``REFER``, granted everywhere: a layer that leaves it
    unhandled denies every rename and link across directories."""
    handled = (1 << 11) | (REFER if abi >= 2 else 0)  # MAKE_BLOCK
    scoped = SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if abi >= 6 else 0
    attr = _RulesetAttr(handled, 0, scoped)
    ruleset = syscall(_SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(_attr_size(abi)), 0,
                      what="landlock_create_ruleset")
    try:
        if abi >= 2:
            root = os.open("/", os.O_PATH | os.O_CLOEXEC)
            try:
                _add_rule(ruleset, root, REFER)
            finally:
                os.close(root)
        restrict_self(ruleset)
    finally:
        os.close(ruleset)


def restrict_self(ruleset: int) -> None:
    """Enforce the ruleset on this thread (the child is single-threaded); needs no_new_privs."""
    syscall(_SYS_RESTRICT_SELF, ruleset, 0, what="landlock_restrict_self")
