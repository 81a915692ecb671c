"""From a request to a job: defaults, units, resolved paths, and what is refused before anything runs.

Paths are resolved against the caller's working directory and through every
symlink, because Landlock grants the inode a path names: ``data/link -> /etc``
grants ``/etc``, and that is what a ceiling must be checked against and what
the result's ``policy`` reports.

A symlink is followed only if no job could have planted it: one that lies
where jobs may write (beneath this request's own write grants, or the
ceiling's) is refused, since an earlier job could have put it there to widen
this one. The resolved paths are bound to descriptors when the job starts
(:mod:`pynox.policy.grants`), so a link planted after this check is refused
too.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from .errors import ConfigError, RequestError, cut, quoted
from .job import MAX_GRANTS, JobSpec
from .names import ENV_RULE, FUNCTION_RULE, is_env_variable, is_function_name
from .paths import beneath
from .policy.runtime import overlapping
from .protocol import Request
from .units import parse_duration, parse_size

_T = TypeVar("_T")

__all__ = [
    "DEFAULTS", "Defaults", "Resolved", "beneath", "check_ceiling", "parse_request_duration", "parse_request_size",
    "resolve", "resolve_path", "to_job",
]


@dataclass(frozen=True)
class Defaults:
    timeout: float = 30.0
    memory: int = 1 << 30
    max_output: int = 1 << 20
    name: str = "agent.py"


DEFAULTS = Defaults()
_MAX_ARGS = 4096
_MAX_LINKS = 40  # as the kernel's own limit on symlinks followed in one path


@dataclass(frozen=True)
class Resolved:
    """One path as one walk resolved it: where it leads, and every symlink on the way (by its own
    resolved location). The ceiling, the planted-link rule and the grant all use this one walk."""

    given: str
    path: str
    links: tuple[str, ...]


def resolve(path: object, base: str, field: str) -> Resolved:
    """Resolve ``path`` against ``base`` through every symlink, as :func:`os.path.realpath` does, in one
    iterative walk (a chain of links cannot exhaust the stack) that records the links it follows.

    Raises :class:`RequestError` for something that is not a path, more than 40 links (a loop), or a
    path that changed while it was walked."""
    if not isinstance(path, str) or not path or "\0" in path:
        raise RequestError(f"{field}: {quoted(path)} is not a path")
    pending = _joined(path, base).split("/")[::-1]
    resolved, links = "/", []
    while pending:
        name = pending.pop()
        if name in ("", "."):
            continue
        if name == "..":
            resolved = os.path.dirname(resolved)
            continue
        candidate = os.path.join(resolved, name)
        try:
            is_link = stat.S_ISLNK(os.lstat(candidate).st_mode)
        except OSError:  # missing (or not a directory): the rest is taken as written, as realpath does
            is_link = False
        if not is_link:
            resolved = candidate
            continue
        links.append(candidate)
        if len(links) > _MAX_LINKS:
            raise RequestError(f"{field}: {path} goes through more than {_MAX_LINKS} symlinks (a loop?)")
        try:
            target = os.readlink(candidate)
        except OSError:
            raise RequestError(f"{field}: {path} changed while it was resolved; send the request again") from None
        if target.startswith("/"):
            resolved = "/"
        pending += target.split("/")[::-1]
    return Resolved(path, resolved, tuple(links))


def resolve_path(path: object, base: str, field: str) -> str:
    return resolve(path, base, field).path


def _joined(path: str, base: str) -> str:
    return os.path.join(base, os.path.expanduser(path) if path.startswith("~") else path)


def check_ceiling(field: str, paths: Iterable[Resolved], allowed: Sequence[str]) -> None:
    """Every resolved path must lie beneath one of the ``allowed`` roots (the [pool.limits] ceiling)."""
    for resolved in paths:
        if not any(beneath(resolved.path, parent) for parent in allowed):
            named = resolved.given if resolved.given == resolved.path else \
                f"{resolved.given} (resolves to {resolved.path})"
            raise RequestError(f"{field}: {named} is outside the [pool.limits] ceiling "
                               f"(allowed: {', '.join(allowed) if allowed else 'none'})")


def _refuse_planted_links(resolved: dict[str, list[Resolved]], writable: Sequence[str]) -> None:
    for field, paths in resolved.items():
        for path in paths:
            for link in path.links:
                root = next((root for root in writable if beneath(link, root)), None)
                if root is not None:
                    raise RequestError(f"{field}: {path.given} goes through the symlink {link}, which lies in "
                                       f"{root} where jobs may write; an earlier job could have planted it, so "
                                       "it is not followed: grant the path it points to by its own name")


def _existing(paths: Iterable[object], base: str, field: str) -> list[Resolved]:
    resolved: list[Resolved] = []
    for path in paths:
        found = resolve(path, base, field)
        if not os.path.exists(found.path):
            raise RequestError(f"{field}: {cut(str(path))} does not exist")
        if all(found.path != other.path for other in resolved):
            resolved.append(found)
    return resolved


def requested_units(parse: Callable[[Any, str], _T], value: Any, field: str) -> _T:
    """A unit of a request: a bad one is the request's fault (RequestError). The parsers bound every
    number themselves (a 400-digit one is "too long", never an OverflowError)."""
    try:
        return parse(value, field)
    except ConfigError as exc:
        raise RequestError(str(exc)) from None


def _units(value: str | int | float | None, default: float | int | None, parse, field: str):  # type: ignore[no-untyped-def]
    return default if value is None else requested_units(parse, value, field)


def parse_request_duration(value: str | int | float | None, default: float) -> float:
    return float(_units(value, default, parse_duration, "timeout"))


def parse_request_size(value: str | int | float | None, default: int) -> int:
    return int(_units(value, default, parse_size, "max_output"))


def _check_env(env: dict[str, str]) -> None:
    for key, value in env.items():
        if not is_env_variable(key, value):
            raise RequestError(f"env: {quoted(key)} is not a valid variable ({ENV_RULE})")


def to_job(
    request: Request,
    *,
    cwd: str,
    runtime_paths: Sequence[str],
    hint_style: Literal["api", "cli"] = "api",
    defaults: Defaults = DEFAULTS,
    writable: Iterable[str] = (),
    ceiling: tuple[Sequence[str], Sequence[str]] | None = None,
    uid: int | None = None,
    gid: int | None = None,
    session: bool = False,
) -> tuple[JobSpec, int]:
    """Return the job and its output cap, or raise :class:`RequestError` saying what is wrong.

    ``writable``: where jobs of this pool have been allowed to write (every write grant the pool has
    given). No grant may go through a symlink there, nor beneath this request's own write grants or the
    ceiling's. ``ceiling``: the [pool.limits] roots (readable, writable) the resolved paths must lie
    beneath, judged on the very resolution that is granted."""
    read = _existing(request.allow_read or (), cwd, "allow_read")
    write = _existing(request.allow_write or (), cwd, "allow_write")
    packages = _existing(request.package_dirs or (), cwd, "package_dirs")
    scripts = [resolve(request.script, cwd, "script")] if request.script is not None else []
    if scripts and not os.path.isfile(scripts[0].path):
        raise RequestError(f"script: {request.script} is not a file")
    if ceiling is not None:
        readable, writable_roots = ceiling
        for field, paths in (("allow_read", read), ("package_dirs", packages), ("script", scripts)):
            check_ceiling(field, paths, readable)
        check_ceiling("allow_write", write, writable_roots)
    allow_write = [found.path for found in write]
    for path in allow_write:
        runtime = overlapping(path, runtime_paths)
        if runtime is not None:
            raise RequestError(f"allow_write: {path} overlaps the runtime path {runtime}; a job may never "
                               "write where the interpreter and its packages live")
    _refuse_planted_links({"allow_read": read, "allow_write": write, "package_dirs": packages, "script": scripts},
                          [*allow_write, *(ceiling[1] if ceiling is not None else ()), *writable])
    allow_read, package_dirs = [found.path for found in read], [found.path for found in packages]
    script = scripts[0].path if scripts else None
    granted = len(allow_read) + len(allow_write) + len(package_dirs) + (script is not None)
    if granted > MAX_GRANTS:
        raise RequestError(f"at most {MAX_GRANTS} granted paths per job (allow_read, allow_write, package_dirs "
                           f"and the script), got {granted}")
    args = list(request.args or ())
    if len(args) > _MAX_ARGS or any("\0" in arg for arg in args):
        raise RequestError("args: at most 4096 arguments, none containing NUL")
    env = dict(request.env or {})
    _check_env(env)
    functions = list(request.functions or ())
    for function in functions:
        if not is_function_name(function):
            raise RequestError(f"functions: {quoted(function)} {FUNCTION_RULE}")
    spec = JobSpec(
        code=request.code,
        script=script,
        name=request.name or request.script or defaults.name,
        args=args,
        cwd=cwd,
        env=env,
        # The script itself must be readable, and only it: its directory is not granted.
        allow_read=[*allow_read, *package_dirs, *([script] if script else [])],
        allow_write=allow_write,
        network=bool(request.allow_network),
        timeout=_units(request.timeout, defaults.timeout, parse_duration, "timeout"),
        memory=_units(request.memory, defaults.memory, parse_size, "memory"),
        max_file_size=_units(request.max_file_size, None, parse_size, "max_file_size"),
        package_dirs=package_dirs,
        functions=functions,
        uid=uid,
        gid=gid,
        hint_style=hint_style,
        session=session,
    )
    return spec, _units(request.max_output, defaults.max_output, parse_size, "max_output")
