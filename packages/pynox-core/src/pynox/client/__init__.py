"""The host application's side: ``Pool`` and ``Session`` over a pool's pipes, ``CodeTool``, ``tool()``, ``Result``.

What a program that runs jobs loads. It never imports the server, the
template, the job's side or the kernel policy (``tests/test_layout.py``).
"""

from .default import default_pool
from .pool import Pool, PynoxPool, Session, pool_command

__all__ = ["Pool", "PynoxPool", "Session", "default_pool", "pool_command"]
