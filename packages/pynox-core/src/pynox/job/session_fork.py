"""A session fork, inside the session's confined process: the pool's fork step (see server/sessions.py).

The step forks once with ``clone(CLONE_PARENT | SIGCHLD)`` (docs/architecture.md, "Forking a session"): the copy
is the session's template's child from its first instruction, never a child of code the job controls, and the
page tables are copied once (the double fork first designed copied them twice and tore C1's copy down on the
path). It goes through only because the pool armed the steward's gate for this one call (server/fork_gate.py);
the job's own code, before or after, is refused as always. A raw clone skips glibc's fork bookkeeping, so the
copy's thread control block keeps the original's tid: ``raise()`` and ``pthread_kill()`` would name the original,
and the own-process filter the copy stacks refuses them (it may name only ``0``). The copy leaves the session's
pipes to the original and takes the three the step brought (at FORK_OUTPUTS) for its own, the control channel (at
FORK_CONTROL) and the host channel, with ``pynox_host`` renewed on it (the original's calls in flight are not the
copy's), arms its parent-death signal, stacks its own-process filter, leads a session of its own, says its pid on
that channel and stops itself: the pool checks all of it from ``/proc`` (it trusts none of what runs here), has the
template adopt it, and continues it with its first step, which it serves as the original serves its own.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from typing import NoReturn

from ..policy import landlock
from ..policy.own_process import OwnProcessFilter
from ..policy.privileges import set_parent_death_signal
from ..policy.seccomp import syscall_number
from ..wire.descriptors import CHANNEL, CONTROL, DISPLAY, FORK_CHANNEL, FORK_CONTROL, FORK_OUTPUTS, STEP
from ..wire.exits import SETUP_FAILED_EXIT
from ..wire.state import FORK_PID
from . import display, execute, interrupts, pynox_host
from .report import drop_channel

__all__ = ["fork"]

# The GIL held across the call (PyDLL), as os.fork() holds it across fork().
_libc = ctypes.PyDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_libc.syscall.argtypes = [ctypes.c_long] * 6
_python = ctypes.pythonapi
_CLONE = syscall_number("clone")
# CLONE_PARENT | SIGCHLD (server/fork_gate.py PARENT_FORK): the copy is the template's child, its caller's sibling.
PARENT_FORK = 0x0000_8000 | 17


def fork() -> None:
    """Fork this session: one ``clone(CLONE_PARENT | SIGCHLD)``, whose child (the copy) is the template's, as
    ``os.fork()`` makes a fork (the interpreter's before- and after-fork work on each side), and return in the
    original."""
    template = os.getppid()
    assert execute.serving is not None
    channel = execute.serving[0].host_channel  # the step brought the copy's host-call channel too
    sys.stdout.flush()
    sys.stderr.flush()
    _python.PyOS_BeforeFork()
    pid = _libc.syscall(_CLONE, PARENT_FORK, 0, 0, 0, 0)
    if pid == 0:
        try:  # the copy: never returns; should it raise, it must not go on as the original's step
            _python.PyOS_AfterFork_Child()
            _become_copy(template, channel)
        finally:
            os._exit(SETUP_FAILED_EXIT)
    error = ctypes.get_errno()
    _python.PyOS_AfterFork_Parent()
    os.close(FORK_CONTROL)
    if channel:
        os.close(FORK_CHANNEL)
    for fd in FORK_OUTPUTS:  # the copy's pipes
        os.close(fd)
    if pid < 0:
        raise OSError(error, f"the session fork's clone failed: {os.strerror(error)}")


def _become_copy(template: int, channel: bool) -> NoReturn:
    try:
        # The session's pipes are the original's (its results must be the original's alone): the copy's own, which
        # the fork step brought, take their numbers, and the original's copies of them (execute.py) are closed.
        for target, fd in zip(STEP, FORK_OUTPUTS, strict=True):
            os.dup2(fd, target)
            os.close(fd)
        devnull = os.open("/dev/null", os.O_WRONLY)
        os.dup2(devnull, DISPLAY)
        os.close(devnull)
        drop_channel()  # a copy of a report descriptor (report.py), if one was made: the original's
        execute.drop_outputs()
        if execute.control_copy is not None:  # the original's control channel's copy (execute.py): not the copy's
            os.close(execute.control_copy)
            execute.control_copy = None
        os.dup2(FORK_CONTROL, CONTROL)
        os.close(FORK_CONTROL)
        if channel:  # pynox_host's socket is at CHANNEL: from now on it is the copy's own channel
            os.dup2(FORK_CHANNEL, CHANNEL)
            os.close(FORK_CHANNEL)
            pynox_host.renew_in_copy()  # and pynox_host's state a new channel's, whatever the original's was
        set_parent_death_signal(signal.SIGKILL)
        if os.getppid() != template:  # the template died before the signal was armed
            os._exit(SETUP_FAILED_EXIT)
        interrupts.forbid()
        display.forked()  # a frame a thread of the original was writing is not the copy's (nor is its lock)
        # The original's own-process filter (policy/own_process.py) lets a call name the original's pid, not
        # this one's: one for this pid is stacked on it (stricter wins: only 0, the caller, is left), and a
        # session of its own keeps the original's process-group signals (kill(-pid), kill(0)) from reaching
        # this process, and its own from reaching the original's.
        os.setsid()
        # Its inherited Landlock rules grant the original's /proc/<pid> entries (mem, environ, fd): a domain of
        # its own below the original's keeps it from reaching the original through them (policy/landlock.py).
        landlock.nest(landlock.abi_version())
        OwnProcessFilter.build().install(os.getpid())
        os.write(CONTROL, FORK_PID.pack(os.getpid()))
        os.kill(0, signal.SIGSTOP)  # its own group, itself: continued by the pool with its first step
        assert execute.serving is not None
        confinement, main = execute.serving
    except BaseException:
        os._exit(SETUP_FAILED_EXIT)
    execute.serve_session(confinement, main, None)
