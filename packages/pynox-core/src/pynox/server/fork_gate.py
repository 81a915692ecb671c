"""Whether a job's fork may go through: never, unless the pool armed a window for one session fork.

A job's filter refuses to run ``fork``, ``vfork`` and ``clone`` without ``CLONE_THREAD`` itself: it hands
them to the steward (``SECCOMP_RET_USER_NOTIF``, see policy/seccomp.py ``FORK_SYSCALLS``), which answers
``EPERM``, the errno the filter used to give, so that a job sees no difference. Only a listener can let one
call through (``SECCOMP_USER_NOTIF_FLAG_CONTINUE``): that is what a session fork needs (docs/architecture.md,
"Forking a session"), and why the decision is here, in the pool.

A :class:`ForkWindow` armed by the pool for a session fork (``parent=True``) lets through exactly one call: a
``clone(CLONE_PARENT | SIGCHLD)`` from the session's main thread with no stack of its own (job/session_fork.py),
whose child is the session's template's. The first design, kept for its tests and the bench, is a double
fork: the session's process forks C1, C1 forks the copy and exits, and the copy is orphaned to the session's
template. Its window lets through, in this order and once each:

1. a ``clone`` from the session's main thread (the notification's tid is the session's pid), and
2. a ``clone`` from a process whose parent is the session's process (C1: a thread group's leader, so not
   a thread C1 started),

each with exactly glibc's fork flags (``CLONE_CHILD_SETTID | CLONE_CHILD_CLEARTID | SIGCHLD``) and no stack of
its own, as ``os.fork()`` makes it: the arguments are registers, which the kernel copies into the
notification, so the job cannot change them after this check as it could memory a pointer names. Anything
else is refused: ``fork`` and ``vfork`` (glibc does not use them), other flags (``CLONE_VM``, ``CLONE_FILES``,
namespaces ...), another thread, a second fork, a call after the window's deadline or once it is closed.
``clone3`` never reaches here: the filter answers it ``ENOSYS``.
"""

from __future__ import annotations

import _thread
import time
from collections.abc import Callable

from ..policy.seccomp import syscall_number

__all__ = ["FORKS", "GLIBC_FORK", "PARENT_FORK", "ForkWindow", "process_facts"]

# CLONE_CHILD_SETTID | CLONE_CHILD_CLEARTID | SIGCHLD: what glibc's fork() passes to clone.
GLIBC_FORK = 0x0100_0000 | 0x0020_0000 | 17
# CLONE_PARENT | SIGCHLD: a fork whose child is its caller's sibling, the session's template's own child (the
# pool's session fork, see job/session_fork.py).
PARENT_FORK = 0x0000_8000 | 17
_CLONE = syscall_number("clone")
# The calls the filter hands to the steward for this gate (a number of -1: not on this architecture).
FORKS = frozenset(number for number in (syscall_number("fork"), syscall_number("vfork"), _CLONE) if number >= 0)


def process_facts(tid: int) -> tuple[int, int]:
    """``(tgid, ppid)`` of a task, from ``/proc/<tid>/status``; ``(-1, -1)`` if it cannot be read."""
    tgid = ppid = -1
    try:
        with open(f"/proc/{tid}/status", "rb") as status:
            for line in status:
                if line.startswith(b"Tgid:"):
                    tgid = int(line.split()[1])
                elif line.startswith(b"PPid:"):
                    ppid = int(line.split()[1])
                    break  # PPid comes after Tgid
    except (OSError, ValueError, IndexError):
        return -1, -1
    return tgid, ppid


class ForkWindow:
    """One session fork's window: which forks the steward lets through, until when. Armed on the session's
    thread, asked by the steward's, so every move is under one lock."""

    def __init__(self, pid: int, within: float, *, facts: Callable[[int], tuple[int, int]] = process_facts,
                 parent: bool = False) -> None:
        """``pid``: the session's process. ``within``: seconds the window stays open. ``parent``: one fork only,
        ``clone(CLONE_PARENT | SIGCHLD)`` from the session's main thread with no stack of its own, whose child
        is the template's (the pool's session fork); else the double fork above."""
        self.pid = pid
        self._parent = parent
        self._deadline = time.monotonic() + within
        self._facts = facts
        self._lock = _thread.allocate_lock()  # threading's Lock; threading itself is not loaded in a template
        self._through = 0  # forks let through so far: the session's, then C1's
        self._closed = False

    @property
    def through(self) -> int:
        with self._lock:
            return self._through

    def close(self) -> None:
        """No fork goes through any more (the copy arrived, or the pool gave up on it)."""
        with self._lock:
            self._closed = True

    def admit(self, tid: int, nr: int, args: tuple[int, ...], still_waiting: Callable[[], bool]) -> bool:
        """Whether this call (``args``: its registers) goes through. ``still_waiting``: the call still waits
        for its answer, so ``tid`` still names its task (checked after ``/proc`` was read: a killed caller's
        tid could be reused)."""
        with self._lock:
            if self._closed or time.monotonic() > self._deadline:
                return False
            if self._parent:
                allowed = nr == _CLONE and args[0] == PARENT_FORK and args[1] == 0 and tid == self.pid
                if allowed:
                    self._through, self._closed = 1, True
                return allowed
            if nr != _CLONE or args[0] != GLIBC_FORK or args[1] != 0:  # flags, then the new stack
                return False
            if self._through == 0:
                allowed = tid == self.pid
            elif self._through == 1:
                tgid, ppid = self._facts(tid)
                allowed = tid != self.pid and tgid == tid and ppid == self.pid and still_waiting()
            else:
                allowed = False
            if allowed:
                self._through += 1
                self._closed = self._through == 2
            return allowed
