"""The signal the pool interrupts a session's step with, shared by the pool (which sends it) and the job.

Not SIGINT: a supervisor's stop signals (Ctrl-C to the process group, systemd's KillMode=control-group,
supervisord's stopasgroup) reach every process of the pool, its jobs included, and how a job ends is the
pool's decision, never a side effect of the pool's own stop (see template/fork_server.py). A real-time
signal nobody sends to a whole group carries only the pool's interrupt; the job turns it into the
``KeyboardInterrupt`` a notebook's interrupt raises (job/interrupts.py). The template ignores it, so a
child that has not yet taken it (a session's first step still starting) drops it, and is killed once
the interrupt's grace is over.
"""

from __future__ import annotations

import signal

__all__ = ["INTERRUPT_SIGNAL"]

INTERRUPT_SIGNAL = signal.SIGRTMIN + 2
