"""``pynox.toml``: the one home of pool settings, the ``[pool.limits]`` ceiling and ``[profiles.*]`` presets,
and of how a pool's command line is laid over its ``[pool]`` table (:func:`pool_options`).

A file has three kinds of table and nothing else::

    [pool]              defaults for ``pynox pool`` that its command line overrides
    [pool.limits]       a ceiling every request must fit under, checked before anything runs
    [profiles.NAME]     grant presets a request names with ``"profile": "NAME"``

Loading is strict: an unknown table or key, a wrong type or a bad unit is a
:class:`~pynox.errors.ConfigError` naming the file, the table and the key.
Relative paths resolve against the file's directory. The ceiling compares
fully resolved paths (every symlink and ``..`` followed, exactly as the job's
grant will be), component by component, so ``/srv/data2`` is not beneath
``/srv/data`` and ``data/link -> /etc`` is ``/etc``.

What a request may do under a config (its profile, the ceiling, every rule on
its values) is decided in :mod:`pynox.grants`. Apart from reading the file and
resolving paths this module does no I/O.
"""

from __future__ import annotations

import argparse
import os
import re
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, TypeVar

from .defaults import DEFAULT_WORKERS, DEFAULTS, Defaults
from .errors import ConfigError, RequestError, quoted
from .grants import bounded, dedupe, enforce_ceiling, merged, resolve
from .hosts import HostEntry, parse_hosts
from .names import ENV_RULE, FUNCTION_RULE, is_env_variable, is_function_name
from .paths import beneath
from .protocol import Request
from .requirements import Requirement, requirements
from .units import format_size, parse_duration, parse_size

__all__ = [
    "DEFAULT_MAX_QUEUED", "EMPTY", "LANDLOCK_ABI_VARIABLE", "LEAST_MEMORY", "MAX_SESSION_STATE", "Config", "Installs",
    "Limits", "PoolOptions", "PoolSettings", "TenantSettings", "default_config_path", "landlock_abi_cap",
    "landlock_abi_from_environment", "listen_address", "load_config", "merged", "metrics_socket",
    "native_from_environment", "pool_options",
]

_T = TypeVar("_T")

# The request fields a profile may preset: grants and limits, never code, script, name or args.
_PROFILE_KEYS = ("allow_read", "allow_write", "allow_network", "allow_hosts", "env", "timeout", "memory", "max_output",
                "max_file_size", "package_dirs", "functions", "packages", "queue_timeout")
# `pynox run --config FILE` reads its grants from [permissions]; the pool ignores that table.
_PERMISSION_KEYS = ("allow_read", "allow_write", "allow_network", "allow_hosts", "env", "timeout", "memory",
                    "max_output", "max_file_size")
# [pool] keys of the installer (see pynox.server.packages).
_INSTALL_KEYS = ("package_index", "find_links", "packages_dir", "install_timeout", "max_install_size", "max_installs",
                 "allow_sdist", "uv")
_POOL_KEYS = ("workers", "preload", "package_dirs", "max_sessions", "session_idle", "log", "log_redact", "run_as",
              "landlock_abi", "drain_timeout", "metrics_socket", "job_cpu", "prepared_children", "scratch_dir",
              "scratch_max_file", "scratch_max_total", "strict_session_reopen", "interrupt_grace", "queue_timeout",
              "max_queued", "listen", "max_connections", "session_key_file", "max_session_state", "limits",
              *_INSTALL_KEYS)
# [tenants.NAME]: who a listening pool's peer is (by SO_PEERCRED) and what that tenant may have (see server/tenants.py).
_TENANT_KEYS = ("uids", "users", "gids", "groups", "profiles", "max_jobs", "max_sessions", "max_connections", "run_as",
                "memory_budget", "cpu_weight")
# [tenants.NAME] cpu_weight: cgroup v2's cpu.weight range (systemd's CPUWeight=); 100 is a template's own.
_MAX_CPU_WEIGHT = 10_000
_LIMIT_KEYS = ("allow_read", "allow_write", "allow_network", "allow_hosts", "timeout", "memory", "max_output",
               "max_file_size", "packages")
_MAX_ID = (1 << 32) - 2  # (uid_t)-1 means "unchanged" to setresuid, so it is not a usable id
_MAX_WORKERS = 256
# The least memory limit a Python job starts under anywhere: a bare interpreter's heap (about 11 MiB),
# which the job inherits from its template, plus the 16 MiB it needs to run, rounded up. A pool whose
# preloaded modules make its templates heavier raises the floor at start (Config.refuse_memory_below).
LEAST_MEMORY = 32 << 20
# The largest saved session state: it travels as base64 in one protocol line (1 MiB, protocol.MAX_LINE), the
# save's answer and the restore's request; 720 KiB is 960 KiB as base64, which leaves 64 KiB for the line's
# other fields (the skipped names and the save step's stderr, bounded in server/session_state.py).
MAX_SESSION_STATE = 720 << 10


# Jobs that may wait for a worker when [pool] max_queued names no bound: intake stops reading beyond them.
DEFAULT_MAX_QUEUED = 1024
# [pool] max_connections when unset: each connection is two threads, and the pool's unit's tasks are its
# templates' too. About what a shell's soft open-file limit of 1024 allowed before the pool raised it.
DEFAULT_MAX_CONNECTIONS = 1024

@dataclass(frozen=True)
class Installs:
    """How the pool installs the ``packages`` a request names (``[pool]`` keys): from where, into where, within
    which bounds. No index and no find_links: the pool installs nothing, and a request naming packages is
    refused."""

    index: str | None = None  # package_index: a URL, or an absolute path to a directory laid out as an index
    find_links: tuple[str, ...] = ()  # URLs, or absolute paths to directories of wheels (a wheelhouse)
    root: str | None = None  # packages_dir: where the environments and uv's cache live (None: the default)
    timeout: float = 120.0  # seconds one install may take, apart from any job's timeout
    max_size: int = 1 << 30  # bytes one installed environment may hold
    concurrent: int = 2  # installs at once; more wait
    sdist: bool = False  # allow_sdist: build from source distributions (their code runs on the host)
    uv: str | None = None  # uv's binary (None: the uv package's, pynox-core[packages], else one on PATH)

    @property
    def enabled(self) -> bool:
        return self.index is not None or bool(self.find_links)


