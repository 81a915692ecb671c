"""A request becomes a job: the grants resolved by the shared rules (:mod:`pynox.grants`), with the pool's own facts.

The rules of a request (paths, units, the ceiling) are shared with a tool made
in the host application, which checks them when it is made; what only the pool
knows (the runtime it grants, whether a cgroup counts a job's memory) is
added here, on the server's side.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Literal

from ..defaults import DEFAULTS, Defaults
from ..grants import Grants
from ..policy.cgroups import memory_counted
from ..protocol import Request
from ..wire.spec import JobSpec

__all__ = ["to_job"]


def to_job(request: Request, *, cwd: str, runtime_paths: Sequence[str], hint_style: Literal["api", "cli"] = "api",
           defaults: Defaults = DEFAULTS, writable: Iterable[str] = (),
           ceiling: tuple[Sequence[str], Sequence[str]] | None = None, uid: int | None = None,
           gid: int | None = None, session: bool = False,
           pool_files: Mapping[str, str] | None = None,
           pool_secrets: Mapping[str, str] | None = None) -> tuple[JobSpec, int]:
    """The job a :func:`~pynox.grants.bounded` request runs as, and its output cap (see :meth:`Grants.of`)."""
    grants = Grants.of(request, cwd=cwd, runtime_paths=runtime_paths, writable=writable, ceiling=ceiling,
                       defaults=defaults, pool_files=pool_files, pool_secrets=pool_secrets)
    # Where no cgroup counts what a job writes into a tmpfs, each file it writes is bounded by its memory.
    return grants.job(request, cwd=cwd, hint_style=hint_style, uid=uid, gid=gid, session=session,
                      defaults=defaults, files_at_memory=not memory_counted()), grants.max_output
