"""PID 1's duties, for a pool that is a container's entrypoint (the first process of a PID namespace).

The kernel treats PID 1 apart: a signal it has no handler for is dropped, and every process orphaned in
the namespace is re-parented to it, to be reaped. A pool is neither a good reaper (its templates are its
own children, waited for by their :class:`subprocess.Popen`) nor a process that should ever be
re-parented to. So, as ``tini`` and ``docker --init`` do, PID 1 forks: the pool runs below it, in a
process group of its own that holds the terminal if there is one, and PID 1 forwards the signals a
supervisor sends to the pool, reaps every orphan, and exits with the pool's own status. When it exits,
the kernel kills whatever is left in the namespace: nothing outlives the pool.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable

__all__ = ["serve_as_init"]

# Sent to PID 1 by `docker stop`, `docker kill -s`, Kubernetes, a terminal: each goes on to the pool.
_FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


def serve_as_init(serve: Callable[[], int]) -> int:
    """Run ``serve`` in a child and be its init; returns (in PID 1) the status to exit with."""
    waited = {*_FORWARDED, signal.SIGCHLD}
    # Blocked before the fork: a signal that comes while the pool starts waits for the loop, never lost.
    signal.pthread_sigmask(signal.SIG_BLOCK, waited)
    pool = os.fork()
    if pool == 0:
        _own_group_and_terminal()
        signal.pthread_sigmask(signal.SIG_UNBLOCK, waited)
        return serve()
    # The pool's pipes are the pool's: a client must see EOF, or EPIPE, when the pool ends, not when we do.
    quiet = os.open("/dev/null", os.O_RDWR)
    os.dup2(quiet, 0)
    os.dup2(quiet, 1)
    os.close(quiet)
    while True:
        signum = signal.sigwaitinfo(waited).si_signo
        if signum != signal.SIGCHLD:
            try:
                os.kill(pool, signum)
            except ProcessLookupError:
                pass  # exited already: its status is on its way
            continue
        status = _reap(pool)
        if status is not None:
            return status


def _reap(pool: int) -> int | None:
    """Reap every child that has ended (the pool, and orphans of the namespace); the pool's exit status
    once it has ended."""
    ended = None
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return ended
        if pid == 0:
            return ended
        if pid == pool:
            ended = os.waitstatus_to_exitcode(status)
            ended = ended if ended >= 0 else 128 - ended  # killed by a signal: as a shell reports it


def _own_group_and_terminal() -> None:
    """The pool leads a process group of its own: Ctrl-C reaches it once, from the terminal (which it
    holds), not twice (from the terminal and forwarded by PID 1), which would escalate its drain."""
    os.setpgid(0, 0)
    if not os.isatty(sys.stdin.fileno()):
        return
    previous = signal.signal(signal.SIGTTOU, signal.SIG_IGN)  # a background group may not take it otherwise
    try:
        os.tcsetpgrp(sys.stdin.fileno(), os.getpgrp())
    except OSError:
        pass  # not our controlling terminal: there is nothing to hold
    finally:
        signal.signal(signal.SIGTTOU, previous)
