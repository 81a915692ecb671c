"""What the kernel holds for a job, counted and bounded: one cgroup per template, for threads and memory.

Threads. Every thread takes a pid from the machine's pid space (``pid_max``,
32768 by default), and a job's threads cost it only their stacks: a 1 GiB job
can hold about 20,000 of them, two such jobs the whole machine.
``RLIMIT_NPROC`` would bound them, but the kernel never applies it to uid 0,
and a pool run as root runs its jobs as uid 0 unless ``run_as`` says
otherwise. So a template's ``pids.max`` is the template itself plus
:data:`MAX_JOB_TASKS`: a template serves one job at a time. The children it
keeps prepared ahead (``[pool] prepared_children``) are in the same cgroup:
beside a job handed to one of them, the others each take one of its threads
(a job's bound is tighter by them, never looser). A job that reaches the bound gets
``EAGAIN`` from ``clone``, which Python reports as ``RuntimeError: can't
start new thread`` (with a hint, see ``hints.py``).

Memory. ``RLIMIT_DATA`` counts a job's private writable memory only: pages it
writes into a tmpfs (a grant on ``/dev/shm``, any tmpfs mount), pipe buffers
and the kernel's own allocations for it count against no rlimit (with
``memory=128m`` a job kept 400 MiB in a granted tmpfs). A memory cgroup counts
them all, as the kernel charges them: anonymous and shared memory, tmpfs
pages, page tables, kernel stacks, pipe buffers. Before each job the pool sets
the template's cgroup limit to what the cgroup holds that cannot be reclaimed
(the template, the children prepared ahead, tmpfs pages earlier jobs left in
their grants) plus the job's ``memory``: page cache is left out, since the
kernel reclaims it for the job, and would otherwise grow the limit job after
job. A job over its limit is killed by the kernel's OOM killer, which picks the
job first (its ``oom_score_adj`` is 1000, see ``limits.py``), never the
template; the pool reads the kill in the cgroup's own count (``oom_kill`` of
``memory.events`` or ``memory.oom_control``) and gives ``MemoryError``. Socket
buffers are not charged for ``AF_UNIX`` sockets: those are bounded by each
socket's send buffer times the job's descriptors.

TCP buffers. On cgroup v2 the kernel charges a socket's buffers to its
cgroup's memory (``sock`` in memory.stat), so they count against the job's
``memory``. On v1 it charges them only to a counter of their own
(``memory.kmem.tcp``), and only for sockets made after a limit was first
written there: the pool writes one when it makes a template's cgroup, and
before each job sets it to what the cgroup holds there plus the job's
``memory``. So on v1 a job's TCP buffers have a budget of their own, as large
as its memory (a job may hold twice its ``memory`` in all), where without it
a 64 MiB job held 225 MiB of send buffers to a peer that never read.

CPU. A job's threads can keep every core busy for its whole timeout (native
code releases the GIL). Where a ``cpu`` controller can be had, a template's
cgroup gets a quota (``cpu.max`` on v2, ``cpu.cfs_quota_us`` over
``cpu.cfs_period_us`` on v1) of ``[pool] job_cpu`` CPUs, one by default, for
the job and the children prepared ahead together (which run nothing once confined).

A job cannot leave its cgroup or change its limits: Landlock gives it no access
to the cgroup files. Both cgroup versions work, each controller where it is:
v1 (a ``pids`` or ``memory`` hierarchy, the process's own cgroup in it), or v2
when the pool's own cgroup may have children with the controller (the root
cgroup, or a delegated one). Where neither is, :func:`available` says why, and
the pool says at start which per-job bound is not in force.

Names. A pool's cgroups are ``pynox-<pid>-<random>``: two pools that are each
PID 1 of their own PID namespace, sharing a cgroupfs, never collide. Whether a
pool's pid is alive cannot be known across PID namespaces, so the sweep that
removes what dead pools left takes only what the kernel lets it remove: an
empty cgroup (``rmdir`` of one that holds a process fails) made more than 10 s
ago (one just made may be about to be filled); a live pool whose directory was
swept while empty makes it again. Under other parents of the same hierarchy (a pool started from another
service's cgroup, or another user's), the start removes only what pools dead for certain left: a name whose pid
runs no process started when that pool did.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import functools
import os
import secrets
import select
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["MAX_JOB_TASKS", "Bounds", "Hierarchy", "MemoryCounter", "TemplateGroup", "TenantGroup", "available",
           "detect", "memory_counted", "remove"]

MAX_JOB_TASKS = 256  # threads of one job, its main thread included
_REMOVE_WAIT = 2.0  # seconds a cgroup may take to empty after its processes were killed
_CONFINE_TRIES = 3  # a sweep by another pool may remove a cgroup in the instant between its mkdir and its use
# A cgroup being removed answers a mkdir beneath it with ENODEV until the kernel has taken it offline (seen
# in CI, where a root pool then started without a memory bound): like a sweep's removal, the next try finds it gone.
_RETRY_PAUSE = 0.05
_SWEEP_WAIT = 0.2  # seconds an emptied directory of a dead pool may stay busy
_SWEEP_AGE = 10.0  # seconds: younger cgroups of other pools are left to them, even when empty
# The walk for dead pools' cgroups under other parents: how deep beneath the mount, and how many directories.
_SWEEP_MAX_DEPTH = 8
_SWEEP_MAX_DIRS = 20_000
_CPU_PERIOD = 100_000  # µs: the kernel's default CFS period
_SETUP_MEMORY = 16 << 20  # what a child may take before it checks its memory limit (see MemoryCounter.start)
# How near its limit a v1 cgroup's peak is when the limit stopped it: the kernel charges in batches of 64 pages.
_LIMIT_SLACK = 1 << 20
# The base of a job's limit (what the cgroup held when it last settled: the template's pages, the child
# prepared ahead) moves by a few hundred KiB from one job to the next. A limit already written that gives the
# job its memory or at most this much less is kept rather than written again (memory+swap, memory: two
# writes of cgroup files a job, each under the cgroup's lock). Never more: what a job holds at its peak is
# within what it asked (kept above it, a job asking 48m was seen holding 48.4 MiB at its peak).
_LIMIT_KEPT_WITHIN = 1 << 20


def _watch_ooms(path: str) -> int | None:
    """v1: an eventfd the kernel counts up each time the OOM killer runs for the limit of the cgroup at ``path``
    or of one above it (cgroup.event_control on memory.oom_control: the kernel notifies the cgroup whose limit
    was met and every cgroup beneath it). Page cache reclaimed at a limit is no OOM, so it counts nothing.
    None where no event can be registered (the older rule, the peak, is then used)."""
    try:
        events = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
    except OSError:
        return None
    try:
        control = os.open(os.path.join(path, "memory.oom_control"), os.O_RDONLY | os.O_CLOEXEC)
        try:
            _write(os.path.join(path, "cgroup.event_control"), f"{events} {control}")
        finally:
            os.close(control)  # the registration holds the cgroup, not this file
    except OSError:
        os.close(events)
        return None
    return events


def _drain(events: int, poller: select.poll | None = None) -> int:
    """What an eventfd counted since it was last read (non-blocking: 0 if nothing). Asked first: most often it
    counted nothing, and a poll says so in one system call, as the read that failed did, without the exception
    that read raised (~2 µs, at every job's and every session step's mark). ``poller``: one kept with ``events``
    registered (a template's, asked by the one thread serving it), else one is made."""
    if poller is None:
        poller = select.poll()
        poller.register(events, select.POLLIN)
    if not poller.poll(0):
        return 0
    try:
        return os.eventfd_read(events)
    except BlockingIOError:
        return 0


def _start_ticks(pid: int | str) -> int | None:
    """When process ``pid`` started, in clock ticks since boot (field 22 of its stat); None if there is none."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return int(stat.read().rsplit(b")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


# pynox-<pid>-<start ticks>-<random>: the pid and start time let a later pool in the same PID namespace tell a
# dead pool's cgroups at once, however young (a pool restarted at once after SIGKILL); the random part keeps
# two pools that are each PID 1 of their own namespace apart.
_POOL_NAME = f"pynox-{os.getpid()}-{_start_ticks('self') or 0}-{secrets.token_hex(4)}"
_cleaned_at_exit: set[str] = set()


@dataclass(frozen=True)
class Hierarchy:
    """A directory of a cgroup hierarchy this pool may create cgroups in, for ``controllers``."""

    base: str
    version: int
    controllers: tuple[str, ...]

    def pool_directory(self) -> str:
        return os.path.join(self.base, _POOL_NAME)

    def make_pool_directory(self) -> str:
        """This pool's cgroup, holding its templates' (with the controllers enabled for them, on v2)."""
        pool = self.pool_directory()
        with contextlib.suppress(FileExistsError):
            os.mkdir(pool)
            if pool not in _cleaned_at_exit:
                _cleaned_at_exit.add(pool)
                atexit.register(remove_pool, self)
        if self.version == 2:
            _write(os.path.join(pool, "cgroup.subtree_control"),
                   " ".join(f"+{name}" for name in self.controllers))
        return pool


@dataclass(frozen=True)
class Bounds:
    """Where this pool bounds a job's threads and memory: a hierarchy for each, or None and why not."""

    pids: Hierarchy | None
    pids_reason: str
    memory: Hierarchy | None
    memory_reason: str
    cpu: Hierarchy | None = None
    cpu_reason: str = "not looked for"
    # Whether the memory cgroup counts a job's TCP buffers (v2 always; v1 with memory.kmem.tcp).
    tcp_counted: bool = False

    def hierarchies(self) -> list[Hierarchy]:
        found = [self.pids, self.memory, self.cpu]
        return [h for i, h in enumerate(found) if h is not None and h not in found[:i]]

    def not_in_force(self) -> list[str]:
        """Each per-job bound this setup cannot give, as a sentence: the ready event and the start say them."""
        missing = []
        if self.pids is None:
            missing.append(f"threads bounded by memory only ({self.pids_reason})")
        if self.memory is None:
            missing.append("memory counts the job's own pages only, not tmpfs pages or kernel buffers; each "
                           f"file a job writes is bounded by its memory ({self.memory_reason})")
        elif not self.tcp_counted:
            missing.append("a job's TCP buffers count against no limit (this kernel's v1 cgroup has no kmem.tcp "
                           "counter)")
        if self.cpu is None:
            missing.append(f"no CPU quota per job: its threads may keep every core busy until its timeout "
                           f"({self.cpu_reason})")
        return missing


def remove(path: str, wait: float = 0.0) -> bool:
    """Remove an emptied cgroup; its last processes may still be exiting, so retry for ``wait`` seconds."""
    end = time.monotonic() + wait
    while True:
        try:
            os.rmdir(path)
            return True
        except FileNotFoundError:
            return True
        except OSError as exc:
            if exc.errno != errno.EBUSY or time.monotonic() >= end:
                return False
        time.sleep(0.01)


def remove_pool(hierarchy: Hierarchy) -> None:
    """At the pool's end: remove every cgroup it made (their processes are gone or going), its tenants' with
    the templates' beneath them."""
    _remove_tree(hierarchy.pool_directory(), _REMOVE_WAIT, _REMOVE_WAIT)


def _remove_tree(path: str, wait: float, inner_wait: float = 0.0,
                 keep: Callable[[os.DirEntry[str]], bool] = lambda _: False) -> int:
    """Remove the cgroups beneath ``path``, deepest first (each given ``inner_wait`` to empty), then ``path``
    (given ``wait``): a pool's holds its templates' and its tenants' (which hold templates' of their own).
    ``keep``: a directory left alone, with what is above it. Returns how many directories are left (rmdir
    refuses a cgroup that holds a process)."""
    left = 0
    with contextlib.suppress(OSError):
        for entry in os.scandir(path):
            if entry.is_dir(follow_symlinks=False):
                left += 1 if keep(entry) else _remove_tree(entry.path, inner_wait, inner_wait, keep)
    if left or not remove(path, wait):
        return left + 1
    return 0


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _fields(text: bytes, *wanted: bytes) -> dict[bytes, int]:
    """The ``wanted`` of ``name value`` lines (memory.stat, memory.events, memory.oom_control), as a dict."""
    # Each wanted name is found where a line starts (after a newline: v1's memory.stat also has "total_<name>"),
    # rather than every line split: memory.stat has ~40 lines, read after every job.
    text = b"\n" + text
    found = {}
    for name in wanted:
        at = text.find(b"\n" + name + b" ")
        if at < 0:
            continue
        start = at + len(name) + 2
        end = text.find(b"\n", start)
        try:
            found[name] = int(text[start:end if end >= 0 else len(text)])
        except ValueError:
            pass
    return found


class MemoryCounter:
    """A template's memory cgroup, as the pool reads and sets it around each job (descriptors kept open: a
    few system calls a job)."""

    # (what, file on v1, file on v2, written by the pool)
    _FILES = (("usage", "memory.usage_in_bytes", "memory.current", False),
              ("limit", "memory.limit_in_bytes", "memory.max", True),
              ("events", "memory.oom_control", "memory.events", False),
              ("stat", "memory.stat", "memory.stat", False))

    def __init__(self, path: str, version: int) -> None:
        self.version = version
        self._fds: dict[str, int] = {}
        self._oom_events: int | None = None
        try:
            for what, v1, v2, written in self._FILES:
                self._open(what, os.path.join(path, v2 if version == 2 else v1), written)
            # The peak since the job started: v1 resets it by a write of 0; v2 from Linux 6.12, per descriptor.
            with contextlib.suppress(OSError):
                self._open("peak", os.path.join(path, "memory.peak" if version == 2 else "memory.max_usage_in_bytes"),
                           True)
            # Swap would let a job hold more than its limit: none on v2; on v1 memory+swap follows the limit.
            if version == 2:
                with contextlib.suppress(FileNotFoundError):
                    _write(os.path.join(path, "memory.swap.max"), "0")
            else:
                with contextlib.suppress(FileNotFoundError):
                    self._open("swap_limit", os.path.join(path, "memory.memsw.limit_in_bytes"), True)
                # TCP buffers: v2 charges them to the cgroup's memory (``sock`` of memory.stat); v1 only to a
                # counter of their own, and only for sockets made after a limit was first written there, so
                # it is written now, before the template forks anything (see the module's docstring).
                with contextlib.suppress(FileNotFoundError):
                    self._open("tcp_limit", os.path.join(path, "memory.kmem.tcp.limit_in_bytes"), True)
                    self._open("tcp_usage", os.path.join(path, "memory.kmem.tcp.usage_in_bytes"), False)
                    os.pwrite(self._fds["tcp_limit"], b"-1", 0)
        except BaseException:
            self.close()
            raise
        # The limit now (v2 says "max" for none): memory+swap must never be set below it.
        now = self._read("limit").strip()
        self._limit_set = int(now) if now.isdigit() else 1 << 62
        self._tcp_set = b""  # v1: the TCP budget written last (the same is not written again)
        self._held = 0
        self._hits = 0
        # v1: the OOMs of this cgroup's limit and its ancestors' (see _watch_ooms), counted as read.
        self._oom_events = _watch_ooms(path) if version == 1 else None
        self._oom_poll: select.poll | None = None  # its poller, made once (see _drain)
        if self._oom_events is not None:
            self._oom_poll = select.poll()
            self._oom_poll.register(self._oom_events, select.POLLIN)
        self._ooms = 0
        self.settle()

    def _open(self, what: str, path: str, written: bool) -> None:
        self._fds[what] = os.open(path, (os.O_RDWR if written else os.O_RDONLY) | os.O_CLOEXEC)

    def _read(self, what: str, size: int = 64) -> bytes:
        return os.pread(self._fds[what], size, 0)

    def _kill_count(self) -> int:
        return _fields(self._read("events", 4096), b"oom_kill").get(b"oom_kill", 0)

    def _limit_hits(self) -> int:
        """v2: how often the kernel's OOM killer ran for this cgroup's own limit ("oom" of memory.events; an
        ancestor's limit, a tenant's budget, counts there, not here). v1 has no such count (memory.failcnt
        stays 0 on recent kernels): how often it ran for this cgroup's limit or an ancestor's (its OOM
        events); 0 where they cannot be had, and :meth:`reached_own_limit` reads the peak instead."""
        if self.version == 2:
            return _fields(self._read("events", 4096), b"oom").get(b"oom", 0)
        if self._oom_events is not None:
            self._ooms += _drain(self._oom_events, self._oom_poll)
        return self._ooms

    def mark(self) -> None:
        """A job or a session's step starts: whether it meets its own limit is counted from here."""
        self._hits = self._limit_hits()

    def reached_own_limit(self, above: int = 0) -> bool:
        """Whether the job met its own limit since :meth:`mark` (read for a job the kernel killed for memory:
        if not, a limit above its own, its tenant's budget, was reached). ``above``: how often the OOM killer
        ran for the limits above this cgroup's meanwhile (the tenant's budget). v1 counts those here too: the
        job met its own if its cgroup had more. Without its OOM events, v1 takes its peak since its start:
        within :data:`_LIMIT_SLACK` of its limit (without a peak, it is taken to have), though page cache the
        kernel reclaimed at the limit, no OOM, raises it there too."""
        if self.version == 2:
            return self._limit_hits() > self._hits
        if self._oom_events is not None:
            return self._limit_hits() - self._hits > above
        if "peak" not in self._fds:
            return True
        return int(self._read("peak")) >= self._limit_set - _LIMIT_SLACK

    def settle(self) -> None:
        """Between jobs, off their path (``memory.stat`` costs ~100 us to read): what the cgroup holds that
        the kernel cannot reclaim, the base of the next job's limit. Pages of the child prepared ahead, if
        it is forked after this, count against that job, whose process it becomes."""
        usage = int(self._read("usage"))
        stat = _fields(self._read("stat", 8192), b"active_file", b"inactive_file", b"shmem", b"sock")
        self._held = max(usage - stat.get(b"active_file", 0) - stat.get(b"inactive_file", 0), 0)
        self._kills = self._kill_count()  # a kill between jobs (of a child prepared ahead) is no job's verdict
        # What earlier jobs left (tmpfs files in their grants, sockets closing): not the next job's doing.
        self._shmem_before = stat.get(b"shmem", 0)
        self._sock_before = stat.get(b"sock", 0) if self.version == 2 else \
            int(self._read("tcp_usage")) if "tcp_usage" in self._fds else 0

    def start(self, memory: int) -> None:
        """Before a job: its limit is what the cgroup held unreclaimably when last settled, plus ``memory``;
        its peak starts from here."""
        # A limit below what a child needs to reach its own check of ``memory`` (policy.confine, which
        # refuses less than the runtime plus 16 MiB before any code runs) would kill it in its setup.
        # Never above the usage now: what was freed since it settled (a grant's tmpfs file the host removed)
        # is not the job's to take.
        self._held = min(self._held, int(self._read("usage")))
        limit = self._held + max(memory, _SETUP_MEMORY)
        if not max(limit - _LIMIT_KEPT_WITHIN, self._held + _SETUP_MEMORY) <= self._limit_set <= limit:
            text = str(limit).encode()
            swap = self._fds.get("swap_limit")
            if swap is not None and limit > self._limit_set:
                os.pwrite(swap, text, 0)  # memory+swap may never be below memory: raised first, lowered last
                swap = None
            os.pwrite(self._fds["limit"], text, 0)
            if swap is not None:
                os.pwrite(swap, text, 0)
            self._limit_set = limit
        self.mark()
        tcp = self._fds.get("tcp_limit")
        if tcp is not None:  # v1: the job's TCP buffers, a budget of their own as large as its memory
            budget = str(int(self._read("tcp_usage")) + max(memory, _SETUP_MEMORY)).encode()
            if budget != self._tcp_set:
                os.pwrite(tcp, budget, 0)
                self._tcp_set = budget
        peak = self._fds.get("peak")
        if peak is not None:
            try:
                os.pwrite(peak, b"0" if self.version == 1 else b"reset", 0)
            except OSError:  # a v2 kernel before 6.12 cannot reset it: the peak of a later job is unknown
                os.close(self._fds.pop("peak"))

    def measure(self) -> int | None:
        """After a job (or a step): what it added at its peak, in KiB (None: unknown here)."""
        if "peak" not in self._fds:
            return None
        return max(int(self._read("peak")) - self._held, 0) // 1024

    def held_in_kernel(self) -> tuple[int, int]:
        """What the job added to the cgroup and holds at its end in shared memory (tmpfs, memfd) and in TCP
        buffers (0 where nothing counts them), in KiB: above what it held when it last settled."""
        stat = _fields(self._read("stat", 8192), b"shmem", b"sock")
        if self.version == 2:
            sock = stat.get(b"sock", 0)
        else:
            sock = int(self._read("tcp_usage")) if "tcp_usage" in self._fds else 0
        return (max(stat.get(b"shmem", 0) - self._shmem_before, 0) // 1024,
                max(sock - self._sock_before, 0) // 1024)

    def killed(self) -> bool:
        """Whether the kernel killed a process of this cgroup for its memory since the last time asked
        (read only for a job killed by SIGKILL, which is how the kernel kills)."""
        kills = self._kill_count()
        killed, self._kills = kills > self._kills, kills
        return killed

    def close(self) -> None:
        # Each closed whatever another did: one that fails (EBADF: closed already) must not keep the others open,
        # nor the template's cgroup from being removed after this.
        for fd in self._fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds.clear()
        if self._oom_events is not None:
            os.close(self._oom_events)
            self._oom_events = self._oom_poll = None


@dataclass
class TemplateGroup:
    """The cgroups of one template (one per hierarchy): every process it forks is in them."""

    paths: list[str] = field(default_factory=list)
    memory: MemoryCounter | None = None

    tenant: TenantGroup | None = None

    @classmethod
    def confine(cls, bounds: Bounds, pid: int, name: str, job_cpu: float = 0.0,
                tenant: TenantGroup | None = None) -> TemplateGroup:
        """Put process ``pid`` (a template, before it forks anything, or between two jobs) in new cgroups of
        its own; with ``job_cpu``, under a quota of that many CPUs where a cpu controller is; with ``tenant``,
        beneath that tenant's cgroups (its budget), else beneath the pool's."""
        group = cls(tenant=tenant)
        try:
            for hierarchy in bounds.hierarchies():
                path = _made(hierarchy, pid, name, job_cpu, tenant)
                group.paths.append(path)
                if hierarchy is bounds.memory:
                    group.memory = MemoryCounter(path, hierarchy.version)
        except BaseException:
            group.close()
            raise
        return group

    def close(self, wait: float = 0.0) -> None:
        if self.memory is not None:
            self.memory.close()
        for path in self.paths:
            remove(path, wait)


class TenantGroup:
    """One tenant's cgroups, one per hierarchy beneath the pool's (``tenant-<n>-<name>``): the cgroups of the
    templates serving its jobs and sessions are made beneath them, so the kernel holds them together to the
    tenant's ``memory_budget`` (``memory.max``; v1 ``memory.limit_in_bytes``) and shares the CPU among tenants
    by its ``cpu_weight`` (``cpu.weight``; v1 ``cpu.shares``, 1024 for 100). A job that reaches the budget is
    killed by the kernel's OOM killer as for its own limit; the pool tells the two apart by which cgroup met
    its limit (see :meth:`MemoryCounter.reached_own_limit` and :meth:`budget_hits`)."""

    def __init__(self, bounds: Bounds, index: int, name: str, memory: int | None, cpu_weight: int | None) -> None:
        self.name = name
        self.memory = memory
        self.cpu_weight = cpu_weight
        self.directory = "tenant-" + str(index) + "-" + "".join(
            c if c.isascii() and (c.isalnum() or c in "._-") else "_" for c in name)[:64]
        self._bounds = bounds
        # v1: the OOMs of the budget (see _watch_ooms), registered on the cgroup made last; read by every worker
        # of the tenant, so counted under a lock. A count only ever grows: each job compares it with its mark.
        self._oom_events: int | None = None
        self._ooms = 0
        self._lock = threading.Lock()
        if memory is not None and bounds.memory is None:
            raise OSError(errno.ENOTSUP, f"no memory cgroup: {bounds.memory_reason}")
        if cpu_weight is not None and bounds.cpu is None:
            raise OSError(errno.ENOTSUP, f"no cpu cgroup: {bounds.cpu_reason}")
        if memory is not None and bounds.memory is not None and bounds.memory.version == 1:
            # v1 applies a parent's limit to its children only with use_hierarchy (always so on v2).
            with open(os.path.join(bounds.memory.base, "memory.use_hierarchy")) as flag:
                if flag.read().strip() != "1":
                    raise OSError(errno.ENOTSUP, f"{bounds.memory.base}/memory.use_hierarchy is 0, so a tenant's "
                                                 "limit would not hold its templates' cgroups")
        for hierarchy in bounds.hierarchies():
            self.make(hierarchy)

    def make(self, hierarchy: Hierarchy) -> str:
        """The tenant's cgroup in ``hierarchy``, with its limits (made again if a sweep removed it while empty)."""
        path = os.path.join(hierarchy.make_pool_directory(), self.directory)
        made = False
        with contextlib.suppress(FileExistsError):
            os.mkdir(path)
            made = True
        if hierarchy.version == 2:
            _write(os.path.join(path, "cgroup.subtree_control"), " ".join(f"+{c}" for c in hierarchy.controllers))
        if "memory" in hierarchy.controllers and self.memory is not None:
            if hierarchy.version == 2:
                _write(os.path.join(path, "memory.max"), str(self.memory))
                with contextlib.suppress(FileNotFoundError):
                    _write(os.path.join(path, "memory.swap.max"), "0")
            else:  # memory+swap may never be below memory: the larger of the two first
                with contextlib.suppress(OSError):
                    _write(os.path.join(path, "memory.memsw.limit_in_bytes"), str(self.memory))
                _write(os.path.join(path, "memory.limit_in_bytes"), str(self.memory))
                with contextlib.suppress(FileNotFoundError):
                    _write(os.path.join(path, "memory.memsw.limit_in_bytes"), str(self.memory))
                with self._lock:
                    if made or self._oom_events is None:  # a cgroup made again (swept while empty) is watched anew
                        if self._oom_events is not None:
                            # What it counted is kept (removed with its cgroup, it may count that once: no job ran).
                            self._ooms += _drain(self._oom_events)
                            os.close(self._oom_events)
                        self._oom_events = _watch_ooms(path)
        if "cpu" in hierarchy.controllers and self.cpu_weight is not None:
            if hierarchy.version == 2:
                _write(os.path.join(path, "cpu.weight"), str(self.cpu_weight))
            else:
                _write(os.path.join(path, "cpu.shares"), str(max(self.cpu_weight * 1024 // 100, 2)))
        return path

    def budget_hits(self) -> int:
        """v2: how often the kernel's OOM killer ran for the tenant's budget ("oom" of memory.events.local). v1,
        which counts no such thing in a file: how often it ran for the budget (or a limit above it) by the
        tenant cgroup's OOM events (see _watch_ooms); without them, 1 once the tenant's peak came within
        :data:`_LIMIT_SLACK` of its budget, else 0 (so a job killed at no limit of its own, while the tenant
        never reached its budget, is not blamed on it). 0 where the tenant has no memory budget."""
        hierarchy = self._bounds.memory
        if self.memory is None or hierarchy is None:
            return 0
        with self._lock:
            if self._oom_events is not None:
                self._ooms += _drain(self._oom_events)
                return self._ooms
        path = os.path.join(hierarchy.pool_directory(), self.directory)
        try:
            if hierarchy.version == 2:
                with open(os.path.join(path, "memory.events.local"), "rb") as events:
                    return _fields(events.read(), b"oom").get(b"oom", 0)
            with open(os.path.join(path, "memory.max_usage_in_bytes"), "rb") as peak:
                return int(int(peak.read()) >= self.memory - _LIMIT_SLACK)
        except (OSError, ValueError):
            return 0

    def budget_mark(self) -> int:
        """What :meth:`budget_hits` is compared with for a job starting now: the count, on v2 and where v1's OOM
        events are watched; else 0 (v1's peak)."""
        hierarchy = self._bounds.memory
        watched = hierarchy is not None and (hierarchy.version == 2 or self._oom_events is not None)
        return self.budget_hits() if watched else 0

    def close(self) -> None:
        """At the pool's end, once its templates are gone (what is left is removed with the pool's cgroup)."""
        with self._lock:
            if self._oom_events is not None:
                os.close(self._oom_events)
                self._oom_events = None
        for hierarchy in self._bounds.hierarchies():
            _remove_tree(os.path.join(hierarchy.pool_directory(), self.directory), _REMOVE_WAIT, _REMOVE_WAIT)


def _made(hierarchy: Hierarchy, pid: int, name: str, job_cpu: float = 0.0, tenant: TenantGroup | None = None) -> str:
    for attempt in range(_CONFINE_TRIES):
        parent = hierarchy.make_pool_directory() if tenant is None else tenant.make(hierarchy)
        path = os.path.join(parent, name)
        try:
            with contextlib.suppress(FileExistsError):
                os.mkdir(path)
            if "pids" in hierarchy.controllers:
                _write(os.path.join(path, "pids.max"), str(MAX_JOB_TASKS + 1))
            if "cpu" in hierarchy.controllers and job_cpu > 0:
                _cpu_quota(path, hierarchy.version, job_cpu)
            _write(os.path.join(path, "cgroup.procs"), str(pid))
            return path
        except OSError as exc:
            if not _transient(exc) or attempt == _CONFINE_TRIES - 1:
                remove(path)
                raise
            time.sleep(_RETRY_PAUSE * (attempt + 1))
        except BaseException:
            remove(path)
            raise
    raise AssertionError("unreachable")


def _cpu_quota(path: str, version: int, cpus: float) -> None:
    """At most ``cpus`` CPUs' worth of time per period for the cgroup's threads together."""
    quota = max(int(cpus * _CPU_PERIOD), 1000)  # the kernel's least quota is 1 ms
    if version == 2:
        _write(os.path.join(path, "cpu.max"), f"{quota} {_CPU_PERIOD}")
    else:
        _write(os.path.join(path, "cpu.cfs_period_us"), str(_CPU_PERIOD))
        _write(os.path.join(path, "cpu.cfs_quota_us"), str(quota))


def _own_cgroups() -> dict[str, str]:
    """controller (or "" for v2) -> this process's cgroup path, from /proc/self/cgroup."""
    found: dict[str, str] = {}
    with open("/proc/self/cgroup") as lines:
        for line in lines:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            for controller in controllers.split(",") if controllers else [""]:
                found[controller] = path
    return found


def _mounts() -> list[tuple[str, str, str]]:
    """(mount point, filesystem type, super options) of every mount, from /proc/self/mountinfo."""
    mounts = []
    with open("/proc/self/mountinfo") as lines:
        for line in lines:
            left, _, right = line.partition(" - ")
            fields, tail = left.split(), right.split()
            if len(fields) >= 5 and len(tail) >= 3:
                mounts.append((fields[4], tail[0], tail[2]))
    return mounts


def _find(controller: str, own: dict[str, str], mounts: list[tuple[str, str, str]]) -> tuple[Hierarchy | None, str]:
    """Where this process may make cgroups with ``controller``: its v1 hierarchy, else v2."""
    if controller in own:
        for point, kind, options in mounts:
            if kind == "cgroup" and controller in options.split(","):
                base = os.path.normpath(os.path.join(point, own[controller].lstrip("/")))
                return Hierarchy(base, 1, (controller,)), ""
    if "" in own:
        for point, kind, _ in mounts:
            if kind == "cgroup2":
                base = os.path.normpath(os.path.join(point, own[""].lstrip("/")))
                try:
                    with open(os.path.join(base, "cgroup.controllers")) as controllers:
                        present = controllers.read().split()
                except OSError as exc:
                    return None, f"cannot read {base}/cgroup.controllers: {exc}"
                if controller not in present:
                    return None, f"the {controller} controller is not available in {base}"
                return Hierarchy(base, 2, (controller,)), ""
    return None, f"no {controller} cgroup controller is mounted"


def detect() -> Bounds:
    """The cgroups that can bound a job's threads and memory here, each tried (or None and why not)."""
    try:
        own, mounts = _own_cgroups(), _mounts()
    except OSError as exc:
        reason = f"cannot read this process's cgroups: {exc}"
        return Bounds(None, reason, None, reason)
    found = {name: _find(name, own, mounts) for name in ("pids", "memory", "cpu")}
    # On v2, one cgroup with every controller found there.
    unified = [name for name, (hierarchy, _) in found.items() if hierarchy is not None and hierarchy.version == 2]
    if len(unified) > 1:
        base = found[unified[0]][0].base  # type: ignore[union-attr]  # found on v2 above
        for name in unified:
            found[name] = (Hierarchy(base, 2, tuple(unified)), "")
    tried: dict[Hierarchy, tuple[Hierarchy | None, str]] = {}
    usable: dict[str, tuple[Hierarchy | None, str]] = {}
    for name, (hierarchy, reason) in found.items():
        if hierarchy is not None and hierarchy in tried:
            usable[name] = tried[hierarchy]
            continue
        usable[name] = _usable(hierarchy, reason)
        if hierarchy is not None:
            tried[hierarchy] = usable[name]
    if len(unified) > 1 and "cpu" in unified and usable["cpu"][0] is None:
        # The cpu controller may be the one v2 will not enable here: threads and memory are bounded without it.
        rest = tuple(name for name in unified if name != "cpu")
        base = found[rest[0]][0].base  # type: ignore[union-attr]  # found on v2 above
        without = _usable(Hierarchy(base, 2, rest), "")
        for name in rest:
            usable[name] = without
    (pids, pids_reason), (memory, memory_reason), (cpu, cpu_reason) = usable["pids"], usable["memory"], usable["cpu"]
    tcp = memory is not None and (memory.version == 2 or os.path.exists(
        os.path.join(memory.base, "memory.kmem.tcp.limit_in_bytes")))
    return Bounds(pids, pids_reason, memory, memory_reason, cpu, cpu_reason, tcp)


@functools.cache
def _available() -> Bounds:
    bounds = detect()
    for hierarchy in bounds.hierarchies():
        _sweep(hierarchy.base)
        _sweep_elsewhere(hierarchy.base)
    return bounds


def available(*, fresh: bool = False) -> Bounds:
    """:func:`detect`, once per process, after removing what pools that died without cleaning left
    (``fresh``: detect again, as a test that changed the world does)."""
    if fresh:
        _available.cache_clear()
    return _available()


def memory_counted() -> bool:
    """Whether a cgroup counts a job's memory here (else the pool bounds each file a job writes by it)."""
    return available().memory is not None


def _sweep(base: str) -> None:
    """Remove every empty cgroup other pools left: a live pool's hold its templates, and rmdir refuses them."""
    for entry in os.scandir(base):
        if not (entry.name.startswith("pynox-") and entry.name != _POOL_NAME and entry.is_dir()):
            continue
        dead = _dead(entry.name)
        if not dead and _young(entry):
            continue
        # A live pool's cgroup holds a process, or is young and about to (a tenant's with its templates' too);
        # a child just removed may keep its parent busy for a moment.
        _remove_tree(entry.path, _SWEEP_WAIT, keep=(lambda _: False) if dead else _young)


def _mount_root(base: str) -> str | None:
    """The cgroup filesystem mount that holds ``base`` (the deepest one, as v1 mounts one per controller)."""
    try:
        points = [point for point, kind, _ in _mounts() if kind in ("cgroup", "cgroup2")]
    except OSError:
        return None
    holding = [point for point in points if base == point or base.startswith(point.rstrip("/") + "/")]
    return max(holding, key=len) if holding else None


def _sweep_elsewhere(base: str) -> None:
    """What dead pools left under other parents of the same hierarchy (a pool started from another service's
    or user's cgroup): only the directories whose pool is dead for certain, by pid and start time (a name
    without a start time is left alone there), however young. rmdir still refuses any cgroup that holds a
    process. The walk is bounded (depth and count), so a host with a large tree costs the start little."""
    root = _mount_root(base)
    if root is None:
        return
    pending, seen = [(root, 0)], 0
    while pending and seen < _SWEEP_MAX_DIRS:
        path, depth = pending.pop()
        try:
            entries = [entry for entry in os.scandir(path) if entry.is_dir(follow_symlinks=False)]
        except OSError:
            continue
        for entry in entries:
            seen += 1
            if entry.name.startswith("pynox-"):
                if entry.path != os.path.join(base, entry.name) and entry.name != _POOL_NAME and _dead(entry.name):
                    _remove_dead_pool(entry.path)
            elif depth < _SWEEP_MAX_DEPTH:
                pending.append((entry.path, depth + 1))


def _remove_dead_pool(path: str) -> None:
    _remove_tree(path, _SWEEP_WAIT)


def _dead(name: str) -> bool:
    """The pool that named this directory is dead for certain: its pid runs no process started when it did. (A
    pool of another PID namespace may look dead too; rmdir still refuses every cgroup that holds a process, and a
    pool whose empty cgroup was removed makes it again.) Names without a start time are judged by age alone."""
    parts = name.split("-")
    if len(parts) != 4 or not (parts[1].isdigit() and parts[2].isdigit()) or parts[2] == "0":
        return False
    return _start_ticks(parts[1]) != int(parts[2])


def _young(entry: os.DirEntry[str]) -> bool:
    """Made in the last seconds: a pool may be about to fill it (a cgroup's times are those of its mkdir)."""
    try:
        return time.time() - entry.stat().st_mtime < _SWEEP_AGE
    except OSError:
        return False


def _transient(exc: OSError) -> bool:
    """A cgroup that went away (swept) or is going away (ENODEV) between two steps: worth one more try."""
    return isinstance(exc, FileNotFoundError) or exc.errno == errno.ENODEV


def _usable(hierarchy: Hierarchy | None, reason: str) -> tuple[Hierarchy | None, str]:
    """Try it: make this pool's directory and one cgroup in it, with a limit, holding nobody."""
    if hierarchy is None:
        return None, reason
    probe = os.path.join(hierarchy.pool_directory(), "probe")
    for attempt in range(_CONFINE_TRIES):
        try:
            os.mkdir(os.path.join(hierarchy.make_pool_directory(), "probe"))
            if "pids" in hierarchy.controllers:
                _write(os.path.join(probe, "pids.max"), str(MAX_JOB_TASKS + 1))
            if "memory" in hierarchy.controllers:
                MemoryCounter(probe, hierarchy.version).close()
            if "cpu" in hierarchy.controllers:
                _cpu_quota(probe, hierarchy.version, 1.0)
            break
        except OSError as exc:
            remove(probe)
            remove(hierarchy.pool_directory())
            if _transient(exc) and attempt < _CONFINE_TRIES - 1:
                time.sleep(_RETRY_PAUSE * (attempt + 1))
                continue  # swept by another pool in between, or still going offline
            kinds = "/".join(hierarchy.controllers)
            return None, f"cannot create a {kinds} cgroup under {hierarchy.base}: {exc}"
    remove(probe)
    remove(hierarchy.pool_directory())
    return hierarchy, describe(hierarchy)


def describe(hierarchy: Hierarchy) -> str:
    what = {"pids": f"at most {MAX_JOB_TASKS} threads per job", "memory": "a job's memory as the kernel counts it",
            "cpu": "a CPU quota per job ([pool] job_cpu)"}
    return (f"{'/'.join(hierarchy.controllers)} cgroup v{hierarchy.version} under {hierarchy.base}: "
            + "; ".join(what[name] for name in hierarchy.controllers))
