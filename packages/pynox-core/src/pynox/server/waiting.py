"""Waiting for one descriptor to be readable, whatever its number.

``select.select`` refuses a descriptor numbered 1024 or above (``FD_SETSIZE``):
``ValueError: filedescriptor out of range``. A pool holds a dozen descriptors
per session (its template's socket, its control channel, its cgroup files, its
child's pidfd), so its 70th session or so got such numbers, and the step that
met one failed with the pool's own error. ``poll`` takes any number.
"""

from __future__ import annotations

import select

__all__ = ["readable"]


def readable(fd: int, timeout: float | None = None) -> bool:
    """Whether ``fd`` is readable (or closed by its other end) within ``timeout`` seconds (None: no bound)."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(None if timeout is None else max(timeout, 0.0) * 1000))
