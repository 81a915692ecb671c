"""The session fork's window (server/fork_gate.py ``ForkWindow(parent=True)``) as pure logic: which calls it
admits. Its use under the real filter and steward is tests/sandbox/test_fork_gate.py's (the double fork) and
tests/pool/test_pool_session_fork.py's (the pool's fork, and a job's own fork refused in the window)."""

from __future__ import annotations

import pytest

from pynox.policy.seccomp import syscall_number
from pynox.server.fork_gate import GLIBC_FORK, PARENT_FORK, ForkWindow

pytestmark = pytest.mark.pure

PID = 4242
CLONE = syscall_number("clone")


def _admit(window: ForkWindow, tid: int = PID, nr: int = CLONE, flags: int = PARENT_FORK, stack: int = 0) -> bool:
    return window.admit(tid, nr, (flags, stack, 0, 0, 0, 0), lambda: True)


def test_it_admits_the_pools_fork_once() -> None:
    window = ForkWindow(PID, 10.0, parent=True)
    assert _admit(window)
    assert window.through == 1
    assert not _admit(window)  # a second fork, even the same call


@pytest.mark.parametrize("call", [
    {"tid": PID + 1},  # another thread (or process)
    {"flags": GLIBC_FORK},  # a fork of the session's own (its child would be the job's)
    {"flags": PARENT_FORK | 0x100},  # CLONE_VM
    {"flags": PARENT_FORK | 0x4000},  # CLONE_VFORK
    {"stack": 0x7000_0000},  # a stack of its own
    {"nr": syscall_number("vfork")},
])
def test_it_refuses_anything_else(call: dict[str, int]) -> None:
    window = ForkWindow(PID, 10.0, parent=True)
    assert not _admit(window, **call)
    assert _admit(window)  # the refused call did not use the window up


def test_it_refuses_after_its_deadline_or_once_closed() -> None:
    assert not _admit(ForkWindow(PID, -1.0, parent=True))
    closed = ForkWindow(PID, 10.0, parent=True)
    closed.close()
    assert not _admit(closed)
