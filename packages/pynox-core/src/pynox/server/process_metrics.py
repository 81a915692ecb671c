"""The pool process's own ``process_*`` metrics, under the names Prometheus' client libraries give them.

Read from ``/proc/self`` at each scrape (a few system calls, on the metrics thread): the pool's resident
and virtual memory, open descriptors and their limit, CPU seconds and start time. The templates and jobs are
processes of their own and are not counted here; their memory is bounded per job (see policy/).
"""

from __future__ import annotations

import os
import resource

__all__ = ["process_metrics"]

_PAGE = os.sysconf("SC_PAGE_SIZE")
_TICKS = os.sysconf("SC_CLK_TCK")


def _boot_time() -> float:
    with open("/proc/stat", "rb") as stat:
        for line in stat:
            if line.startswith(b"btime "):
                return float(line.split()[1])
    return 0.0  # pragma: no cover - every Linux /proc/stat has btime


_BOOT = _boot_time()


def process_metrics() -> bytes:
    """The ``process_*`` families in the text exposition format, each with its HELP and TYPE."""
    with open("/proc/self/statm", "rb") as statm:
        size, resident = (int(field) for field in statm.read().split()[:2])
    with open("/proc/self/stat", "rb") as stat:
        # The command name (field 2) may hold spaces and parentheses: the fields after it follow the last ")".
        fields = stat.read().rsplit(b")", 1)[1].split()
    start = _BOOT + int(fields[19]) / _TICKS  # field 22, starttime, in clock ticks since boot
    times = os.times()
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    rows = [
        ("process_cpu_seconds_total", "counter", "User and system CPU time the pool process spent, in seconds.",
         times.user + times.system),
        ("process_resident_memory_bytes", "gauge", "Resident memory of the pool process, in bytes.", resident * _PAGE),
        ("process_virtual_memory_bytes", "gauge", "Virtual memory of the pool process, in bytes.", size * _PAGE),
        ("process_open_fds", "gauge", "Descriptors the pool process holds open.", len(os.listdir("/proc/self/fd"))),
        ("process_max_fds", "gauge", "The pool process's limit on open descriptors.", soft),
        ("process_start_time_seconds", "gauge", "When the pool process started, in seconds since the epoch.", start),
    ]
    lines = []
    for name, kind, help_text, value in rows:
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", f"{name} {value}"]
    return ("\n".join(lines) + "\n").encode()
