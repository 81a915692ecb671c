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
from .privileges import drop_privileges, set_parent_death_signal, switch_user
from .runtime import DEVICE_READ, DEVICE_WRITE, NETWORK_FILES, runtime_paths

__all__ = ["BACKEND", "Runtime", "confine", "prepare_runtime"]

BACKEND = "landlock+seccomp"


@dataclass(frozen=True)
class Runtime:
    landlock_abi: int
    read_paths: tuple[str, ...]
    filters: dict[bool, seccomp.CompiledFilter]


def prepare_runtime(package_dirs: tuple[str, ...] = ()) -> Runtime:
    """Probe and precompile what every job needs; raises ``KernelSupportError`` when it cannot confine."""
    from ..errors import KernelSupportError

    abi = landlock.abi_version()
    if abi < 1:
        raise KernelSupportError("this kernel has no Landlock (or it is disabled): Pynox will not run "
                                 "code unconfined. Run `pynox check` for details.")
    if not seccomp.supported():
        raise KernelSupportError("this kernel has no seccomp filters: Pynox will not run code unconfined.")
    filters = {network: seccomp.compile_filter(network) for network in (False, True)}
    return Runtime(abi, tuple(runtime_paths(package_dirs)), filters)


def confine(spec: JobSpec, runtime: Runtime) -> None:
    """Apply rlimits, environment, working directory, identity, Landlock and seccomp, in that order.

    The caller has already started a new session and arranged the descriptors.
    """
    apply_limits(memory=spec.memory, timeout=None if spec.session else spec.timeout, max_file_size=spec.max_file_size,
                 max_open_files=spec.max_open_files)
    _clean_environment(spec)
    os.chdir(spec.cwd)
    if spec.uid is not None:
        switch_user(spec.uid, spec.gid if spec.gid is not None else spec.uid)
    # After any credential change, which clears it: the job dies with its template.
    set_parent_death_signal(9)
    own_proc = f"/proc/{os.getpid()}"
    optional = (*runtime.read_paths, *DEVICE_READ, own_proc, *(NETWORK_FILES if spec.network else ()))
    # The ruleset is built before privileges go: opening a grant may need them.
    ruleset = landlock.build_ruleset(runtime.landlock_abi, spec.allow_read,
                                     [*spec.allow_write, *DEVICE_WRITE], network=spec.network,
                                     optional_read=optional)
    try:
        drop_privileges()
        landlock.restrict_self(ruleset)
    finally:
        os.close(ruleset)
    seccomp.install(runtime.filters[spec.network])


def _clean_environment(spec: JobSpec) -> None:
    home = spec.allow_write[0] if spec.allow_write else "/nonexistent"
    base = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": home, "LANG": "C.UTF-8"}
    if spec.allow_write:
        base["TMPDIR"] = spec.allow_write[0]
    os.environ.clear()
    os.environ.update(base)
    os.environ.update(spec.env)
