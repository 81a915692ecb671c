"""What a tool runs on: a pool's part that :class:`~pynox.CodeTool` uses, as a protocol.

``pynox.Pool`` is one runner; ``pynox_ray.RayPool``, which carries the same API
across a cluster, is another. A tool is typed on these protocols rather than on
``Pool``, so a runner of another transport gets a tool without pretending to be
a ``Pool`` (no cast) and without reaching into the core's private parts.
"""

from __future__ import annotations

from typing import Any, Protocol

from .result import Result

__all__ = ["Runner", "SessionRunner"]

class SessionRunner(Protocol):
    """A session: its steps share one process until it is closed (``alive`` says whether it still has one)."""

    # Each takes pynox.Session's own arguments; ``*args, **keywords`` of Any is how a protocol says "the
    # session's own signature" to a type checker.
    def run(self, *args: Any, **keywords: Any) -> Result: ...

    async def arun(self, *args: Any, **keywords: Any) -> Result: ...

    @property
    def alive(self) -> bool: ...

    def close(self) -> None: ...

    async def aclose(self) -> None: ...


class Runner(Protocol):
    """What a tool needs of a pool: where its relative grants resolve (``cwd``), the config whose profiles
    and ceiling it applies (``config_path``), what its ready event said (``ready``; ``{}`` before it
    started), and runs and sessions."""

    cwd: str
    config_path: str | None

    @property
    def ready(self) -> dict[str, Any]: ...

    # Each takes pynox.Pool's keywords (functions, host_errors, host_globals, the grants); ``*args, **keywords``
    # of Any is how a protocol says "the pool's own signature" to a type checker.
    def run(self, *args: Any, **keywords: Any) -> Result: ...

    async def arun(self, *args: Any, **keywords: Any) -> Result: ...

    def session(self, *args: Any, **keywords: Any) -> SessionRunner: ...
