"""What the caller's ``RayPool`` and a node's actor send each other, as values Ray pickles.

The caller sends one :class:`Work` per run (a plain job or a session step); the node answers with a stream of
:class:`HostCall` (a job called a host function: the caller runs it and answers through the actor's
``reply``) ending in one :class:`Finished` (the job's ``pynox.Result``) or one :class:`Raised` (what the
node's ``pynox.Pool`` raised: a refused request, a pool that cannot start).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pynox import Result

__all__ = ["Finished", "HostCall", "Message", "Raised", "Work"]


@dataclass(frozen=True)
class Work:
    """One run for a node's pool: ``session`` names the caller's session for a step, None for a plain job.
    ``grants`` are ``Pool.run``'s keywords (a session's, for its first step); ``step`` a step's own."""

    key: str
    code: str | None
    functions: tuple[str, ...]
    host_errors: str | None
    return_value: bool
    grants: dict[str, Any] = field(default_factory=dict)
    session: str | None = None
    step: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class HostCall:
    """A job on the node called host function ``function``; ``seq`` names the call in the actor's ``reply``."""

    seq: int
    function: str
    args: list[Any]
    kwargs: dict[str, Any]


@dataclass(frozen=True)
class Finished:
    result: Result


@dataclass(frozen=True)
class Raised:
    """The node's pool raised this for the run (``RequestError``, ``PoolError``, ``TypeError``...)."""

    error: BaseException


Message = HostCall | Finished | Raised
