"""A session fork, inside the session's confined process: the pool's fork step (see server/sessions.py).

The step double-forks (docs/architecture.md, "Forking a session"): this process forks C1, C1 forks the copy
and exits at once, so the copy is orphaned to the session's template, a subreaper, and never a child of code
the job controls. Each fork goes through only because the pool armed the steward's gate for these two
(server/fork_gate.py); the job's own code, before or after, is refused as always. The copy leaves the step's
pipes to the original, takes the control channel the step brought (at FORK_CONTROL) for its own, waits until
the template is its parent, arms its parent-death signal, says its pid on that channel and stops itself: the
pool checks all of it from ``/proc`` (it trusts none of what runs here), has the template adopt it, and
continues it with its first step, which it serves as the original serves its own.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import NoReturn

from ..policy.own_process import OwnProcessFilter
from ..policy.privileges import set_parent_death_signal
from ..wire.descriptors import CONTROL, FORK_CONTROL, STEP
from ..wire.exits import SETUP_FAILED_EXIT
from ..wire.state import FORK_PID
from . import execute, interrupts

__all__ = ["fork"]

_ORPHANED_WITHIN = 2.0  # seconds C1 has to exit (it exits at once)


def fork() -> None:
    """Fork this session; in the original, return once C1 has ended (the copy is then on its own)."""
    template = os.getppid()
    sys.stdout.flush()
    sys.stderr.flush()
    middle = os.fork()
    if middle == 0:
        try:  # C1: never returns
            if os.fork() == 0:
                _become_copy(template)
        finally:
            os._exit(0)
    os.close(FORK_CONTROL)
    _, status = os.waitpid(middle, 0)
    if status != 0:
        raise RuntimeError(f"the session fork's middle process ended with status {status}")


def _become_copy(template: int) -> NoReturn:
    try:
        devnull = os.open("/dev/null", os.O_WRONLY)
        for fd in STEP:  # the step's pipes are the original's: its result must be the original's alone
            os.dup2(devnull, fd)
        os.close(devnull)
        os.dup2(FORK_CONTROL, CONTROL)
        os.close(FORK_CONTROL)
        deadline = time.monotonic() + _ORPHANED_WITHIN
        while os.getppid() != template:
            if time.monotonic() > deadline:
                os._exit(SETUP_FAILED_EXIT)
            time.sleep(0.0002)
        set_parent_death_signal(signal.SIGKILL)
        if os.getppid() != template:  # the template died before the signal was armed
            os._exit(SETUP_FAILED_EXIT)
        interrupts.forbid()
        # The original's own-process filter (policy/own_process.py) lets a call name the original's pid, not
        # this one's: one for this pid is stacked on it (stricter wins: only 0, the caller, is left), and a
        # session of its own keeps the original's process-group signals (kill(-pid), kill(0)) from reaching
        # this process, and its own from reaching the original's.
        os.setsid()
        OwnProcessFilter.build().install(os.getpid())
        os.write(CONTROL, FORK_PID.pack(os.getpid()))
        os.kill(0, signal.SIGSTOP)  # its own group, itself: continued by the pool with its first step
        assert execute.serving is not None
        confinement, main = execute.serving
    except BaseException:
        os._exit(SETUP_FAILED_EXIT)
    execute.serve_session(confinement, main, None)
