"""Privileges: an optional unprivileged identity, then no capabilities and no way to gain any.

The pool often runs as root. A job keeps uid 0 unless the operator asks for
another, but without a single capability, with every capability dropped from
the bounding and ambient sets, with ``SECBIT_NOROOT`` locked and with
``no_new_privs``, root in the sandbox is no stronger than any user.
"""

from __future__ import annotations

import ctypes
import errno
import os

from ._libc import libc, prctl

__all__ = [
    "SECUREBITS", "ProcessName", "drop_bounding_set", "drop_privileges", "set_parent_death_signal", "set_process_name",
    "switch_user",
]

_PR_SET_PDEATHSIG = 1
_PR_SET_NAME = 15
_PR_SET_DUMPABLE = 4
_PR_CAPBSET_DROP = 24
_PR_SET_SECUREBITS = 28
_PR_SET_NO_NEW_PRIVS = 38
_PR_CAP_AMBIENT = 47
_PR_CAP_AMBIENT_CLEAR_ALL = 4
# NOROOT, NO_SETUID_FIXUP, KEEP_CAPS_LOCKED, NO_CAP_AMBIENT_RAISE, each with its lock bit.
_SECURE_NOROOT = 1 << 0
_SECURE_NOROOT_LOCKED = 1 << 1
_SECURE_NO_SETUID_FIXUP = 1 << 2
_SECURE_NO_SETUID_FIXUP_LOCKED = 1 << 3
_SECURE_KEEP_CAPS_LOCKED = 1 << 5
_SECURE_NO_CAP_AMBIENT_RAISE = 1 << 6
_SECURE_NO_CAP_AMBIENT_RAISE_LOCKED = 1 << 7
SECUREBITS = (
    _SECURE_NOROOT | _SECURE_NOROOT_LOCKED | _SECURE_NO_SETUID_FIXUP | _SECURE_NO_SETUID_FIXUP_LOCKED
    | _SECURE_KEEP_CAPS_LOCKED | _SECURE_NO_CAP_AMBIENT_RAISE | _SECURE_NO_CAP_AMBIENT_RAISE_LOCKED
)
_CAPABILITY_VERSION_3 = 0x20080522


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32)]


def _last_capability() -> int:
    try:
        with open("/proc/sys/kernel/cap_last_cap") as f:
            return int(f.read())
    except OSError:
        return 63  # drop every bit that could ever exist; unknown ones fail with EINVAL and are skipped


def switch_user(uid: int, gid: int) -> None:
    """Become ``uid:gid`` with no supplementary groups (root only; an error otherwise)."""
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)


def set_process_name(name: str) -> None:
    """The name ``ps`` and ``/proc/<pid>/comm`` show (15 bytes at most): operators see each process's role."""
    prctl(_PR_SET_NAME, ctypes.cast(ctypes.c_char_p(name.encode()[:15]), ctypes.c_void_p).value or 0,
          what="PR_SET_NAME")


class ProcessName:
    """A name laid out before the fork, for a child to take (:func:`set_process_name`'s ``ctypes`` objects,
    built in the child, cost it ~25 page faults: here it only makes the system call)."""

    def __init__(self, name: str) -> None:
        self._buffer = ctypes.create_string_buffer(name.encode()[:15])
        self._address = ctypes.addressof(self._buffer)

    def take(self) -> None:
        prctl(_PR_SET_NAME, self._address, what="PR_SET_NAME")


def set_parent_death_signal(signum: int) -> None:
    """Die with ``signum`` when the parent dies; cleared by a credential change, so set it after one."""
    prctl(_PR_SET_PDEATHSIG, signum, what="PR_SET_PDEATHSIG")


def drop_bounding_set() -> None:
    """Empty the capability bounding set. Inherited across fork, so the template does it once for all jobs:
    it limits only what an exec could gain, and neither the template nor a job ever execs."""
    for cap in range(_last_capability() + 1):
        try:
            prctl(_PR_CAPBSET_DROP, cap, what="PR_CAPBSET_DROP")
        except OSError as exc:
            # EPERM: no CAP_SETPCAP to begin with, so the bounding set cannot matter; EINVAL: no such cap.
            if exc.errno not in (errno.EINVAL, errno.EPERM):
                raise


def drop_privileges() -> None:
    """Drop every capability from the remaining sets, lock the securebits, set no_new_privs; stay dumpable.

    The bounding set is already empty (:func:`drop_bounding_set`, in the template)."""
    if os.geteuid() == 0:
        # Without NOROOT, root would regain a full set of capabilities on exec (exec is also denied).
        prctl(_PR_SET_SECUREBITS, SECUREBITS, what="PR_SET_SECUREBITS")
    prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, what="clear ambient capabilities")
    header = _CapHeader(_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    if libc.capset(ctypes.byref(header), data) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"capset: {os.strerror(err)}")
    prctl(_PR_SET_NO_NEW_PRIVS, 1, what="PR_SET_NO_NEW_PRIVS")
    # Dumpable, explicitly: a change of uid (switch_user) leaves a process non-dumpable, and a non-dumpable
    # process is reachable only with CAP_SYS_PTRACE, which a pool run as an ordinary user or in a container
    # lacks. The pool must reach the job (the steward reads the arguments of its delegated calls from its
    # memory and opens what its descriptors name through /proc), and the job must read its own /proc/self
    # (environ, mem), which a non-dumpable process's uid may not. What non-dumpable gave, and what gives
    # it now: no core file (RLIMIT_CORE is 0, hard, and a job could always make itself dumpable with one
    # prctl); no other job reaching this one (seccomp refuses ptrace and process_vm_*, Landlock grants a
    # job only its own /proc/<pid> entries and refuses ptrace across its domains); the pool's uid reaching
    # it, which only that uid's own processes can do: give jobs a uid of their own (run_as) when others run
    # under the pool's. See docs/sandbox-contract.md.
    prctl(_PR_SET_DUMPABLE, 1, what="PR_SET_DUMPABLE")