@dataclass(frozen=True)
class PoolSettings:
    """``[pool]``: defaults for ``pynox pool``; the command line overrides each of them."""

    workers: int | None = None
    preload: tuple[str, ...] = ()
    package_dirs: tuple[str, ...] = ()  # absolute and resolved
    max_sessions: int = 16
    session_idle: float = 600.0  # seconds
    log: str | None = None  # "json" or None
    log_redact: bool = False  # job log lines leave out the error message (it may quote the job's data)
    # After a stop signal, how long accepted jobs may run on before they are stopped (see server/shutdown.py):
    # under the 30 s a Kubernetes pod is given by default, with time left for the escalation.
    drain_timeout: float = 25.0  # seconds
    run_as: tuple[int, int] | None = None  # (uid, gid) every job runs under
    landlock_abi: int | None = None  # the highest Landlock ABI jobs use (see landlock_abi_cap)
    metrics_socket: str | None = None  # absolute: where the pool serves its metrics and health (see metrics_socket)
    # Scratch directories (see pynox.server.scratch): where the pool makes its private root of them (None: the
    # pool's temporary directory), the largest file a client may put in or take out, and what one may hold
    # in all for an upload to be taken.
    scratch_dir: str | None = None
    scratch_max_file: int = 64 << 20
    scratch_max_total: int = 256 << 20
    installs: Installs = field(default_factory=Installs)
    # Refuse a code-only step (no grants, no "open") to a name whose session the pool ended, instead of
    # opening a new session with the defaults as the protocol says (server/ended.py): an operator's opt-in.
    strict_session_reopen: bool = False
    # How long a cancelled session step has, after its KeyboardInterrupt, to end before its process is
    # killed (the session then ends); within it, the session and its variables live on.
    interrupt_grace: float = 1.0  # seconds
    # CPUs' worth of time each job may use at once, all its threads together (a cgroup's CPU quota, see
    # policy/cgroups.py); 0: no quota. One by default: a job's native threads cannot take every core.
    job_cpu: float = 1.0
    # Children each worker's template keeps confined ahead of the next job (see server/prepared.py): a job
    # whose confinement and grants are those of the last one is handed to one of them instead of a fork. Each
    # costs the memory of a confined, idle child (docs/performance.md gives the figure); 0: none.
    prepared_children: int = 2
    # How long a job may wait for a worker before it is refused (a profile's or a request's own wins); None: no
    # deadline. And how many jobs may wait at once before a new one is refused at once (see server/admission.py);
    # None: the operator set no bound, so intake stops reading at DEFAULT_MAX_QUEUED waiting jobs instead (the
    # protocol's backpressure: a client that floods the pool waits, as it always did, rather than being refused).
    # Either way it bounds the pool's memory for waiting requests, at most 1 MiB each.
    queue_timeout: float | None = None  # seconds
    max_queued: int | None = None
    listen: str | None = None  # "unix:/abs/path" or "systemd" (see listen_address)
    # Connections a listening pool serves at once, over every tenant (see server/listen.py: never more than its
    # open-file limit leaves room for, whatever this says).
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    # A saved session's state (see server/session_state.py): the file holding the key its HMAC is made with
    # (None: a key made at random when the pool starts, so states do not outlive the pool), and its largest size.
    session_key_file: str | None = None
    max_session_state: int = MAX_SESSION_STATE


@dataclass(frozen=True)
class TenantSettings:
    """``[tenants.NAME]``: the peers of a listening pool that are this tenant, and its bounds."""

    name: str
    uids: frozenset[int] = frozenset()  # users given by name are resolved to uids when the file is read
    gids: frozenset[int] = frozenset()
    profiles: tuple[str, ...] | None = None  # None: any request; else every job and session names one of these
    max_jobs: int | None = None  # jobs and session steps in flight (queued or running) at once, over its connections
    max_sessions: int | None = None  # sessions open at once, over its connections
    max_connections: int | None = None  # connections open at once to a listening pool
    run_as: tuple[int, int] | None = None  # (uid, gid) its jobs run under, instead of [pool] run_as
    # A cgroup of its own holding its jobs' and sessions' (see policy/cgroups.py TenantGroup): the memory they
    # may hold together, in bytes, and its CPU weight against the pool's other tenants and templates.
    memory_budget: int | None = None
    cpu_weight: int | None = None

    @property
    def has_budget(self) -> bool:
        """Whether its jobs and sessions run under a cgroup of the tenant's own."""
        return self.memory_budget is not None or self.cpu_weight is not None

    def matches(self, uid: int, gid: int) -> bool:
        return uid in self.uids or gid in self.gids


@dataclass(frozen=True)
class Limits:
    """``[pool.limits]``: a ceiling. A missing path list allows no paths of that kind (fail closed)."""

    allow_read: tuple[str, ...] = ()  # resolved, existing paths
    allow_write: tuple[str, ...] = ()
    allow_network: bool = False
    # The hosts requests may list in allow_hosts (see pynox.hosts.within); none without allow_network.
    allow_hosts: tuple[HostEntry, ...] = ()
    timeout: float | None = None  # seconds
    memory: int | None = None  # bytes
    max_output: int | None = None
    max_file_size: int | None = None
    # The packages requests may name, each with the versions it may have (pynox.requirements); none if unset.
    packages: tuple[Requirement, ...] = ()

    @property
    def readable(self) -> list[str]:
        """Where a request may read: what the ceiling lets it read or write."""
        return dedupe([*self.allow_read, *self.allow_write])


