"""A request as the client builds it: only the fields its caller gave, checked for shape; the pool applies
the profile, the defaults and the ceiling (``Config.apply``). One home, for ``Pool``, ``Session`` and the
tools that check their grants when they are made."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence

from ..errors import RequestError
from ..grant_types import PathLike, Units
from ..protocol import Request

__all__ = ["build_request"]


def _paths(paths: Sequence[PathLike] | None) -> list[str] | None:
    if paths is None:
        return None
    if isinstance(paths, str | os.PathLike):
        raise TypeError("paths must be a list, e.g. allow_read=['data'], not a single string")
    return [os.fspath(p) for p in paths]


def _hosts(hosts: Sequence[str] | None) -> list[str] | None:
    if hosts is None:
        return None
    if isinstance(hosts, str):
        raise TypeError("allow_hosts must be a list, e.g. allow_hosts=['index.example.com'], not a single string")
    return list(hosts)


def _packages(packages: Sequence[str] | None) -> list[str] | None:
    if packages is None:
        return None
    if isinstance(packages, str):
        raise TypeError("packages must be a list, e.g. packages=['numpy'], not a single string")
    return list(packages)


def _units(value: Units | None, what: str) -> Units | None:
    """A duration or size as given (the pool checks it); a float that is not finite is refused here: JSON has no
    NaN nor infinity, and it would reach the pool as null, which means the default."""
    if isinstance(value, float) and not math.isfinite(value):
        raise RequestError(f"{what}: {value} is not a finite number")
    return value


def build_request(code: str | None = None, *, script: PathLike | None = None, name: str | None = None,
                  args: Sequence[str] | None = None, allow_read: Sequence[PathLike] | None = None,
                  allow_write: Sequence[PathLike] | None = None, allow_network: bool | None = None,
                  allow_hosts: Sequence[str] | None = None, env: Mapping[str, str] | None = None,
                  timeout: Units | None = None,
                  memory: Units | None = None, max_output: Units | None = None,
                  max_file_size: Units | None = None, package_dirs: Sequence[PathLike] | None = None,
                  profile: str | None = None, functions: Sequence[str] | None = None,
                  return_value: bool | None = None, host_globals: str | None = None,
                  scratch: bool | None = None, packages: Sequence[str] | None = None,
                  pip_install: bool | None = None, stream: bool | None = None) -> Request:
    """A request with only the fields that were given (the pool applies defaults and the ceiling)."""
    return Request(
        code=code, script=os.fspath(script) if script is not None else None, name=name,
        args=list(args) if args is not None else None, allow_read=_paths(allow_read),
        allow_write=_paths(allow_write), allow_network=allow_network, allow_hosts=_hosts(allow_hosts),
        env=dict(env) if env is not None else None, timeout=_units(timeout, "timeout"), memory=_units(memory, "memory"),
        max_output=_units(max_output, "max_output"), max_file_size=_units(max_file_size, "max_file_size"),
        package_dirs=_paths(package_dirs),
        profile=profile, functions=list(functions) if functions else None, return_value=return_value or None,
        host_globals=host_globals,  # type: ignore[arg-type]  # checked by the pool, with its own words
        scratch=scratch or None,
        packages=_packages(packages), pip_install=pip_install or None,
        stream=stream or None,
    )
