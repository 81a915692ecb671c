"""The kernel policy of one job, applied in a fixed order by the confined child.

:class:`Runtime` is what the template prepares once (the Landlock ABI, the
runtime paths, the compiled seccomp filters); :func:`confine` applies a job's
:class:`~pynox.wire.spec.Confinement` in the child. Every step raises on failure,
and the caller then never runs the code (fail closed).
"""

from __future__ import annotations

import os
import struct

import msgspec

from ..wire.descriptors import CONTROL, METADATA, OUTPUTS, RULESET, STAGING
from ..wire.exits import SETUP_FAILED_EXIT
from ..wire.spec import Confinement, NetworkMode
from . import landlock, seccomp
from .limits import apply_limits, wanted_limits
from .native import (
    APPLY_POLICY,
    ARRANGE,
    BUILD_RULESET,
    NativeCall,
    NativeFailure,
    NativePlan,
    load_error,
    path_identities,
    plan,
)
from .own_process import OwnProcessFilter
from .privileges import drop_bounding_set, drop_privileges, set_parent_death_signal, switch_user
from .runtime import DEVICE_READ, DEVICE_WRITE, NETWORK_FILES, OWN_PROC_DIRECTORIES, OWN_PROC_ENTRIES, runtime_paths

__all__ = [
    "BACKEND", "BASE_ENVIRONMENT", "MAX_FD", "OWN_ENTRY_RIGHTS", "Runtime", "RuntimeRules", "add_environment",
    "base_environment", "build_ruleset", "check_memory", "confine", "granted_rights", "native_call",
    "prepare_runtime", "prepared_rules", "private_data_bytes", "reset_environment",
]

_MIN_HEADROOM = 16 << 20

BACKEND = "landlock+seccomp"


# A frozen msgspec.Struct, not a dataclass: msgspec is loaded in every template anyway, and dataclasses would
# be imported for the policy's value classes alone, with inspect, dis and copy: ~1 MiB of private memory that
# every job's fork copies (docs/performance.md, "The template, smaller").
class Runtime(msgspec.Struct, frozen=True):
    """What the template prepares once for every job it forks."""

    landlock_abi: int  # what jobs are confined with: the kernel's ABI, or the operator's cap below it
    landlock_abi_kernel: int
    read_paths: tuple[str, ...]
    # By network mode, and whether for a session's child (whose forks go to the steward: see compile_filter).
    filters: dict[tuple[NetworkMode, bool], seccomp.LoadableFilter]
    # Merged into each main filter's program (filters[...].merged), the child's own pid written in; stacked
    # where it cannot be (see own_process.py).
    own_process: OwnProcessFilter
    # Landlock rules of the runtime, always and with the network (all or hosts); see RuntimeRules.
    rules: RuntimeRules
    network_rules: RuntimeRules
    # Private writable memory the template already holds, which every child inherits.
    data_bytes: int
    # The template's own pid: its children are forked by this process, and check that it is still their
    # parent once they have asked to die with it (see job/setup.py).
    pid: int
    # What the child's confinement in one native call needs (policy/native.py); None: the Python steps.
    native: NativePlan | None = None

    @property
    def memory_floor(self) -> int:
        """The least memory limit a job forked from here can start under."""
        return self.data_bytes + _MIN_HEADROOM


def prepare_runtime(package_dirs: tuple[str, ...] = (), data_dirs: tuple[str, ...] = (), *,
                    max_abi: int | None = None, native: bool | None = None) -> Runtime:
    """Probe and precompile what every job needs; raises ``KernelSupportError`` when it cannot confine.
    ``max_abi``: the highest Landlock ABI to use (the operator's cap; see ``config.landlock_abi_cap``).
    ``native``: children confine in one native call (True: or the template fails), through the Python
    steps (False), or natively when the extension loads (None; see ``config.native_from_environment``).

    Also empties the capability bounding set of the calling process (the template), once for all jobs.
    """
    from ..errors import ConfigError, KernelSupportError

    kernel_abi, absent = landlock.probe()
    if kernel_abi < 1:
        raise KernelSupportError(f"Pynox will not run code unconfined: {absent}. `pynox check` tells more.")
    if not seccomp.supported():
        raise KernelSupportError("this kernel has no seccomp filters: Pynox will not run code unconfined.")
    abi = kernel_abi if max_abi is None else min(kernel_abi, max_abi)
    own_process = OwnProcessFilter.build()
    filters: dict[tuple[NetworkMode, bool], seccomp.LoadableFilter] = {
        (mode, session): _loadable(seccomp.compile_filter(mode, abi, session=session), own_process)
        for mode in seccomp.NETWORK_MODES for session in (False, True)}
    read_paths = tuple(runtime_paths(package_dirs, data_dirs))
    rules = RuntimeRules([(p, landlock.ACCESS_FS_READ) for p in (*read_paths, *DEVICE_READ)]
                         + [(p, landlock.fs_rights(abi)) for p in DEVICE_WRITE])
    network_rules = RuntimeRules([(p, landlock.ACCESS_FS_READ) for p in NETWORK_FILES])
    if native and load_error() is not None:
        raise ConfigError(f"$PYNOX_NATIVE=1, but the native confinement cannot load: {load_error()}")
    drop_bounding_set()
    return Runtime(abi, kernel_abi, read_paths, filters, own_process, rules, network_rules,
                   private_data_bytes(), os.getpid(), plan(own_process) if native is not False else None)


