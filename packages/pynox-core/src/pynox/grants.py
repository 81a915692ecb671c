"""``Grants``: what one job may do, from its request, merged, checked and resolved in one place.

Every way in (a pool's request line, ``pynox run``, a tool made ahead in Python)
turns a request into :class:`Grants` here, in one order:

1. the request's profile is merged under it (lists joined, the request's own
   scalars win);
2. the ``[pool.limits]`` ceiling is enforced on its scalars and the network, and
   fills in the limits it sets no value for;
3. every value is checked: paths, environment names, host-function names,
   units, arguments;
4. every path is resolved against the caller's working directory and through
   every symlink, because Landlock grants the inode a path names:
   ``data/link -> /etc`` grants ``/etc``, and that is what the ceiling is
   checked against and what the result's ``policy`` reports.

A symlink is followed only if no job could have planted it: one that lies
where jobs may write (beneath this request's own write grants, or the
ceiling's, or any grant this pool has given) is refused, since an earlier job
could have put it there to widen this one. The resolved paths are bound to
descriptors when the job starts (:mod:`pynox.policy.grants`), so a link
planted after this check is refused too.

Every refusal is a :class:`RequestError` that names the field and the rule.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import msgspec

from .defaults import DEFAULTS, Defaults
from .errors import ConfigError, RequestError, cut, quoted
from .hosts import HostEntry, one_port_each, parse_hosts, within
from .names import ENV_RULE, FUNCTION_RULE, is_env_variable, is_function_name
from .paths import beneath, kernel_mounts, overlapping
from .protocol import Request
from .requirements import Requirement, check_packages, requirements
from .units import format_duration, format_size, parse_duration, parse_size
from .wire.spec import MAX_GRANTS, MAX_OPEN_FILES, Confinement, JobSpec, NetworkMode, Payload

if TYPE_CHECKING:
    from .config import Config, Limits

_T = TypeVar("_T")

__all__ = [
    "Grants", "Resolved", "bounded", "check_ceiling", "dedupe", "enforce_ceiling", "merged", "network_mode",
    "parse_request_duration", "parse_request_size", "request_hosts", "requested_units", "resolve", "resolve_path",
]

_MAX_ARGS = 4096
_MAX_LINKS = 40  # as the kernel's own limit on symlinks followed in one path
_LIST_FIELDS = ("allow_read", "allow_write", "allow_hosts", "package_dirs", "functions", "packages")
_SCALAR_FIELDS = ("allow_network", "timeout", "memory", "max_output", "max_file_size", "name", "queue_timeout")


@dataclass(frozen=True)
class Grants:
    """A request's permissions and limits, checked and resolved: absolute paths, seconds and bytes."""

    allow_read: tuple[str, ...]  # resolved, existing
    allow_write: tuple[str, ...]
    package_dirs: tuple[str, ...]
    script: str | None  # resolved; readable on its own, its directory is not granted
    network: bool
    hosts: tuple[HostEntry, ...]  # allow_hosts, parsed; moot with the network (which grants all of it)
    env: Mapping[str, str]
    timeout: float  # seconds
    memory: int  # bytes
    max_output: int  # bytes of stdout and of stderr each
    max_file_size: int | None
    functions: tuple[str, ...]
    args: tuple[str, ...]
    # Distributions the pool installs before the job starts (pynox.requirements); the pool adds the
    # environment they are installed in to the job's package_dirs (pynox.server.packages).
    packages: tuple[Requirement, ...] = ()

    @classmethod
    def of(cls, request: Request, *, cwd: str, runtime_paths: Sequence[str] = (), writable: Iterable[str] = (),
           ceiling: tuple[Sequence[str], Sequence[str]] | None = None, defaults: Defaults = DEFAULTS,
           pool_files: Mapping[str, str] | None = None, pool_secrets: Mapping[str, str] | None = None) -> Grants:
        """The grants of a request already :func:`bounded` by its config; raises :class:`RequestError`
        saying what is wrong.

        ``runtime_paths``: where the interpreter and its packages live (no write grant may overlap them).
        ``pool_files``: the pool's own files (its metrics socket), by what they are: no write grant may hold
        one, or a job could remove or replace it. ``pool_secrets``: the pool's files no job may even read (the key
        saved sessions are signed with), by what they are: no grant at all may hold one.
        ``writable``: where jobs of this pool have been allowed to write: no grant may go through a symlink
        there (nor beneath this request's own write grants, nor the ceiling's). ``ceiling``: the
        [pool.limits] roots (readable, writable) the resolved paths must lie beneath, judged on the very
        resolution that is granted."""
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
        allow_write = tuple(found.path for found in write)
        for path in allow_write:
            refuse_write_grant(path, runtime_paths, pool_files)
        for field, paths in (("allow_read", read), ("allow_write", write), ("package_dirs", packages),
                             ("script", scripts)):
            for found in paths:
                for what, secret in (pool_secrets or {}).items():
                    if beneath(secret, found.path):
                        raise RequestError(f"{field}: {found.path} holds the pool's {what} {secret}; a job may "
                                           "never read it")
        _refuse_planted_links({"allow_read": read, "allow_write": write, "package_dirs": packages,
                               "script": scripts},
                              [*allow_write, *(ceiling[1] if ceiling is not None else ()), *writable])
        granted = len(read) + len(write) + len(packages) + len(scripts)
        if granted > MAX_GRANTS:
            raise RequestError(f"at most {MAX_GRANTS} granted paths per job (allow_read, allow_write, "
                               f"package_dirs and the script), got {granted}")
        args = tuple(request.args or ())
        if len(args) > _MAX_ARGS or any("\0" in arg for arg in args):
            raise RequestError("args: at most 4096 arguments, none containing NUL")
        env = dict(request.env or {})
        for key, value in env.items():
            if not is_env_variable(key, value):
                raise RequestError(f"env: {quoted(key)} is not a valid variable ({ENV_RULE})")
        hosts = request_hosts(request.allow_hosts)
        functions = tuple(request.functions or ())
        for function in functions:
            if not is_function_name(function):
                raise RequestError(f"functions: {quoted(function)} {FUNCTION_RULE}")
        return cls(
            allow_read=tuple(found.path for found in read), allow_write=allow_write,
            package_dirs=tuple(found.path for found in packages), script=scripts[0].path if scripts else None,
            network=bool(request.allow_network), hosts=() if request.allow_network else hosts, env=env,
            timeout=_units(request.timeout, defaults.timeout, parse_duration, "timeout"),
            memory=_units(request.memory, defaults.memory, parse_size, "memory"),
            max_output=_units(request.max_output, defaults.max_output, parse_size, "max_output"),
            max_file_size=_units(request.max_file_size, None, parse_size, "max_file_size"),
            functions=functions, args=args, packages=requirements(request.packages),
        )

    def job(self, request: Request, *, cwd: str, hint_style: Literal["api", "cli"] = "api",
            uid: int | None = None, gid: int | None = None, session: bool = False,
            defaults: Defaults = DEFAULTS, files_at_memory: bool) -> JobSpec:
        """The job that runs ``request``'s code with these grants. ``files_at_memory``: no cgroup counts what
        the job writes into a tmpfs, so each file it writes is bounded by its memory when no file size is set
        (the pool knows; see :func:`pynox.server.jobs.to_job`)."""
        functions = list(self.functions)
        network = network_mode(self.network, self.hosts)
        return JobSpec(
            confinement=Confinement(
                cwd=cwd,
                # The script itself must be readable, and only it: its directory is not granted.
                allow_read=[*self.allow_read, *self.package_dirs, *([self.script] if self.script else [])],
                allow_write=list(self.allow_write), network=network, timeout=self.timeout, memory=self.memory,
                max_file_size=self.memory if self.max_file_size is None and files_at_memory else self.max_file_size,
                package_dirs=list(self.package_dirs), host_channel=bool(functions),
                max_open_files=MAX_OPEN_FILES, uid=uid, gid=gid, session=session, hint_style=hint_style),
            payload=Payload(
                code=request.code, script=self.script, name=request.name or request.script or defaults.name,
                args=list(self.args), env=dict(self.env), functions=functions,
                return_value=bool(request.return_value), images=self.max_output, stream=bool(request.stream),
                host_globals=request.host_globals if self.functions else None,
                allow_hosts=one_port_each(self.hosts)),
            packages=[str(requirement) for requirement in self.packages],
        )