@dataclass(frozen=True)
class Config:
    """A loaded ``pynox.toml`` (or :data:`EMPTY`): settings, the ceiling and the profiles."""

    path: str | None
    pool: PoolSettings = field(default_factory=PoolSettings)
    limits: Limits | None = None  # None: no [pool.limits] table, so no ceiling
    profiles: Mapping[str, Request] = field(default_factory=lambda: MappingProxyType({}))
    # What the operator should know but that does not stop the pool: each is one line on its stderr.
    warnings: tuple[str, ...] = ()
    # [permissions]: the grants of `pynox run --config FILE`, under its flags; no meaning for the pool.
    permissions: Request | None = None
    # [tenants.NAME], in the file's order: the first that matches a peer is its tenant.
    tenants: tuple[TenantSettings, ...] = ()
    # [profiles.NAME] run_as: the (uid, gid) the jobs and sessions that name the profile run under, over [pool]
    # run_as (a tenant's own run_as is over both). Not a request field: no request can choose its user.
    profile_run_as: Mapping[str, tuple[int, int]] = field(default_factory=lambda: MappingProxyType({}))

    def run_as(self, profile: str | None, tenant: tuple[int, int] | None = None) -> tuple[int, int] | None:
        """Whom a job runs as: its tenant's run_as, else its profile's, else [pool] run_as (None: the pool's)."""
        return tenant or (self.profile_run_as.get(profile) if profile is not None else None) or self.pool.run_as

    def runs_as_others(self) -> bool:
        """Whether some job may run as a user other than the pool's own (a run_as anywhere in the file)."""
        return bool(self.pool.run_as or self.profile_run_as or any(t.run_as for t in self.tenants))

    def apply(self, request: Request, cwd: str, *, defaults: Defaults = DEFAULTS, check_paths: bool = True) -> Request:
        """The request with its profile merged under it and the ceiling enforced: :func:`pynox.grants.bounded`."""
        return bounded(request, self, cwd, check_paths=check_paths, defaults=defaults)

    @property
    def ceiling(self) -> tuple[list[str], list[str]] | None:
        """The [pool.limits] roots a request's resolved paths must lie beneath: (readable, writable)."""
        return (self.limits.readable, list(self.limits.allow_write)) if self.limits is not None else None

    @property
    def longest_timeout(self) -> float:
        """The longest timeout, in seconds, a request that names none may get: the default, a profile's, the
        ceiling's. The ready event carries it, so that a client knows how long to wait without reading this file."""
        longest = DEFAULTS.timeout
        for profile in self.profiles.values():
            if profile.timeout is not None:
                longest = max(longest, parse_duration(profile.timeout))
        if self.limits is not None and self.limits.timeout is not None:
            longest = max(longest, self.limits.timeout)
        return longest

    def refuse_memory_below(self, floor: int, why: str) -> None:
        """Raise ConfigError, naming the file, table and key, for a memory limit of the ceiling or of a profile
        below ``floor`` (what a job of the started pool needs, ``why``): every job under it would fail."""
        if self.path is None:
            return
        tables = [("pool.limits", self.limits.memory if self.limits else None)]
        tables += [(f"profiles.{name}", _size_or_none(profile.memory)) for name, profile in self.profiles.items()]
        for table, memory in tables:
            if memory is not None and memory < floor:
                raise ConfigError(f"{self.path}: [{table}] memory: {format_size(memory)} is below the "
                                  f"{floor / (1 << 20):.1f} MiB {why}; every job under it would fail with "
                                  "SandboxSetupError")

    def profile(self, name: str) -> Request:
        """The profile called ``name``; RequestError (the request named it) if there is none."""
        try:
            return self.profiles[name]
        except KeyError:
            known = ", ".join(sorted(self.profiles)) if self.profiles else "none are configured"
            where = f" in {self.path}" if self.path else ""
            raise RequestError(f"profile: unknown profile {quoted(name)}{where} (known: {known})") from None


EMPTY = Config(path=None)


def default_config_path() -> str | None:
    """``$PYNOX_CONFIG``, else ``pynox.toml`` in the working directory if there is one."""
    path = os.environ.get("PYNOX_CONFIG")
    if path:
        return os.path.abspath(path)
    return os.path.abspath("pynox.toml") if os.path.isfile("pynox.toml") else None


# --- loading ---------------------------------------------------------------------------------------


class _Table:
    """One TOML table being read, with errors that name the file, the table and the key."""

    def __init__(self, file: str, name: str, raw: Any) -> None:
        self.file, self.name = file, name
        if not isinstance(raw, dict):
            raise self.error(f"must be a table, got {_type_name(raw)}")
        self.raw: dict[str, Any] = raw

    def error(self, message: str, key: str | None = None) -> ConfigError:
        where = f"[{self.name}] {key}" if key else f"[{self.name}]"
        return ConfigError(f"{self.file}: {where}: {message}")

    def refuse_unknown(self, known: Sequence[str]) -> None:
        unknown = sorted(set(self.raw) - set(known))
        if unknown:
            raise self.error(f"unknown key {', '.join(map(repr, unknown))} (known keys: {', '.join(known)})")

    def get(self, key: str, kind: type[_T] | tuple[type, ...], what: str) -> _T | None:
        value = self.raw.get(key)
        kinds = kind if isinstance(kind, tuple) else (kind,)
        # bool is an int in Python, never in TOML.
        wrong = not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds)
        if value is not None and wrong:
            raise self.error(f"expected {what}, got {_type_name(value)} {value!r}", key)
        return value

    def strings(self, key: str) -> list[str] | None:
        value = self.get(key, list, "a list of strings")
        if value is not None:
            for item in value:
                if not isinstance(item, str) or not item or "\0" in item:
                    raise self.error(f"expected a list of non-empty strings, got {item!r} in it", key)
        return value

    def positive_int(self, key: str) -> int | None:
        value = self.get(key, int, "a positive integer")
        if value is not None and value <= 0:
            raise self.error(f"must be a positive integer, got {value}", key)
        return value

    def units(self, key: str, parse: Callable[[Any, str], _T]) -> _T | None:
        value = self.raw.get(key)
        if value is None:
            return None
        try:
            return parse(value, key)
        except ConfigError as exc:
            raise self.error(str(exc).removeprefix(f"{key}: "), key) from None

    def paths(self, key: str, base: str, *, must_exist: bool, one: bool = False) -> list[str] | None:
        """A list of paths (``one``: a single path, as a list of one), resolved against ``base``."""
        if one:
            single = self.get(key, str, "a path")
            values = None if single is None else [single]
            if single is not None and (not single or "\0" in single):
                raise self.error("expected a path, got an empty string or one with NUL", key)
        else:
            values = self.strings(key)
        if values is None:
            return None
        resolved: list[str] = []
        for value in values:
            try:
                real = resolve(value, base, key).path
            except RequestError as exc:
                raise self.error(str(exc).removeprefix(f"{key}: "), key) from None
            if must_exist and not os.path.exists(real):
                raise self.error(f"{value} does not exist (resolved to {real})", key)
            resolved.append(real)
        return dedupe(resolved)


