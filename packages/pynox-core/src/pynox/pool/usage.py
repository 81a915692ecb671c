"""What a job's process used, read from the kernel: never from anything the job itself says.

A job that ended before its result is sent is measured by the template's
``wait4`` (its rusage, all threads included). A job answered as soon as its
report is complete is measured from ``/proc`` while it is stopped at its end
(the child stops itself after its report, see ``child._finish``, and is killed
once measured), and a session between steps while it waits for the next: each
live thread's run time (``schedstat``, nanoseconds), or the group's
tick-counted time when that is larger (threads that already ended), and the
peak resident set (``VmHWM``, the figure ``wait4`` reports as ``ru_maxrss``).
A process that exited on its own has no memory left to read: its peak comes
from ``wait4``, which the template is about to report. The process is the
template's unreaped child, so its pid cannot be reused while it is read.
"""

from __future__ import annotations

import os

__all__ = ["live_usage"]

_TICK_US = 1_000_000 // os.sysconf("SC_CLK_TCK")


def live_usage(pid: int) -> tuple[int, int | None] | None:
    """``(cpu_us, max_rss_kb)`` of a live process; ``max_rss_kb`` is None once the process has released
    its memory (it is exiting: a zombie, or about to be one). None if it is gone."""
    base = f"/proc/{pid}"
    try:
        # Fields after the command (which may hold spaces and parentheses): utime is the 12th, stime the 13th.
        fields = _read(f"{base}/stat").rpartition(b")")[2].split()
        ticks_us = (int(fields[11]) + int(fields[12])) * _TICK_US
        peak = next((line for line in _read(f"{base}/status").splitlines() if line.startswith(b"VmHWM:")), None)
        # The usual job has one thread: its own schedstat is the process's (num_threads is the 20th field).
        threads = [str(pid)] if fields[17] == b"1" else os.listdir(f"{base}/task")
    except (OSError, ValueError, IndexError):
        return None
    run_ns = 0
    for tid in threads:
        try:
            run_ns += int(_read(f"{base}/task/{tid}/schedstat").split()[0])
        except (OSError, ValueError, IndexError):
            continue  # the thread ended meanwhile: the group's ticks count it
    return max(run_ns // 1000, ticks_us), int(peak.split()[1]) if peak is not None else None


def _read(path: str) -> bytes:
    """A /proc file's text in one read: three system calls, where open() adds a stat, an ioctl and seeks (this
    runs once per job, on its result's path)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.read(fd, 16384)
    finally:
        os.close(fd)
