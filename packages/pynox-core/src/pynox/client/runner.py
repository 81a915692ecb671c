"""What a tool runs on: a pool's part that :class:`~pynox.CodeTool` uses, as a protocol.

``pynox.Pool`` is one runner; ``pynox_ray.RayPool``, which carries the same API
across a cluster, is another. A tool is typed on these protocols rather than on
``Pool``, so a runner of another transport gets a tool without pretending to be
a ``Pool`` (no cast) and without reaching into the core's private parts.
"""

from __future__ import annotations

from collections.abc import Callable
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


# The two things a tool needs from the client's upper half, told from above so that the tool (code_tool,
# model_tool) sits below pool.py and default.py in the dependency order: pool.py builds tools
# (``Pool.tool``), so the tool may not import pool.py back (docs/architecture.md, "Dependency order").


class PoolSession:
    """The nominal base of :class:`pynox.Session`: a tool tells a pool's own session (it carries its pool,
    grants and functions, and has files) from any other value by ``isinstance`` against this, without
    importing pool.py. ``pynox.Session`` is its one subclass."""

    __slots__ = ()


_default: list[Callable[[], Runner]] = []


def provide_default(factory: Callable[[], Runner]) -> None:
    """Name the process-wide default pool's maker; pynox.client's ``__init__`` imports default.py, which
    calls this, before any tool can run."""
    _default[:] = [factory]


def default_runner() -> Runner:
    """The process-wide default pool (started on first use), for a tool made with no pool."""
    return _default[0]()