def _size_or_none(value: object) -> int | None:
    return parse_size(value) if isinstance(value, str | int | float) else None


def _memory(table: _Table) -> int | None:
    """A memory limit no job could start under is refused here, not by every job's SandboxSetupError."""
    memory = table.units("memory", parse_size)
    if memory is not None and memory < LEAST_MEMORY:
        raise table.error(f"{format_size(memory)} is below the {format_size(LEAST_MEMORY)} a Python job needs to "
                          "start; every job under it would fail with SandboxSetupError", "memory")
    return memory


def _type_name(value: object) -> str:
    return {dict: "a table", list: "an array", str: "a string", bool: "a boolean", int: "an integer",
            float: "a float"}.get(type(value), type(value).__name__)


def load_config(path: str | os.PathLike[str]) -> Config:
    """Read and check a ``pynox.toml``. Raises :class:`~pynox.errors.ConfigError` naming file and key.

    Relative paths in the file resolve against the directory the file is named
    in (a symlinked config resolves against the link's directory, where the
    operator sees it). Every profile must fit under ``[pool.limits]``, and the
    file may not lie beneath any write grant of its own.
    """
    file = os.path.abspath(os.fspath(path))
    try:
        with open(file, "rb") as handle:
            raw = tomllib.load(handle)
    except OSError as exc:
        raise ConfigError(f"{file}: cannot read the config file: {exc.strerror or exc}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{file}: not valid TOML: {exc}") from None
    base = os.path.dirname(file)

    warnings: list[str] = []
    permissions = None
    for table in sorted(set(raw) - {"pool", "profiles", "tenants"}):
        if table == "permissions":
            permissions = _profile(_Table(file, "permissions", raw["permissions"]), base, _PERMISSION_KEYS)
            warnings.append(f"{file}: [permissions] is the command line's table and does not apply to the pool; "
                            "it is ignored here (use [pool.limits] for a ceiling and [profiles.NAME] for grants)")
            continue
        raise ConfigError(f"{file}: unknown table or key {table!r} (known tables: [pool], [pool.limits], "
                          "[profiles.NAME], [tenants.NAME])")

    pool_table = _Table(file, "pool", raw.get("pool", {}))
    pool_table.refuse_unknown(_POOL_KEYS)
    pool = _pool_settings(pool_table, base)
    limits = None
    if "limits" in pool_table.raw:
        limits = _limits(_Table(file, "pool.limits", pool_table.raw["limits"]), base)

    profiles: dict[str, Request] = {}
    profiles_raw = raw.get("profiles", {})
    if not isinstance(profiles_raw, dict):
        raise ConfigError(f"{file}: profiles must be tables [profiles.NAME], got {_type_name(profiles_raw)}")
    profile_run_as: dict[str, tuple[int, int]] = {}
    for name, body in profiles_raw.items():
        profile_table = _Table(file, f"profiles.{name}", body)
        profile = _profile(profile_table, base, (*_PROFILE_KEYS, "run_as"))
        run_as = _run_as(profile_table)
        if run_as is not None:
            profile_run_as[name] = run_as
        if limits is not None:
            try:
                enforce_ceiling(limits, profile, base)
            except RequestError as exc:
                # The ceiling applies to each request: the profile stays, and every request that names it
                # is refused with this same reason. The operator hears of it when the pool starts.
                warnings.append(f"{file}: [profiles.{name}] does not fit under [pool.limits], so every request "
                                f"naming it is refused: {exc}")
        profiles[name] = profile

    _refuse_self_writable(file, limits, profiles)
    tenants_raw = raw.get("tenants", {})
    if not isinstance(tenants_raw, dict):
        raise ConfigError(f"{file}: tenants must be tables [tenants.NAME], got {_type_name(tenants_raw)}")
    tenants = tuple(_tenant(_Table(file, f"tenants.{name}", body), name, profiles, limits)
                    for name, body in tenants_raw.items())
    _refuse_readable_key(file, pool.session_key_file, limits, profiles)
    return Config(path=file, pool=pool, limits=limits, profiles=MappingProxyType(profiles),
                  warnings=tuple(warnings), permissions=permissions, tenants=tenants,
                  profile_run_as=MappingProxyType(profile_run_as))