def _loadable(compiled: seccomp.CompiledFilter, own_process: OwnProcessFilter) -> seccomp.LoadableFilter:
    """The main filter, merged with the own-process filter into the one program a child installs (see
    ``OwnProcessFilter.before``), or stacked where the two cannot be merged."""
    try:
        merged: OwnProcessFilter | None = own_process.before(compiled.bpf)
    except ValueError:
        merged = None
    return seccomp.LoadableFilter(compiled, merged)


_IDENTITY = struct.Struct("=QQ")  # (st_dev, st_ino), as _confine.identities packs them


class RuntimeRules:
    """The runtime's Landlock rules, opened once in the template and reopened when a path changes.

    The host replaces some of these files atomically in ordinary operation (``/etc/resolv.conf`` by a
    DHCP client, ``/etc/ld.so.cache`` by ``ldconfig``, ``/etc/localtime``, a package directory moved by
    a deploy): a rule holds the inode it was opened on, so the new file would be denied and the old one
    stay readable under its new name. :meth:`refresh` compares each path's inode with the rule's and
    reopens what changed; the template calls it before every child it forks. A child prepared ahead keeps
    the rules it was confined with: the server hands it no job once a path may have changed since
    (:class:`~pynox.policy.runtime.RuntimeWatch`), and the template discards it as it forks that job.
    """

    def __init__(self, wanted: list[tuple[str, int]]) -> None:
        self._wanted = wanted
        self._opened = [self._open(path, rights) for path, rights in wanted]
        self._current: tuple[tuple[int, int], ...] | None = None  # what current() gives until a rule changes
        self.generation = 0  # counts the refreshes that reopened a rule: a call laid out before is stale
        # Each path's identity as its rule holds it, packed as path_identities gives a path's now: when the two
        # are equal, no rule is stale (one native call and one comparison before every fork).
        self._paths = tuple(os.fsencode(path) for path, _ in wanted)
        self._held = self._pack()

    def _pack(self) -> bytes:
        return b"".join(_IDENTITY.pack(*(opened[2] if opened is not None else (0, 0))) for opened in self._opened)

    @staticmethod
    def _open(path: str, rights: int) -> tuple[int, int, tuple[int, int]] | None:
        rule = landlock.open_rule(path, rights, missing_ok=True)
        if rule is None:
            return None
        info = os.fstat(rule[0])
        return rule[0], rule[1], (info.st_dev, info.st_ino)

    def current(self) -> tuple[tuple[int, int], ...]:
        """(O_PATH descriptor, rights) of every path that exists, one rule per file: paths that name the same
        one (``/lib`` and ``/usr/lib`` where one is a link to the other) make one rule with the rights of
        both, as Landlock makes of two rules on one inode (it joins their rights); each child adds one fewer."""
        if self._current is None:
            rules: dict[tuple[int, int], tuple[int, int]] = {}
            for fd, rights, identity in filter(None, self._opened):
                first = rules.get(identity)
                rules[identity] = (fd, rights) if first is None else (first[0], first[1] | rights)
            self._current = tuple(rules.values())
        return self._current

    def identities(self) -> tuple[tuple[bytes, ...], bytes]:
        """Its paths, and their identities as its rules hold them: what :meth:`refresh` compares the paths'
        identities now with (the template's native loop compares them itself, template/_fork_loop.c)."""
        return self._paths, self._held

    def refresh(self) -> None:
        now = path_identities(self._paths)
        if now is not None and now == self._held:
            return
        for index, (path, rights) in enumerate(self._wanted):
            try:
                info = os.stat(path)
                identity: tuple[int, int] | None = (info.st_dev, info.st_ino)
            except OSError:
                identity = None
            opened = self._opened[index]
            if (opened[2] if opened is not None else None) != identity:
                if opened is not None:
                    os.close(opened[0])
                self._opened[index] = self._open(path, rights)
                self._current = None
                self.generation += 1
                self._held = self._pack()