def refuse_write_grant(path: str, runtime_paths: Sequence[str], pool_files: Mapping[str, str] | None = None) -> None:
    """RequestError if the write grant ``path`` (resolved) overlaps the runtime or a mount of the kernel's own
    settings, or holds one of the pool's own files (see :meth:`Grants.of`); the pool checks it for every job,
    a tool when it is made."""
    runtime = overlapping(path, runtime_paths)
    if runtime is not None:
        raise RequestError(f"allow_write: {path} overlaps the runtime path {runtime}; a job may never "
                           "write where the interpreter and its packages live")
    kernel = overlapping(path, kernel_mounts())
    if kernel is not None:
        raise RequestError(f"allow_write: {path} overlaps {kernel}, where the kernel keeps its own settings (cgroups, "
                           "/proc, /sys); a job may never write there: its limits would be its own to change")
    for what, pool_file in (pool_files or {}).items():
        if beneath(pool_file, path):
            raise RequestError(f"allow_write: {path} holds the pool's {what} {pool_file}; a job may never "
                               "write where the pool keeps its own files")


def request_hosts(values: Sequence[str] | None) -> tuple[HostEntry, ...]:
    """A request's ``allow_hosts``, parsed; :class:`RequestError` naming the field and the bad entry."""
    try:
        return parse_hosts(values or ())
    except ValueError as exc:
        raise RequestError(f"allow_hosts: {exc}") from None