def _pool_settings(table: _Table, base: str) -> PoolSettings:
    preload = table.strings("preload") or []
    for module in preload:
        if not all(part.isidentifier() for part in module.split(".")):
            raise table.error(f"{module!r} is not a module name", "preload")
    log = table.get("log", str, 'the string "json"')
    if log is not None and log != "json":
        raise table.error(f'the only log format is "json", got {log!r}', "log")
    idle = table.units("session_idle", parse_duration)
    drain = table.units("drain_timeout", parse_duration)
    redact = table.get("log_redact", bool, "true or false")
    strict = table.get("strict_session_reopen", bool, "true or false")
    grace = table.units("interrupt_grace", parse_duration)
    max_sessions = table.positive_int("max_sessions")
    max_queued = table.positive_int("max_queued")
    max_connections = table.positive_int("max_connections")
    workers = table.positive_int("workers")
    if workers is not None and workers > _MAX_WORKERS:
        raise table.error(f"must be between 1 and {_MAX_WORKERS}, got {workers}", "workers")
    return PoolSettings(
        workers=workers,
        preload=tuple(dedupe(preload)),
        package_dirs=tuple(table.paths("package_dirs", base, must_exist=True) or ()),
        max_sessions=PoolSettings.max_sessions if max_sessions is None else max_sessions,
        session_idle=PoolSettings.session_idle if idle is None else idle,
        log=log,
        log_redact=bool(redact),
        drain_timeout=PoolSettings.drain_timeout if drain is None else drain,
        run_as=_run_as(table),
        landlock_abi=_landlock_abi(table),
        metrics_socket=_metrics_socket(table, base),
        scratch_dir=_first(table.paths("scratch_dir", base, must_exist=True, one=True)),
        scratch_max_file=_or(table.units("scratch_max_file", parse_size), PoolSettings.scratch_max_file),
        scratch_max_total=_or(table.units("scratch_max_total", parse_size), PoolSettings.scratch_max_total),
        installs=_installs(table, base),
        strict_session_reopen=bool(strict),
        interrupt_grace=PoolSettings.interrupt_grace if grace is None else grace,
        job_cpu=_job_cpu(table),
        prepared_children=_prepared_children(table),
        queue_timeout=table.units("queue_timeout", parse_duration),
        max_queued=max_queued,
        listen=_listen(table, base),
        max_connections=PoolSettings.max_connections if max_connections is None else max_connections,
        session_key_file=_first(table.paths("session_key_file", base, must_exist=True, one=True)),
        max_session_state=_max_session_state(table),
    )


def _max_session_state(table: _Table) -> int:
    size = table.units("max_session_state", parse_size)
    if size is None:
        return MAX_SESSION_STATE
    if not 1 <= size <= MAX_SESSION_STATE:
        raise table.error(f"must be between 1 byte and {format_size(MAX_SESSION_STATE)} (a state travels in one "
                          f"protocol line), got {format_size(size)}", "max_session_state")
    return size


def _or(value: _T | None, default: _T) -> _T:
    return default if value is None else value


def _first(values: list[str] | None) -> str | None:
    return values[0] if values else None


def _location(value: str, base: str) -> str:
    """An index or find-links entry: a URL as it is, anything else a path against the file's directory."""
    return value if re.match(r"^[a-z][a-z0-9+.-]*://", value) else os.path.normpath(os.path.join(base, value))


def _installs(table: _Table, base: str) -> Installs:
    index = table.get("package_index", str, "a URL or a path")
    timeout = table.units("install_timeout", parse_duration)
    size = table.units("max_install_size", parse_size)
    concurrent = table.positive_int("max_installs")
    root = table.get("packages_dir", str, "a path")
    return Installs(
        index=_location(index, base) if index else None,
        find_links=tuple(_location(link, base) for link in table.strings("find_links") or ()),
        root=os.path.normpath(os.path.join(base, root)) if root else None,
        timeout=Installs.timeout if timeout is None else timeout,
        max_size=Installs.max_size if size is None else size,
        concurrent=Installs.concurrent if concurrent is None else concurrent,
        sdist=bool(table.get("allow_sdist", bool, "true or false")),
        uv=os.path.normpath(os.path.join(base, uv)) if (uv := table.get("uv", str, "a path")) else None,
    )


def _packages(table: _Table) -> tuple[Requirement, ...] | None:
    values = table.get("packages", list, "a list of strings")
    if values is None:
        return None
    try:
        return requirements(values)
    except RequestError as exc:
        raise table.error(str(exc).removeprefix("packages: "), "packages") from None


_MAX_JOB_CPU = 1024.0


def _job_cpu(table: _Table) -> float:
    value = table.get("job_cpu", (int, float), "a number of CPUs")
    if value is None:
        return PoolSettings.job_cpu
    if isinstance(value, bool) or not (value == 0 or 0.01 <= value <= _MAX_JOB_CPU):
        raise table.error(f"must be 0 (no quota) or between 0.01 and {_MAX_JOB_CPU:g} CPUs, got {value!r}", "job_cpu")
    return float(value)


# Each waiting child is a process that holds memory and takes a pid from its worker's job budget (see
# policy/cgroups.py): a few hide a fork's cost behind back-to-back jobs, and more buy nothing.
_MAX_PREPARED_CHILDREN = 8


def _prepared_children(table: _Table) -> int:
    value = table.get("prepared_children", int, "a whole number")
    if value is None:
        return PoolSettings.prepared_children
    if not 0 <= value <= _MAX_PREPARED_CHILDREN:
        raise table.error(f"must be between 0 (none) and {_MAX_PREPARED_CHILDREN}, got {value!r}",
                          "prepared_children")
    return value


def listen_address(value: str, base: str) -> str:
    """``unix:PATH`` (PATH made absolute against ``base``, its directory existing) or ``systemd`` (the socket
    systemd's socket activation hands over, LISTEN_FDS). ConfigError with the reason, for the caller to place."""
    if value == "systemd":
        return value
    if not value.startswith("unix:"):
        raise ConfigError(f'expected "unix:PATH" or "systemd", got {value!r}')
    return "unix:" + metrics_socket(value.removeprefix("unix:"), base)


def _listen(table: _Table, base: str) -> str | None:
    value = table.get("listen", str, '"unix:PATH" or "systemd"')
    if value is None:
        return None
    try:
        return listen_address(value, base)
    except ConfigError as exc:
        raise table.error(str(exc), "listen") from None


