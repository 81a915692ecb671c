"""A request becomes a job: the grants resolved by the shared rules (:mod:`pynox.grants`), with the pool's own facts.

The rules of a request (paths, units, the ceiling) are shared with a tool made
in the host application, which checks them when it is made; what only the pool
knows (the runtime it grants, whether a cgroup counts a job's memory) is
added here, on the server's side: :func:`to_job` for one job outside a pool,
:class:`Resolver` for a pool's requests (its profiles and ceiling, the user
its jobs run as, the paths earlier jobs wrote, the tenant's memory budget, the
packages grant), whether they run as jobs or open sessions.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import msgspec

from ..config import PoolOptions
from ..defaults import DEFAULTS, Defaults
from ..errors import RequestError
from ..grants import Grants, bounded
from ..policy.cgroups import TenantGroup, memory_counted
from ..protocol import Request, RequestId
from ..units import format_size
from ..wire.host_channel import PIP_FUNCTION
from ..wire.spec import JobSpec
from .admission import queue_timeout
from .flights import Flight

if TYPE_CHECKING:
    from .packages import Installer
    from .scratch import ScratchRoot

__all__ = ["Job", "Resolver", "to_job"]


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


# A job's request as its resolution sees it, but for its code (see Resolver._alike_key).
_Alike = tuple[bytes, tuple[int, int] | None, bool]
_ALIKE_KEPT = 64  # resolutions kept; all dropped when one more comes (a client varying its limits job by job)


def _resolved_alike(spec: JobSpec, request: Request) -> bool:
    """Whether every job with ``request``'s fields but its code resolves to ``spec`` but for its code: nothing
    of it was found on disk (no path granted, its profile's included: a path is resolved and checked again for
    each job, as it may have changed), and it names no package nor a scratch directory."""
    confinement = spec.confinement
    return not (confinement.allow_read or confinement.allow_write or confinement.package_dirs or spec.payload.script
                or spec.packages or spec.pip_dir or request.scratch)


@dataclass
class Job:
    """A request accepted to run as a job, on its way to a worker."""

    id: RequestId | None
    spec: JobSpec
    max_output: int
    accepted_ns: int  # when the pool read its line: its wait is counted from here
    flight: Flight
    queue_deadline_ns: int | None = None  # refused if no worker took it by then (see admission.py)
    tenant: TenantGroup | None = None  # its tenant's cgroups, when the tenant has a budget


class Resolver:
    """A pool's requests as the jobs (and sessions' first steps) they run as: :meth:`resolve` is every
    decision the pool adds to the shared rules, and raises RequestError (nothing ran) for a request it refuses.

    ``budget_of``: the cgroups of the tenant a request id belongs to, when it has a budget; ``run_as_of``: the
    user its tenant says its jobs run as (both set by a listening pool, see listen.py)."""

    def __init__(self, options: PoolOptions, installer: Installer, scratch: ScratchRoot,
                 budget_of: Callable[[RequestId | None], TenantGroup | None],
                 run_as_of: Callable[[RequestId | None], tuple[int, int] | None]) -> None:
        self.options = options
        self.cwd = os.getcwd()
        self.read_paths: list[str] = []  # the runtime's, once the first template has reported them
        self.installer = installer
        self.scratch = scratch
        self.budget_of = budget_of
        self._run_as_of = run_as_of
        # Every directory or file a job of this pool has been allowed to write (see grants.Grants.of).
        self._written: set[str] = set()
        # Where a job may never write (see grants.Grants.of).
        self._pool_files = {"metrics socket": options.metrics_socket} if options.metrics_socket else {}
        # A job that read the key could sign a state another client's session then restores (session_state.py).
        self._pool_secrets = ({"session_key_file": os.path.realpath(options.session_key_file)}
                              if options.session_key_file else {})
        # Jobs that name no path resolve alike but for their code (see _resolved_alike): each kept with its key.
        self._alike: dict[_Alike, tuple[JobSpec, int]] = {}
        self._alike_under: tuple[object, object] | None = None  # the config and runtime paths they were made under

    def resolve(self, request: Request, *, session: bool = False) -> tuple[JobSpec, int]:
        """The job ``request`` runs as (a session's, with ``session``), and its output cap."""
        config = self.options.config
        # The paths are judged against the ceiling by to_job, on the resolution it grants.
        run_as = config.run_as(request.profile, self._run_as_of(request.id))
        alike = None if session else self._alike_key(request, run_as)
        if alike is not None and (known := self._alike.get(alike)) is not None:
            spec, max_output = known
            self._within_budget(request.id, spec)
            return msgspec.structs.replace(spec, payload=msgspec.structs.replace(spec.payload, code=request.code)), \
                max_output
        given = request
        request = bounded(request, config, self.cwd, check_paths=False)
        # No job may write where the pool keeps the environments it installs.
        runtime_paths = [*self.read_paths, self.installer.root]
        spec, max_output = to_job(request, cwd=self.cwd, runtime_paths=runtime_paths, session=session,
                                  writable=self._written, ceiling=config.ceiling,
                                  uid=run_as[0] if run_as else None, gid=run_as[1] if run_as else None,
                                  pool_files=self._pool_files, pool_secrets=self._pool_secrets)
        self.scratch.refuse_overlap(spec)
        self._within_budget(request.id, spec)
        if self.installer.problem() is None:  # its hints then name the packages grant
            spec = msgspec.structs.replace(
                spec, confinement=msgspec.structs.replace(spec.confinement, installs_packages=True))
        elif spec.packages or request.pip_install:
            raise RequestError(f"{'packages' if spec.packages else 'pip_install'}: {self.installer.problem()}")
        if request.pip_install:
            if not session:
                raise RequestError("pip_install: only a session takes it (its steps' `%pip install` lines); a job "
                                   "names its packages")
            # A directory of its own, granted read-only now: what `%pip install` adds beneath it later is
            # readable (Landlock rules cover a directory's later content), and the job still writes nothing.
            directory = self.installer.session_dir()
            confinement = msgspec.structs.replace(
                spec.confinement, package_dirs=[*spec.confinement.package_dirs, directory],
                allow_read=[*spec.confinement.allow_read, directory], host_channel=True)
            payload = msgspec.structs.replace(spec.payload, functions=[*spec.payload.functions, PIP_FUNCTION])
            spec = msgspec.structs.replace(spec, confinement=confinement, payload=payload, pip_dir=directory)
        # Where this job may write, a later job's grant must not follow a symlink: it may have planted one.
        self._written.update(spec.confinement.allow_write)
        if alike is not None and _resolved_alike(spec, given):
            if len(self._alike) >= _ALIKE_KEPT:
                self._alike.clear()
            self._alike[alike] = (spec, max_output)
        return spec, max_output

    def _alike_key(self, request: Request, run_as: tuple[int, int] | None) -> _Alike | None:
        """What a job's resolution depends on besides its code: every other field of its request (its id and
        trace context aside), the user it runs as (its tenant's, its profile's or the pool's), and whether this
        pool installs packages (its hints say so); None for a request that could name a path. Kept ones are
        dropped when the config or the runtime paths they were resolved under are not the pool's any more."""
        if request.script is not None or request.allow_read or request.allow_write or request.package_dirs \
                or request.packages or request.pip_install or request.scratch:
            return None
        under = (self.options.config, self.read_paths)
        if self._alike_under is None or self._alike_under[0] is not under[0] or self._alike_under[1] is not under[1]:
            self._alike.clear()
            self._alike_under = under
        fields = msgspec.json.encode(msgspec.structs.replace(request, id=None, code=None, traceparent=None))
        return fields, run_as, self.installer.problem() is None

    def _within_budget(self, request_id: RequestId | None, spec: JobSpec) -> None:
        budget = self.budget_of(request_id)
        if budget is not None and budget.memory is not None and spec.confinement.memory > budget.memory:
            # Its own limit could never be reached: the budget would kill it first, and report that.
            raise RequestError(f"memory: this request's limit of {format_size(spec.confinement.memory)} is above "
                               f"the memory_budget of tenant {budget.name!r} ({format_size(budget.memory)}), which "
                               f"all its jobs and sessions share; ask for at most {format_size(budget.memory)}")

    def job(self, request: Request, arrived_ns: int) -> Job:
        """``request``, read at ``arrived_ns``, as a job: resolved, its scratch directory made if it asks for one,
        its queue deadline set (its own, its profile's, the pool's)."""
        spec, max_output = self.resolve(request)
        if request.scratch:
            spec = self.scratch.grant(spec)
        wait = queue_timeout(request, self.options.config, self.options.queue_timeout)
        return Job(request.id, spec, max_output, arrived_ns, Flight(request.id),
                   None if wait is None else arrived_ns + int(wait * 1e9), self.budget_of(request.id))