def network_mode(network: bool, hosts: Sequence[HostEntry]) -> NetworkMode:
    """What a job's sockets may reach: everything, the listed hosts, or nothing."""
    return "all" if network else "hosts" if hosts else "none"


# --- the profile and the ceiling ----------------------------------------------------------------


def bounded(request: Request, config: Config, cwd: str, *, check_paths: bool = True,
            defaults: Defaults = DEFAULTS) -> Request:
    """``request`` with its profile merged under it and the ceiling enforced, still a request: relative
    paths in it are still relative to ``cwd``, and it names no profile.

    Unset limits are filled in from the ceiling, so a later session step (which may carry no grant
    fields) must be checked for its shape first. ``check_paths=False`` leaves the paths to
    :meth:`Grants.of`, which judges them on the very resolution it grants (a tool made ahead checks
    them here, to fail at once)."""
    if request.profile is not None:
        request = merged(config.profile(request.profile), request)
    if config.limits is not None:
        request = enforce_ceiling(config.limits, request, cwd, defaults, check_paths=check_paths)
    return request


def dedupe(items: Iterable[_T]) -> list[_T]:
    seen: list[_T] = []
    for item in items:
        if item not in seen:
            seen.append(item)
    return seen


def merged(base: Request, request: Request) -> Request:
    """``base`` (a profile, or ``[permissions]``) under ``request``: lists are the base's then the
    request's, set scalars of the request win; the result names no profile."""
    changes: dict[str, Any] = {"profile": None}
    for name in _LIST_FIELDS:
        mine, theirs = getattr(request, name), getattr(base, name)
        if theirs is not None:
            changes[name] = dedupe([*theirs, *(mine or ())])
    if base.env is not None:
        changes["env"] = {**base.env, **(request.env or {})}
    for name in _SCALAR_FIELDS:
        if getattr(request, name) is None:
            changes[name] = getattr(base, name)
    return msgspec.structs.replace(request, **changes)


def _show_duration(seconds: float) -> str:
    """format_duration, unless it rounds (``30.0001`` must not read as the ceiling's ``30s``)."""
    text = format_duration(seconds)
    try:
        exact = parse_duration(text) == seconds
    except ConfigError:  # "0ms" for anything under half a millisecond
        exact = False
    return text if exact else f"{seconds!r}s"


