"""``sysinfo(2)`` answered with the job's own view of the system, not the host's.

The kernel's ``sysinfo`` tells any process the host's RAM and swap, how many
tasks the whole machine runs, its load and its uptime: enough to tell hosts
apart and to watch what else runs on one. It cannot simply be refused: glibc
answers ``sysconf(_SC_PHYS_PAGES)`` and ``_SC_AVPHYS_PAGES`` from it and
ignores a failure, so a refused call gives those callers (libraries sizing
their caches from ``os.sysconf``) whatever was on the stack. So the job's
filter delegates it (``SECCOMP_RET_USER_NOTIF``) and the pool's steward
(:mod:`.steward`) writes the job's own ``struct sysinfo`` at the address the
job passed:

* ``totalram``: the job's memory limit (its ``RLIMIT_DATA``, which bounds what
  it can allocate; see :mod:`pynox.policy.limits`), ``freeram``: that limit
  minus the private memory it holds (``VmData``), in bytes (``mem_unit`` 1);
* ``procs``: the job's own threads; ``uptime``: the job's age in seconds;
* loads, swap, shared, buffer and high memory: 0.

Everything is read from ``/proc/<tid>`` (world-readable there), a few fixed-size
files: what answering costs does not depend on anything the job chose. The write
is ``process_vm_writev``, as the kernel's own ``sysinfo`` would write: it needs
the page writable to the job (it never forces a write into a read-only page, as
a debugger's write through ``/proc/<tid>/mem`` does), and fails with ``EFAULT``
on a read-only or unmapped one, so the job's ``maps`` (whose size the job
chooses: a file with a long name mapped 64,000 times is 250 MB of text) is
never read. The notification is checked valid just before the write: a valid
notification means the task that made it is alive and waiting, so its tid is
the job's; pid numbers are handed out in turn up to ``pid_max``, and cannot come
round to another process in the microseconds between the check and the write.
"""

from __future__ import annotations

import ctypes
import errno
import math
import os
import time
from collections.abc import Callable

from ..policy._libc import libc as _libc

__all__ = ["write_sysinfo"]

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
_libc.process_vm_writev.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_ulong,
                                    ctypes.c_ulong]
_libc.process_vm_writev.restype = ctypes.c_ssize_t
_ADDRESS_LIMIT = 1 << 63  # no user address is that high


class _Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


class _Sysinfo(ctypes.Structure):
    """``struct sysinfo`` of <linux/sysinfo.h>, in this architecture's C layout (the kernel writes its size)."""

    _fields_ = [("uptime", ctypes.c_long), ("loads", ctypes.c_ulong * 3), ("totalram", ctypes.c_ulong),
                ("freeram", ctypes.c_ulong), ("sharedram", ctypes.c_ulong), ("bufferram", ctypes.c_ulong),
                ("totalswap", ctypes.c_ulong), ("freeswap", ctypes.c_ulong), ("procs", ctypes.c_ushort),
                ("pad", ctypes.c_ushort), ("totalhigh", ctypes.c_ulong), ("freehigh", ctypes.c_ulong),
                ("mem_unit", ctypes.c_uint),
                ("_f", ctypes.c_char * max(0, 20 - 2 * ctypes.sizeof(ctypes.c_long) - ctypes.sizeof(ctypes.c_uint)))]


def write_sysinfo(tid: int, address: int, still_valid: Callable[[], bool]) -> bool:
    """Write the job's own ``struct sysinfo`` at ``address`` in the memory of task ``tid``. False: the caller
    is gone (``still_valid`` said so), nothing was written. Raises OSError with the errno to answer."""
    if address == 0 or address >= _ADDRESS_LIMIT:
        raise OSError(errno.EFAULT, "sysinfo: bad address")
    view = _view(tid)
    size = ctypes.sizeof(view)
    local = _Iovec(ctypes.addressof(view), size)
    remote = _Iovec(address, size)
    if not still_valid():
        return False
    written = _libc.process_vm_writev(tid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
    if written < 0:
        err = ctypes.get_errno()
        if err == errno.ESRCH:
            return False  # killed since it was checked: no one to answer
        raise OSError(errno.EFAULT if err in (errno.EFAULT, errno.EIO) else errno.EPERM, "sysinfo")
    if written != size:
        raise OSError(errno.EFAULT, "sysinfo: the buffer is not all writable")
    return True


def _view(tid: int) -> _Sysinfo:
    status = _status(tid)
    limit = _data_limit(tid)
    view = _Sysinfo()
    view.totalram = limit
    view.freeram = max(0, limit - status.get(b"VmData", 0) * 1024)  # in kB there
    view.procs = min(status.get(b"Threads", 1), 0xFFFF)
    view.uptime = _age(status.get(b"Tgid", tid))
    view.mem_unit = 1
    return view


_STATUS_FIELDS = (b"Tgid", b"VmData", b"Threads")


def _status(tid: int) -> dict[bytes, int]:
    """The few numbers of ``/proc/<tid>/status`` the view needs (a call is answered while the job waits)."""
    with open(f"/proc/{tid}/status", "rb") as status:
        text = status.read()
    found = {}
    for line in text.splitlines():
        key, _, value = line.partition(b":")
        if key in _STATUS_FIELDS:
            found[key] = int(value.split()[0])
    return found


def _data_limit(tid: int) -> int:
    """The job's soft ``RLIMIT_DATA`` (always set for a job; a job can lower it, never raise it)."""
    with open(f"/proc/{tid}/limits") as limits:
        for line in limits:
            if line.startswith("Max data size"):
                soft = line[len("Max data size"):].split()[0]
                if soft == "unlimited":
                    raise OSError(errno.EPERM, "sysinfo: the job has no memory limit")
                return min(int(soft), ctypes.c_ulong(-1).value)
    raise OSError(errno.EPERM, "sysinfo: no data limit in /proc")


def _age(pid: int) -> int:
    """Whole seconds since the process started, rounded up as the kernel rounds its uptime."""
    with open(f"/proc/{pid}/stat", "rb") as stat:
        fields = stat.read().rsplit(b")", 1)[1].split()
    started = int(fields[19]) / _CLOCK_TICKS  # starttime, field 22: clock ticks after boot
    return max(1, math.ceil(time.clock_gettime(time.CLOCK_BOOTTIME) - started))
