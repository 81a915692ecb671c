"""Resource limits of one job: memory, CPU, file size, descriptors, no core dumps.

Memory is bounded by ``RLIMIT_DATA`` (private writable memory: heap, anonymous
mmap), which is what a Python allocation consumes. ``RLIMIT_AS`` would count
address space that is reserved but never used (thread stacks, glibc arenas,
BLAS buffers) and make a 256 MiB limit unusable with numpy loaded; it is kept
as a looser backstop for shared mappings, which ``RLIMIT_DATA`` does not see.
The wall-clock timeout is enforced from outside by the pool (SIGKILL);
``RLIMIT_CPU`` is only a backstop should that ever fail.

``RLIMIT_SIGPENDING`` bounds the signals a job may have queued (``sigqueue``,
timers): the kernel counts them per uid, for every process of that uid, so a
job could otherwise use up the budget of the pool and of every other job.
Plain ``kill`` and ``raise`` are not counted against it.

``RLIMIT_NICE`` and ``RLIMIT_RTPRIO`` are 0: a job cannot raise its own
priority or take a real-time scheduling class, whatever limits the pool was
started with (a login session's limits.conf may grant both to a user's
processes, and a job would inherit them; with them, a job could starve the
machine under ``SCHED_FIFO``).

A job's ``oom_score_adj`` is 1000, from the first step of its child
(:func:`first_to_be_killed`): when its template's memory cgroup is full
(see ``cgroups.py``), or the machine's memory, the kernel kills the job first,
never the template that shares its cgroup (whose resident pages may outweigh a
job that holds its memory in a tmpfs). A job cannot lower it again: the file is
not among those Landlock lets it write.
"""

from __future__ import annotations

import math
import os
import resource
import signal

from ..errors import ConfigError

__all__ = ["ADDRESS_SPACE_HEADROOM", "MAX_QUEUED_SIGNALS", "apply_limits", "first_to_be_killed",
           "ignore_file_size_signal", "refuse_open_file_limit_below", "wanted_limits"]

ADDRESS_SPACE_HEADROOM = 1 << 30
MAX_QUEUED_SIGNALS = 64


def refuse_open_file_limit_below(needed: int) -> None:
    """A job's open-file limit is set, soft and hard, to its ``max_open_files``; no process may raise its hard
    limit above its parent's, so under a lower one every job would fail in its setup (EPERM): the pool
    refuses to start, saying what to raise."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < needed:
        raise ConfigError(f"the pool's hard limit of open files is {hard}, below the {needed} each job may hold "
                          f"(its RLIMIT_NOFILE, which no process can raise above its parent's): start the pool "
                          f"with a hard limit of at least {needed} (ulimit -Hn, or LimitNOFILE= in a systemd unit)")


def first_to_be_killed() -> None:
    """The first step of a child, before it allocates anything: from here on an OOM kill in its
    template's cgroup takes the child, never the template."""
    fd = os.open("/proc/self/oom_score_adj", os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, b"1000")
    finally:
        os.close(fd)


def apply_limits(*, memory: int, timeout: float | None, max_file_size: int | None, max_open_files: int) -> None:
    """``timeout=None`` sets no CPU backstop: a session lives through many steps, each with its own deadline."""
    if max_file_size is not None:
        ignore_file_size_signal()
    for which, soft, hard in wanted_limits(memory=memory, timeout=timeout, max_file_size=max_file_size,
                                           max_open_files=max_open_files):
        resource.setrlimit(which, (soft, hard))


def ignore_file_size_signal() -> None:
    """Ignored, SIGXFSZ becomes EFBIG: Python raises OSError instead of the process dying."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)


def wanted_limits(*, memory: int, timeout: float | None, max_file_size: int | None,
                  max_open_files: int) -> list[tuple[int, int, int]]:
    """Every limit of a job, (resource, soft, hard), in the order both confinement paths set them."""
    limits = [(resource.RLIMIT_CORE, 0, 0), (resource.RLIMIT_DATA, memory, memory),
              (resource.RLIMIT_AS, memory + ADDRESS_SPACE_HEADROOM, memory + ADDRESS_SPACE_HEADROOM)]
    if timeout is not None:
        cpu = math.ceil(timeout) + 1
        limits.append((resource.RLIMIT_CPU, cpu, cpu + 1))
    limits += [(which, value, value) for which, value in (
        (resource.RLIMIT_NOFILE, max_open_files), (resource.RLIMIT_SIGPENDING, MAX_QUEUED_SIGNALS),
        (resource.RLIMIT_NICE, 0), (resource.RLIMIT_RTPRIO, 0))]
    if max_file_size is not None:
        limits.append((resource.RLIMIT_FSIZE, max_file_size, max_file_size))
    return limits