def _tenant(table: _Table, name: str, profiles: Mapping[str, Request], limits: Limits | None) -> TenantSettings:
    table.refuse_unknown(_TENANT_KEYS)
    import grp  # only for a file with tenants: names are resolved once, here
    import pwd

    def ids(key: str, lookup: Callable[[str], int]) -> set[int]:
        found: set[int] = set()
        for entry in table.get(key, list, "a list") or ():
            if isinstance(entry, int) and not isinstance(entry, bool) and 0 <= entry <= _MAX_ID:
                found.add(entry)
            elif isinstance(entry, str) and entry:
                try:
                    found.add(lookup(entry))
                except KeyError:
                    raise table.error(f"no such {key[:-1]} {entry!r} on this host", key) from None
            else:
                raise table.error(f"expected ids or names, got {entry!r}", key)
        return found

    uids = ids("uids", lambda n: pwd.getpwnam(n).pw_uid) | ids("users", lambda n: pwd.getpwnam(n).pw_uid)
    gids = ids("gids", lambda n: grp.getgrnam(n).gr_gid) | ids("groups", lambda n: grp.getgrnam(n).gr_gid)
    if not uids and not gids:
        raise table.error("names no peer: give uids, users, gids or groups")
    allowed = table.strings("profiles")
    for profile in allowed or ():
        if profile not in profiles:
            raise table.error(f"no profile {profile!r} in this file (known: {', '.join(sorted(profiles)) or 'none'})",
                              "profiles")
    return TenantSettings(name=name, uids=frozenset(uids), gids=frozenset(gids),
                          profiles=tuple(allowed) if allowed is not None else None,
                          max_jobs=table.positive_int("max_jobs"), max_sessions=table.positive_int("max_sessions"),
                          max_connections=table.positive_int("max_connections"),
                          run_as=_run_as(table), memory_budget=_memory_budget(table, allowed, profiles, limits),
                          cpu_weight=_cpu_weight(table))


def _memory_budget(table: _Table, allowed: list[str] | None, profiles: Mapping[str, Request],
                   limits: Limits | None) -> int | None:
    """What a tenant's jobs and sessions may hold together. Never below what one of its jobs may take under the
    operator's own settings (the ceiling's memory; without one, the default's and each profile's): a single job
    would meet the tenant's budget before its own limit, and be killed instead of raising MemoryError."""
    budget = table.units("memory_budget", parse_size)
    if budget is None:
        return None
    if budget < LEAST_MEMORY:
        raise table.error(f"{format_size(budget)} is below the {format_size(LEAST_MEMORY)} one Python job needs to "
                          "start", "memory_budget")
    if limits is not None and limits.memory is not None:  # a request may ask up to it, whatever its profile
        one = [("[pool.limits] memory", limits.memory)]
    else:
        one = [("the default memory", DEFAULTS.memory)]
        one += [(f"[profiles.{name}] memory", memory) for name in (allowed if allowed is not None else profiles)
                if (memory := _size_or_none(profiles[name].memory)) is not None]
    where, largest = max(one, key=lambda pair: pair[1])
    if budget < largest:
        raise table.error(f"{format_size(budget)} is below the {format_size(largest)} one of its jobs may take "
                          f"({where}): a single job would reach the tenant's budget before its own limit; raise "
                          "the budget or lower that memory", "memory_budget")
    return budget


def _cpu_weight(table: _Table) -> int | None:
    value = table.get("cpu_weight", int, f"a weight from 1 to {_MAX_CPU_WEIGHT}")
    if value is not None and not 1 <= value <= _MAX_CPU_WEIGHT:
        raise table.error(f"must be from 1 to {_MAX_CPU_WEIGHT} (100: the share of one template's jobs), got "
                          f"{value}", "cpu_weight")
    return value


# A unix socket's path must fit in sockaddr_un's sun_path (108 bytes, with its NUL).
_MAX_SOCKET_PATH = 107


def metrics_socket(value: str, base: str) -> str:
    """The absolute path of the metrics socket ``value`` names, relative to ``base``; its directory must exist
    (resolved, as the pool will bind there). Raises ConfigError with the reason, for the caller to place."""
    if not value or "\0" in value:
        raise ConfigError("expected a path, got an empty string or one with NUL")
    path = os.path.join(os.path.realpath(os.path.dirname(os.path.join(base, value))), os.path.basename(value))
    if not os.path.basename(value):
        raise ConfigError(f"{value} names a directory; give the path of the socket file to create")
    if not os.path.isdir(os.path.dirname(path)):
        raise ConfigError(f"the directory of {value} does not exist (resolved to {os.path.dirname(path)})")
    if len(os.fsencode(path)) > _MAX_SOCKET_PATH:
        raise ConfigError(f"{path} is longer than the {_MAX_SOCKET_PATH} bytes a unix socket's path may have")
    return path


def _metrics_socket(table: _Table, base: str) -> str | None:
    value = table.get("metrics_socket", str, "a path")
    if value is None:
        return None
    try:
        return metrics_socket(value, base)
    except ConfigError as exc:
        raise table.error(str(exc), "metrics_socket") from None


# The highest Landlock ABI a pool uses, whatever the kernel offers: a fleet of mixed kernels behaves as
# its oldest node does, and CI proves every rule as it holds on an older kernel (the kernel enforces
# exactly the rights a ruleset handles, so a ruleset of ABI N behaves as on a kernel of ABI N). The pool's
# command line wins over [pool] landlock_abi, which wins over this variable.
LANDLOCK_ABI_VARIABLE = "PYNOX_LANDLOCK_ABI"
_HIGHEST_KNOWN_ABI = 7


def _abi_problem(value: object) -> str | None:
    text = str(value).strip()
    if isinstance(value, bool) or not (isinstance(value, int) or (text.isascii() and text.isdigit())):
        return f"must be a Landlock ABI number (1 to {_HIGHEST_KNOWN_ABI}), got {value!r}"
    if int(text) < 1:
        return f"must be at least 1: Pynox never runs a job without Landlock, got {int(text)}"
    return None


