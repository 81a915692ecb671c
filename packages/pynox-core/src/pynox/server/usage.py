"""What a job's process used, read from the kernel: never from anything the job itself says.

A job that ended before its result is sent is measured by the template's
``wait4`` (its rusage, all threads included). A job answered as soon as its
report is complete is measured while it is stopped at its end (the child
stops itself after its report, see ``job.report.finish``, and is killed once
measured), and a session between steps while it waits for the next: its
CPU time from the process's CPU clock (every thread's run time, in
nanoseconds, those that already ended included: one system call), and its
peak resident set (``VmHWM`` of ``/proc/<pid>/status``, the figure ``wait4``
reports as ``ru_maxrss``). A process that exited on its own has no memory
left to read: its peak comes from ``wait4``, which the template is about to
report. The process is the template's unreaped child, so its pid cannot be
reused while it is read.
"""

from __future__ import annotations

import os
import time

__all__ = ["live_usage", "proc_text"]

_CPUCLOCK_SCHED = 2  # the kernel's CPU clock of a whole process, as clock_getcpuclockid(3) builds it


def live_usage(pid: int) -> tuple[int, int | None] | None:
    """``(cpu_us, max_rss_kb)`` of a live process; ``max_rss_kb`` is None once the process has released
    its memory (it is exiting: a zombie, or about to be one). None if it is gone."""
    try:
        cpu_ns = time.clock_gettime_ns((~pid << 3) | _CPUCLOCK_SCHED)
        status = proc_text(f"/proc/{pid}/status")
        at = status.find(b"\nVmHWM:")  # found, not every line split (the file has ~55)
        peak = int(status[at + 7:status.find(b"\n", at + 1)].split()[0]) if at >= 0 else None
    except (OSError, ValueError, IndexError):
        return None
    return cpu_ns // 1000, peak


def proc_text(path: str) -> bytes:
    """A /proc file's text in one read: three system calls, where open() adds a stat, an ioctl and seeks (the
    server reads these on every job's path)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.read(fd, 16384)
    finally:
        os.close(fd)
