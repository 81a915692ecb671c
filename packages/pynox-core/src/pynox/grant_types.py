"""The grants as typed keyword arguments: one definition, shared by every API that takes them.

``Pool.run``, ``Pool.session``, ``pynox.run``, ``pynox.tool``, ``CodeTool`` and every adapter take
``**grants: Unpack[Grants]`` (``RunGrants``, ``SessionGrants`` where a run or a session takes more), so a
misspelt grant is a type checker's error in the caller's code; at run time :func:`check_grants` refuses it
with its name and the valid ones, before any of our functions sees it (Python's own ``TypeError`` would
name whichever internal function first took the keywords).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from typing import TypedDict

__all__ = ["GRANT_NAMES", "RUN_GRANT_NAMES", "SESSION_GRANT_NAMES", "Grants", "RunGrants", "SessionGrants",
           "check_grants"]

PathLike = str | os.PathLike[str]
Units = str | int | float  # "10s", "512MB", or a number of seconds or bytes


class Grants(TypedDict, total=False):
    """What a job may touch and how much it may use; every key is optional (the pool's defaults apply)."""

    allow_read: Sequence[PathLike]
    allow_write: Sequence[PathLike]
    allow_network: bool
    # TCP to these hosts only: "host:port", a bare host for 80 and 443, an address or a CIDR (pynox.hosts).
    allow_hosts: Sequence[str]
    env: Mapping[str, str]
    timeout: Units
    memory: Units
    max_output: Units
    max_file_size: Units
    package_dirs: Sequence[PathLike]
    # A scratch directory the pool owns, as the working directory (and $PYNOX_SCRATCH): a session's files go
    # in and out with Session.upload/download/files, a plain run's come back in Result.files.
    scratch: bool
    # Distributions the pool installs before the code runs ("numpy", "pandas>=2,<3"), within the operator's
    # [pool.limits] packages; the code imports them (pynox.requirements, pynox.server.packages).
    packages: Sequence[str]


class SessionGrants(Grants, total=False):
    """A session's grants: a profile of the config beside them."""

    profile: str


class RunGrants(SessionGrants, total=False):
    """One run's: what it runs (a script instead of ``code``), under which file name, with which ``argv``."""

    script: PathLike
    name: str
    args: Sequence[str]


GRANT_NAMES: frozenset[str] = frozenset(Grants.__annotations__)
SESSION_GRANT_NAMES: frozenset[str] = GRANT_NAMES | {"profile"}
RUN_GRANT_NAMES: frozenset[str] = SESSION_GRANT_NAMES | {"script", "name", "args"}


def check_grants(owner: str, given: Iterable[str], valid: frozenset[str] = GRANT_NAMES) -> None:
    """``TypeError`` naming ``owner``, each unknown name in ``given`` (with the likeliest meant one) and
    the valid names."""
    unknown = sorted(set(given) - valid)
    if not unknown:
        return
    import difflib  # only on the error's path: the template imports this module, and each fork copies it

    described = []
    for name in unknown:
        close = difflib.get_close_matches(name, sorted(valid), n=1)
        described.append(f"{name!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    raise TypeError(f"{owner} got an unknown grant {', '.join(described)}; the grants are: "
                    f"{', '.join(sorted(valid))}")