def landlock_abi_cap(value: object, where: str) -> int:
    """A Landlock ABI cap, checked: an integer from 1 (the oldest Landlock) up; ``where`` names its source."""
    problem = _abi_problem(value)
    if problem is not None:
        raise ConfigError(f"{where} {problem}")
    return int(str(value).strip())


def landlock_abi_from_environment() -> int | None:
    """``$PYNOX_LANDLOCK_ABI``, checked; None when unset or empty."""
    value = os.environ.get(LANDLOCK_ABI_VARIABLE, "").strip()
    return landlock_abi_cap(value, f"${LANDLOCK_ABI_VARIABLE}") if value else None


# How a child confines itself (policy/native.py): unset or empty, in one native call when the extension
# loads, else through the Python steps; "0", through the Python steps (the fallback, which CI runs one matrix
# leg on); "1", natively or the pool does not start (CI's other legs, so a broken build cannot pass on the
# fallback).
NATIVE_VARIABLE = "PYNOX_NATIVE"


def native_from_environment() -> bool | None:
    """``$PYNOX_NATIVE``, checked: True, False, or None when unset or empty."""
    value = os.environ.get(NATIVE_VARIABLE, "").strip()
    if not value:
        return None
    if value not in ("0", "1"):
        raise ConfigError(f"${NATIVE_VARIABLE} must be 0 (the Python steps) or 1 (the native call), got {value!r}")
    return value == "1"


def _landlock_abi(table: _Table) -> int | None:
    value = table.get("landlock_abi", int, "a Landlock ABI number")
    if value is None:
        return None
    problem = _abi_problem(value)
    if problem is not None:
        raise table.error(problem, "landlock_abi")
    return value


def _run_as(table: _Table) -> tuple[int, int] | None:
    """``"uid:gid"``, ``"uid"``, an integer uid, ``"user"`` or ``"user:group"``; a lone user is also the group
    (a name: its primary group). Names are looked up when the file is read. Never root."""
    value = table.get("run_as", (str, int), 'a "uid:gid", "uid", "user" or "user:group"')
    if value is None:
        return None
    import grp  # only for a file that names a user: looked up once, here
    import pwd

    if isinstance(value, int) and value < 0:
        raise table.error(f"{value!r}: a numeric uid is 1 to {_MAX_ID}", "run_as")
    parts = str(value).split(":")
    if len(parts) > 2 or not all(parts):
        raise table.error(f'expected a "uid:gid", "uid", "user" or "user:group", got {value!r}', "run_as")
    try:
        if parts[0].isascii() and parts[0].isdigit():
            uid, gid = int(parts[0]), int(parts[0])
        else:
            entry = pwd.getpwnam(parts[0])
            uid, gid = entry.pw_uid, entry.pw_gid
        if len(parts) == 2:
            gid = int(parts[1]) if parts[1].isascii() and parts[1].isdigit() else grp.getgrnam(parts[1]).gr_gid
    except KeyError as exc:
        raise table.error(f"{value!r}: no such user or group on this host ({exc.args[0]})", "run_as") from None
    if not (0 < uid <= _MAX_ID and 0 < gid <= _MAX_ID):
        raise table.error(f"{value!r}: jobs must run as an unprivileged user and group (not 0, at most "
                          f"{_MAX_ID})", "run_as")
    return uid, gid


def _limits(table: _Table, base: str) -> Limits:
    table.refuse_unknown(_LIMIT_KEYS)
    network = table.get("allow_network", bool, "true or false")
    return Limits(
        allow_read=tuple(table.paths("allow_read", base, must_exist=True) or ()),
        allow_write=tuple(table.paths("allow_write", base, must_exist=True) or ()),
        allow_network=bool(network),
        allow_hosts=_hosts(table) or (),
        timeout=table.units("timeout", parse_duration),
        memory=_memory(table),
        max_output=table.units("max_output", parse_size),
        max_file_size=table.units("max_file_size", parse_size),
        packages=_packages(table) or (),
    )


def _hosts(table: _Table) -> tuple[HostEntry, ...] | None:
    values = table.strings("allow_hosts")
    if values is None:
        return None
    try:
        return parse_hosts(values)
    except ValueError as exc:
        raise table.error(str(exc), "allow_hosts") from None


def _profile(table: _Table, base: str, keys: Sequence[str] = _PROFILE_KEYS) -> Request:
    table.refuse_unknown(keys)
    env = table.get("env", dict, "a table of strings")
    if env is not None:
        for key, value in env.items():
            if not is_env_variable(key, value):
                raise table.error(f"{key!r} = {value!r}: {ENV_RULE}", "env")
    functions = table.strings("functions")
    for function in functions or ():
        if not is_function_name(function):
            raise table.error(f"{function!r} {FUNCTION_RULE}", "functions")
    return Request(
        allow_read=table.paths("allow_read", base, must_exist=False),
        allow_write=table.paths("allow_write", base, must_exist=False),
        package_dirs=table.paths("package_dirs", base, must_exist=False),
        allow_network=table.get("allow_network", bool, "true or false"),
        allow_hosts=[str(entry) for entry in hosts] if (hosts := _hosts(table)) is not None else None,
        env=dict(env) if env is not None else None,
        functions=dedupe(functions) if functions is not None else None,
        packages=[str(r) for r in packages] if (packages := _packages(table)) is not None else None,
        timeout=table.units("timeout", parse_duration),
        memory=_memory(table),
        max_output=table.units("max_output", parse_size),
        max_file_size=table.units("max_file_size", parse_size),
        queue_timeout=table.units("queue_timeout", parse_duration) if "queue_timeout" in keys else None,
    )


def _refuse_self_writable(file: str, limits: Limits | None, profiles: Mapping[str, Request]) -> None:
    """A job that could write the config file could rewrite its own ceiling on the next start."""
    # Both where the file is named (a writable directory could swap a symlink) and where it really is.
    names = dedupe([os.path.join(os.path.realpath(os.path.dirname(file)), os.path.basename(file)),
                     os.path.realpath(file)])
    grants = [("[pool.limits] allow_write", path) for path in (limits.allow_write if limits else ())]
    grants += [(f"[profiles.{name}] allow_write", path)
               for name, profile in profiles.items() for path in profile.allow_write or ()]
    for where, grant in grants:
        for name in names:
            if beneath(name, grant):
                raise ConfigError(f"{file}: {where}: {grant} contains this config file ({name}); a job could "
                                  "rewrite its own ceiling, so keep the file outside every write grant")


