"""The process-wide pool behind :func:`pynox.run`, :func:`pynox.tool` and a tool made with no pool: one
home, started on first use with the config :func:`pynox.config.default_config_path` finds, closed at exit."""

from __future__ import annotations

import atexit
import os
import threading

from ..config import default_config_path
from .pool import Pool
from .runner import provide_default

__all__ = ["default_pool"]

_default: Pool | None = None
_default_lock = threading.Lock()


def default_pool() -> Pool:
    """The process-wide pool behind :func:`pynox.run` and :func:`pynox.tool`: started on first use,
    closed at exit."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Pool(config=default_config_path())
            atexit.register(_close_default)
        return _default


def _close_default() -> None:
    global _default
    with _default_lock:
        pool, _default = _default, None
    if pool is not None:
        pool.close()


def _after_fork_in_child() -> None:
    # A fork taken while another thread held the lock would leave it held for good in the child.
    global _default_lock
    _default_lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)
provide_default(default_pool)