def private_data_bytes() -> int:
    """This process's data segment as RLIMIT_DATA counts it (private writable memory)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[5]) * os.sysconf("SC_PAGE_SIZE")


def build_ruleset(confinement: Confinement, runtime: Runtime, grants: list[int]) -> int:
    """The job's Landlock ruleset: the template's prepared rules, the job's grants (one descriptor per path
    of ``allow_read`` then ``allow_write``, opened by the server when the job started) and the entries of
    its own ``/proc/<pid>`` it may read. Built first, while those descriptors are still open; enforced by
    :func:`confine`."""
    granted = [(fd, landlock.fitting(fd, rights)) for fd, rights in granted_rights(confinement, runtime, grants)]
    own = f"/proc/{os.getpid()}"
    entries = [(f"{own}/{entry}", rights) for entry, rights in OWN_ENTRY_RIGHTS]
    # With "hosts", Landlock (ABI 4 and later) refuses every TCP bind and connect of the job's own: the pool
    # makes each connection for it, on its socket, to a listed address (the steward is not confined).
    return landlock.build_ruleset(runtime.landlock_abi, network=confinement.network == "all",
                                  prepared=(*prepared_rules(confinement, runtime), *granted), optional=entries)


# The entries of its own /proc/<pid> a job may read, each with the rights that fit it (a file takes fewer).
OWN_ENTRY_RIGHTS = tuple((entry, landlock.ACCESS_FS_READ if entry in OWN_PROC_DIRECTORIES
                          else landlock.ACCESS_FS_READ & landlock.FILE_RIGHTS) for entry in OWN_PROC_ENTRIES)


def prepared_rules(confinement: Confinement, runtime: Runtime) -> tuple[tuple[int, int], ...]:
    """The template's rules a job's ruleset takes: the runtime's, and with any network its name files (with
    "hosts" the job's resolver answers from the pool's pinned names, job/resolver.py, but a library may
    still read /etc/services or /etc/hosts)."""
    if confinement.network == "none":
        return runtime.rules.current()
    return (*runtime.rules.current(), *runtime.network_rules.current())


def granted_rights(confinement: Confinement, runtime: Runtime, grants: list[int]) -> list[tuple[int, int]]:
    """Each grant descriptor with the rights it is given before fitting (:func:`landlock.fitting` keeps
    what a file can carry): reading for ``allow_read``, every right for ``allow_write``."""
    read, write = confinement.allow_read, confinement.allow_write
    if len(grants) != len(read) + len(write):
        raise ValueError(f"expected {len(read) + len(write)} grant descriptors, got {len(grants)}")
    all_rights = landlock.fs_rights(runtime.landlock_abi)
    return ([(fd, landlock.ACCESS_FS_READ) for fd in grants[:len(read)]]
            + [(fd, all_rights) for fd in grants[len(read):]])


def confine(confinement: Confinement, runtime: Runtime, ruleset: int) -> int:
    """Apply rlimits, the base environment, working directory, identity, Landlock and the seccomp filters,
    in that order, and return the main filter's listener, which the caller hands to the pool and closes
    before the job's code runs.

    The caller has already started a new session, built ``ruleset`` and closed every other descriptor.
    """
    check_memory(confinement, runtime)
    apply_limits(memory=confinement.memory, timeout=None if confinement.session else confinement.timeout,
                 max_file_size=confinement.max_file_size, max_open_files=confinement.max_open_files)
    base_environment(confinement)
    os.chdir(confinement.cwd)
    if confinement.uid is not None:
        switch_user(confinement.uid, confinement.gid if confinement.gid is not None else confinement.uid)
    # After any credential change, which clears it: the job dies with its template.
    set_parent_death_signal(9)
    drop_privileges()
    landlock.restrict_self(ruleset)
    os.close(ruleset)
    loadable = runtime.filters[(confinement.network, confinement.session)]
    listener = loadable.install(os.getpid())  # with the own-process filter merged in
    if loadable.merged is None:
        runtime.own_process.install(os.getpid())
    return listener


# Every descriptor below this is closed when a child arranges its own (job/setup.arrange, and the native call).
MAX_FD = 1 << 20
_OWN_ENTRIES = tuple((entry.encode(), rights) for entry, rights in OWN_ENTRY_RIGHTS)


def native_call(confinement: Confinement, runtime: Runtime, grants: list[int], sent: list[int],
                targets: tuple[int, ...], *, prepared: bool) -> NativeCall:
    """A child's native call (``runtime.native`` must be set), laid out where it is cheapest: in the template,
    before the fork. The checks the Python steps make before their system calls (the grants' count, the
    descriptors' count, the memory floor) are made here, with no effect; the first that fails is the call's
    ``failed``, and the child then makes the steps before it and stops, as the Python steps would."""
    assert runtime.native is not None
    failed: NativeFailure | None = None
    granted: list[tuple[int, int]] = []
    try:
        granted = granted_rights(confinement, runtime, grants)
    except ValueError as exc:
        failed = NativeFailure.of(BUILD_RULESET, str(exc))
    if failed is None and len(sent) != len(targets):
        failed = NativeFailure.of(ARRANGE, f"expected {len(targets)} descriptors, got {len(sent)}")
    if failed is None:
        try:
            check_memory(confinement, runtime)
        except MemoryError as exc:
            failed = NativeFailure.of(APPLY_POLICY, str(exc))
    return runtime.native.lay_out(
        parent_pid=runtime.pid, exit_status=SETUP_FAILED_EXIT, abi=runtime.landlock_abi,
        network_all=confinement.network == "all", prepared_rules=prepared_rules(confinement, runtime),
        granted_rules=granted, own_entries=_OWN_ENTRIES, moves=list(zip(sent, targets, strict=False)),
        ruleset_target=RULESET, null_read=(0,), null_write=OUTPUTS if prepared else (),
        staging=STAGING, max_fd=MAX_FD,
        limits=wanted_limits(memory=confinement.memory, timeout=None if confinement.session else confinement.timeout,
                             max_file_size=confinement.max_file_size, max_open_files=confinement.max_open_files),
        confinement=confinement, main_filter=runtime.filters[(confinement.network, confinement.session)],
        handover=CONTROL if prepared else METADATA, keep_handover=prepared, failed=failed)


def check_memory(confinement: Confinement, runtime: Runtime) -> None:
    """The child inherits the template's heap (preloaded modules): a limit below it could not even start."""
    if confinement.memory < runtime.memory_floor:
        raise MemoryError(f"memory limit {confinement.memory >> 20} MiB is below what the runtime already uses "
                          f"({runtime.data_bytes >> 20} MiB with its preloaded modules) plus "
                          f"{_MIN_HEADROOM >> 20} MiB to run; raise it")


BASE_ENVIRONMENT = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/nonexistent", "LANG": "C.UTF-8"}


# The base as os.environ holds it (encoded), once reset_environment made it this process's environment.
_reset_to: dict[bytes, bytes] | None = None


def reset_environment(runtime_env: dict[str, str] | None = None) -> None:
    """Make this process's environment the jobs' base (in the template, once: each child then only adds
    what differs, instead of rewriting the whole environment, which costs a child ~80 page faults).
    ``runtime_env``: what the runtime's libraries need in every job of this template (its figures)."""
    global _reset_to
    BASE_ENVIRONMENT.update(runtime_env or {})
    os.environ.clear()
    os.environ.update(BASE_ENVIRONMENT)
    _reset_to = {os.fsencode(key): os.fsencode(value) for key, value in BASE_ENVIRONMENT.items()}


def base_environment(confinement: Confinement) -> None:
    """The base, with HOME and TMPDIR in the first write grant: all of a job's environment that its
    confinement decides. The job's own ``env`` comes with its payload (:func:`add_environment`)."""
    current = os.environ
    # Still the base reset_environment made it (one comparison in C of what os.environ holds: walking it
    # through its Python mapping methods cost a child ~70 page faults): only the write grant's HOME and
    # TMPDIR are left to write.
    if _reset_to is not None and getattr(current, "_data", None) == _reset_to:
        if confinement.allow_write:
            add_environment({"HOME": confinement.allow_write[0], "TMPDIR": confinement.allow_write[0]})
        return
    wanted = dict(BASE_ENVIRONMENT)
    if confinement.allow_write:
        wanted["HOME"] = wanted["TMPDIR"] = confinement.allow_write[0]
    if current.keys() - wanted.keys():  # not reset by a template: start from nothing
        current.clear()
    add_environment(wanted)


def add_environment(env: dict[str, str]) -> None:
    """The job's own variables, over the base (in the confined child, once its payload arrived; the host's
    environment was never here: the template was started with a scrubbed one and reset it to the base).
    Only what differs is written: each write costs the child page faults."""
    current = os.environ
    for key, value in env.items():
        if current.get(key) != value:
            current[key] = value