def _refuse_readable_key(file: str, key: str | None, limits: Limits | None, profiles: Mapping[str, Request]) -> None:
    """A job that could read the key of saved session states could sign a state of its own making."""
    if key is None:
        return
    grants = [("[pool.limits] allow_read", path) for path in (limits.readable if limits else ())]
    grants += [(f"[profiles.{name}] allow_read", path) for name, profile in profiles.items()
               for path in [*(profile.allow_read or ()), *(profile.allow_write or ())]]
    for where, grant in grants:
        if beneath(key, grant):
            raise ConfigError(f"{file}: {where}: {grant} contains the session_key_file ({key}); a job could read "
                              "the key and sign a state of its own, so keep the key outside every grant")


# --- the pool's options ----------------------------------------------------------------------------


@dataclass(frozen=True)
class PoolOptions:
    """What one ``pynox pool`` runs with: its command line laid over the config's ``[pool]`` table."""

    workers: int
    preload: list[str]
    package_dirs: list[str]
    config: Config
    log: str | None
    max_sessions: int
    session_idle: float
    landlock_abi: int | None = None  # see landlock_abi_cap
    drain_timeout: float = PoolSettings.drain_timeout
    log_redact: bool = False
    metrics_socket: str | None = None  # see metrics_socket
    scratch_dir: str | None = PoolSettings.scratch_dir
    scratch_max_file: int = PoolSettings.scratch_max_file
    scratch_max_total: int = PoolSettings.scratch_max_total
    strict_session_reopen: bool = PoolSettings.strict_session_reopen
    interrupt_grace: float = PoolSettings.interrupt_grace  # seconds
    job_cpu: float = PoolSettings.job_cpu  # see PoolSettings.job_cpu
    prepared_children: int = PoolSettings.prepared_children  # see PoolSettings.prepared_children
    queue_timeout: float | None = None  # [pool] queue_timeout (see PoolSettings)
    max_queued: int | None = PoolSettings.max_queued
    listen: str | None = None  # --listen, else [pool] listen: serve connections there instead of stdin/stdout
    max_connections: int = PoolSettings.max_connections
    session_key_file: str | None = PoolSettings.session_key_file  # see PoolSettings.session_key_file
    max_session_state: int = PoolSettings.max_session_state


def pool_options(args: argparse.Namespace) -> PoolOptions:
    """Merge the command line over ``[pool]`` of the config file (the command line wins)."""
    config = load_config(args.config) if args.config else EMPTY
    settings = config.pool
    workers = args.workers if args.workers is not None else (settings.workers or DEFAULT_WORKERS)
    if not 1 <= workers <= _MAX_WORKERS:
        raise ConfigError(f"--workers must be between 1 and {_MAX_WORKERS}, got {workers}")
    if args.max_sessions is not None and args.max_sessions < 1:
        raise ConfigError(f"--max-sessions must be at least 1, got {args.max_sessions}")
    preload = [m.strip() for m in args.preload.split(",") if m.strip()] if args.preload else list(settings.preload)
    cli_dirs = [os.path.realpath(d) for d in (args.package_dirs or [])]
    for directory in cli_dirs:
        if not os.path.isdir(directory):
            raise ConfigError(f"--package-dir {directory} is not a directory")
    return PoolOptions(
        workers=workers,
        preload=preload,
        package_dirs=cli_dirs or list(settings.package_dirs),
        config=config,
        log=args.log if args.log is not None else settings.log,
        max_sessions=args.max_sessions if args.max_sessions is not None else settings.max_sessions,
        session_idle=(parse_duration(args.session_idle, "--session-idle") if args.session_idle
                      else settings.session_idle),
        landlock_abi=(landlock_abi_cap(args.landlock_abi, "--landlock-abi") if args.landlock_abi is not None
                      else settings.landlock_abi if settings.landlock_abi is not None
                      else landlock_abi_from_environment()),
        drain_timeout=(parse_duration(args.drain_timeout, "--drain-timeout") if args.drain_timeout
                       else settings.drain_timeout),
        log_redact=bool(args.log_redact) or settings.log_redact,
        metrics_socket=_metrics_socket_option(args, settings),
        scratch_dir=settings.scratch_dir,
        scratch_max_file=settings.scratch_max_file,
        scratch_max_total=settings.scratch_max_total,
        strict_session_reopen=bool(args.strict_session_reopen) or settings.strict_session_reopen,
        interrupt_grace=(parse_duration(args.interrupt_grace, "--interrupt-grace") if args.interrupt_grace
                         else settings.interrupt_grace),
        job_cpu=settings.job_cpu,
        prepared_children=settings.prepared_children,
        queue_timeout=settings.queue_timeout,
        max_queued=settings.max_queued,
        listen=_listen_option(args, settings),
        max_connections=settings.max_connections,
        session_key_file=settings.session_key_file,
        max_session_state=settings.max_session_state,
    )


def _listen_option(args: argparse.Namespace, settings: PoolSettings) -> str | None:
    flag = getattr(args, "listen", None)
    if flag is None:
        return settings.listen
    try:
        return listen_address(flag, os.getcwd())
    except ConfigError as exc:
        raise ConfigError(f"--listen: {exc}") from None


def _metrics_socket_option(args: argparse.Namespace, settings: PoolSettings) -> str | None:
    flag = args.metrics_socket
    if flag is None:
        return settings.metrics_socket
    try:
        return metrics_socket(flag, os.getcwd())
    except ConfigError as exc:
        raise ConfigError(f"--metrics-socket: {exc}") from None