def enforce_ceiling(limits: Limits, request: Request, cwd: str, defaults: Defaults = DEFAULTS, *,
                    check_paths: bool = True) -> Request:
    """``request`` under ``limits``: refused if it asks for more, its unset limits filled from them."""
    if check_paths:
        for field, paths, allowed in (("allow_read", request.allow_read, limits.readable),
                                      ("package_dirs", request.package_dirs, limits.readable),
                                      ("script", [request.script] if request.script is not None else None,
                                       limits.readable),
                                      ("allow_write", request.allow_write, limits.allow_write)):
            check_ceiling(field, [resolve(path, cwd, field) for path in paths or ()], allowed)
    if request.packages:
        check_packages(requirements(request.packages), limits.packages)
    if request.allow_network and not limits.allow_network:
        raise RequestError("allow_network: the [pool.limits] ceiling does not allow the network "
                           "(allow_network = false)")
    if request.allow_hosts and not limits.allow_network:
        for entry in request_hosts(request.allow_hosts):
            if not within(entry, limits.allow_hosts):
                ceiling = ", ".join(str(allowed) for allowed in limits.allow_hosts) or "none"
                raise RequestError(f"allow_hosts: {entry} is not within the [pool.limits] ceiling's allow_hosts "
                                   f"(allowed: {ceiling}); a name lies within the same name only")
    changes: dict[str, Any] = {}
    checks: tuple[tuple[str, Callable[[Any, str], Any], Any, Any, Callable[[Any], str]], ...] = (
        ("timeout", parse_duration, limits.timeout, defaults.timeout, _show_duration),
        ("memory", parse_size, limits.memory, defaults.memory, format_size),
        ("max_output", parse_size, limits.max_output, defaults.max_output, format_size),
        # No default: a max_file_size limit applies to every request that sets none.
        ("max_file_size", parse_size, limits.max_file_size, None, format_size),
    )
    for name, parse, limit, default, show in checks:
        value = getattr(request, name)
        if value is not None:
            parsed = requested_units(parse, value, name)
            if limit is not None and parsed > limit:
                raise RequestError(f"{name}: {show(parsed)} exceeds the [pool.limits] ceiling "
                                   f"of {show(limit)}")
        elif limit is not None and (default is None or default > limit):
            changes[name] = limit
    return msgspec.structs.replace(request, **changes) if changes else request


def check_ceiling(field: str, paths: Iterable[Resolved], allowed: Sequence[str]) -> None:
    """Every resolved path must lie beneath one of the ``allowed`` roots (the [pool.limits] ceiling)."""
    for resolved in paths:
        if not any(beneath(resolved.path, parent) for parent in allowed):
            named = resolved.given if resolved.given == resolved.path else \
                f"{resolved.given} (resolves to {resolved.path})"
            raise RequestError(f"{field}: {named} is outside the [pool.limits] ceiling "
                               f"(allowed: {', '.join(allowed) if allowed else 'none'})")


# --- paths --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Resolved:
    """One path as one walk resolved it: where it leads, and every symlink on the way (by its own
    resolved location). The ceiling, the planted-link rule and the grant all use this one walk."""

    given: str
    path: str
    links: tuple[str, ...]


def resolve(path: object, base: str, field: str) -> Resolved:
    """Resolve ``path`` against ``base`` (a leading ``~`` is the home directory) through every symlink, as
    :func:`os.path.realpath` does, in one iterative walk (a chain of links cannot exhaust the stack) that
    records the links it follows.

    Raises :class:`RequestError` for something that is not a path, more than 40 links (a loop), or a
    path that changed while it was walked."""
    if not isinstance(path, str) or not path or "\0" in path:
        raise RequestError(f"{field}: {quoted(path)} is not a path")
    pending = os.path.join(base, os.path.expanduser(path)).split("/")[::-1]
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


# --- units --------------------------------------------------------------------------------------


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
