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
from collections.abc import Callable

__all__ = ["StatusKept", "live_usage", "proc_text"]

_CPUCLOCK_SCHED = 2  # the kernel's CPU clock of a whole process, as clock_getcpuclockid(3) builds it


def live_usage(pid: int) -> tuple[int, int | None] | None:
    """``(cpu_us, max_rss_kb)`` of a live process; ``max_rss_kb`` is None once the process has released
    its memory (it is exiting: a zombie, or about to be one). None if it is gone."""
    return _usage(pid, lambda: proc_text(f"/proc/{pid}/status"))


def _usage(pid: int, status_text: Callable[[], bytes]) -> tuple[int, int | None] | None:
    try:
        cpu_ns = time.clock_gettime_ns((~pid << 3) | _CPUCLOCK_SCHED)
        status = status_text()
        at = status.find(b"\nVmHWM:")  # found, not every line split (the file has ~55)
        peak = int(status[at + 7:status.find(b"\n", at + 1)].split()[0]) if at >= 0 else None
    except (OSError, ValueError, IndexError):
        return None
    return cpu_ns // 1000, peak


class StatusKept:
    """:func:`live_usage` of a session's process, measured after each of its steps: its status file is opened
    once and read again at offset 0 (which makes the kernel write it afresh), one system call where an open, a
    read and a close cost three, the open alone ~15 µs of a path walk into /proc. The descriptor names the
    process itself, not its number: once the process is reaped, a read fails (ESRCH), it never reads
    another's. Nor is it kept past a failed read: the process it names may be gone and another have its number
    (a pid space that wrapped), which a descriptor opened afresh measures."""

    def __init__(self) -> None:
        self._pid: int | None = None
        self._fd = -1

    def usage(self, pid: int) -> tuple[int, int | None] | None:
        status = self.text(pid)
        return None if status is None else _usage(pid, lambda: status)

    def text(self, pid: int) -> bytes | None:
        """The process's status text, through the descriptor kept for it (opened now if it was another's): a job
        handed to a child prepared ahead reads it at the hand-over (see templates._dying_by_status) and again at
        its end (:meth:`usage`), one open for both. None if it is gone."""
        if pid == self._pid:
            try:  # not contextlib.suppress: on every session step's path
                return os.pread(self._fd, 16384, 0)
            except OSError:
                pass
        self.close()
        try:
            self._fd = os.open(f"/proc/{pid}/status", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None
        self._pid = pid
        try:
            return os.pread(self._fd, 16384, 0)
        except OSError:
            return None

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
        self._fd, self._pid = -1, None


def proc_text(path: str) -> bytes:
    """A /proc file's text in one read: three system calls, where open() adds a stat, an ioctl and seeks (the
    server reads these on every job's path)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.read(fd, 16384)
    finally:
        os.close(fd)
