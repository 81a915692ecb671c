"""The kernel policy of one job, applied in a fixed order by the confined child.

:class:`Runtime` is what the template prepares once (the Landlock ABI, the
runtime paths, the compiled seccomp filters); :func:`confine` applies a job's
policy in the child. Every step raises on failure, and the caller then never
runs the code (fail closed).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..job import JobSpec
from . import landlock, seccomp
from .limits import apply_limits
from .privileges import drop_bounding_set, drop_privileges, set_parent_death_signal, switch_user
from .runtime import DEVICE_READ, DEVICE_WRITE, NETWORK_FILES, runtime_paths

__all__ = [
    "BACKEND", "BASE_ENVIRONMENT", "Runtime", "build_ruleset", "confine", "prepare_runtime", "private_data_bytes",
    "reset_environment",
]

_MIN_HEADROOM = 16 << 20

BACKEND = "landlock+seccomp"


@dataclass(frozen=True)
class Runtime:
    """What the template prepares once for every job it forks."""

    landlock_abi: int
    read_paths: tuple[str, ...]
    filters: dict[bool, seccomp.LoadableFilter]
    # Landlock rules opened once: (O_PATH descriptor, rights), always, and with the network.
    rules: tuple[tuple[int, int], ...]
    network_rules: tuple[tuple[int, int], ...]
    # Private writable memory the template already holds, which every child inherits.
    data_bytes: int


def prepare_runtime(package_dirs: tuple[str, ...] = ()) -> Runtime:
    """Probe and precompile what every job needs; raises ``KernelSupportError`` when it cannot confine.

    Also empties the capability bounding set of the calling process (the template), once for all jobs.
    """
    from ..errors import KernelSupportError

    abi = landlock.abi_version()
    if abi < 1:
        raise KernelSupportError("this kernel has no Landlock (or it is disabled): Pynox will not run "
                                 "code unconfined. Run `pynox check` for details.")
    if not seccomp.supported():
        raise KernelSupportError("this kernel has no seccomp filters: Pynox will not run code unconfined.")
    filters = {network: seccomp.LoadableFilter(seccomp.compile_filter(network)) for network in (False, True)}
    read_paths = tuple(runtime_paths(package_dirs))
    rules = _open_rules([(p, landlock.ACCESS_FS_READ) for p in (*read_paths, *DEVICE_READ)]
                        + [(p, landlock.fs_rights(abi)) for p in DEVICE_WRITE])
    network_rules = _open_rules([(p, landlock.ACCESS_FS_READ) for p in NETWORK_FILES])
    drop_bounding_set()
    return Runtime(abi, read_paths, filters, rules, network_rules, private_data_bytes())


def _open_rules(paths: list[tuple[str, int]]) -> tuple[tuple[int, int], ...]:
    opened = (landlock.open_rule(path, rights, missing_ok=True) for path, rights in paths)
    return tuple(rule for rule in opened if rule is not None)


def private_data_bytes() -> int:
    """This process's data segment as RLIMIT_DATA counts it (private writable memory)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[5]) * os.sysconf("SC_PAGE_SIZE")


def build_ruleset(spec: JobSpec, runtime: Runtime) -> int:
    """The job's Landlock ruleset, from the template's prepared rules plus the job's grants and its own
    ``/proc/<pid>``. Built first, while the prepared descriptors are still open; enforced by :func:`confine`."""
    prepared = (*runtime.rules, *(runtime.network_rules if spec.network else ()))
    return landlock.build_ruleset(runtime.landlock_abi, spec.allow_read, spec.allow_write, network=spec.network,
                                  prepared=prepared, optional_read=(f"/proc/{os.getpid()}",))


def confine(spec: JobSpec, runtime: Runtime, ruleset: int) -> None:
    """Apply rlimits, environment, working directory, identity, Landlock and seccomp, in that order.

    The caller has already started a new session, built ``ruleset`` and closed every other descriptor.
    """
    # The child inherits the template's heap (preloaded modules): a limit below it could not even start.
    if spec.memory < runtime.data_bytes + _MIN_HEADROOM:
        raise MemoryError(f"memory limit {spec.memory >> 20} MiB is below what the runtime already uses "
                          f"({runtime.data_bytes >> 20} MiB with its preloaded modules) plus "
                          f"{_MIN_HEADROOM >> 20} MiB to run; raise it")
    apply_limits(memory=spec.memory, timeout=None if spec.session else spec.timeout,
                 max_file_size=spec.max_file_size, max_open_files=spec.max_open_files)
    _clean_environment(spec)
    os.chdir(spec.cwd)
    if spec.uid is not None:
        switch_user(spec.uid, spec.gid if spec.gid is not None else spec.uid)
    # After any credential change, which clears it: the job dies with its template.
    set_parent_death_signal(9)
    drop_privileges()
    landlock.restrict_self(ruleset)
    os.close(ruleset)
    runtime.filters[spec.network].install()


BASE_ENVIRONMENT = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/nonexistent", "LANG": "C.UTF-8"}


def reset_environment() -> None:
    """Make this process's environment the jobs' base (in the template, once: each child then only adds
    what differs, instead of rewriting the whole environment, which costs a child ~80 page faults)."""
    os.environ.clear()
    os.environ.update(BASE_ENVIRONMENT)


def _clean_environment(spec: JobSpec) -> None:
    wanted = dict(BASE_ENVIRONMENT)
    if spec.allow_write:
        wanted["HOME"] = wanted["TMPDIR"] = spec.allow_write[0]
    wanted.update(spec.env)
    current = os.environ
    if current.keys() - wanted.keys():  # not reset by a template: start from nothing
        current.clear()
    for key, value in wanted.items():
        if current.get(key) != value:
            current[key] = value
