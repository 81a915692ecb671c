"""The one reader of ``/proc``: a process's facts as the kernel shows them to anyone, and the machine's.

It imports nothing of Pynox: it judges the product from outside. ``pid`` is a number or ``"self"``. A
process may end while it is read: the callers that list processes pass over an ``OSError``; a reader of
one named process lets it rise.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

Pid = int | str

ROOT = "/proc"


def path(pid: Pid, *entry: str) -> str:
    """The ``/proc`` path of ``pid``'s ``entry`` (``path(42, "fd", "3")`` is ``/proc/42/fd/3``)."""
    return "/".join((ROOT, str(pid), *entry))


def read(pid: Pid, entry: str) -> str:
    """The text of one of ``pid``'s entries (``status``, ``limits``, ``cgroup``, ``wchan``, ``mountinfo``...)."""
    with open(path(pid, entry)) as handle:
        return handle.read()


def read_bytes(pid: Pid, entry: str) -> bytes:
    with open(path(pid, entry), "rb") as handle:
        return handle.read()


def machine(entry: str) -> str:
    """The text of a machine-wide entry: ``mounts``, ``net/tcp``, ``net/sockstat``, ``sys/kernel/...``."""
    with open(f"{ROOT}/{entry}") as handle:
        return handle.read()


def exists(pid: Pid) -> bool:
    return os.path.exists(path(pid))


def started(pid: Pid) -> float:
    """About when ``pid`` started: the modification time of its ``/proc`` directory."""
    return os.stat(path(pid)).st_mtime


def pids() -> list[int]:
    """Every process visible in ``/proc`` now."""
    return [int(entry) for entry in os.listdir(ROOT) if entry.isdigit()]


class Stat(NamedTuple):
    """``/proc/<pid>/stat``: the command name (between the parentheses, which may hold anything) and the
    fields after it, numbered as proc(5) numbers them from the state (``fields[0]``, field 3)."""

    comm: str
    fields: list[str]

    @property
    def state(self) -> str:
        return self.fields[0]

    @property
    def ppid(self) -> int:
        return int(self.fields[1])

    @property
    def minor_faults(self) -> int:
        """Page faults served without I/O, copy-on-write among them (field 10)."""
        return int(self.fields[7])

    @property
    def cpu_ticks(self) -> int:
        """User and system time, in clock ticks (fields 14 and 15)."""
        return int(self.fields[11]) + int(self.fields[12])

    @property
    def start(self) -> int:
        """The start time, in clock ticks after boot (field 22)."""
        return int(self.fields[19])


def stat(pid: Pid) -> Stat:
    raw = read_bytes(pid, "stat").decode("utf-8", "replace")
    return Stat(raw[raw.index("(") + 1 : raw.rindex(")")], raw[raw.rindex(")") + 2 :].split())


def status(pid: Pid) -> dict[str, str]:
    """``/proc/<pid>/status`` as name -> value (``"VmRSS"`` -> ``"1234 kB"``)."""
    fields: dict[str, str] = {}
    for line in read(pid, "status").splitlines():
        name, _, value = line.partition(":")
        fields[name] = value.strip()
    return fields


def status_number(pid: Pid, name: str) -> int:
    """A number of ``/proc/<pid>/status`` (``VmRSS`` in kB, ``Threads``...)."""
    value = status(pid).get(name)
    if value is None:
        raise AssertionError(f"no {name} for {pid}")
    return int(value.split()[0])


def cmdline(pid: Pid) -> list[str]:
    return read_bytes(pid, "cmdline").decode("utf-8", "replace").split("\0")[:-1]


def fds(pid: Pid) -> list[int]:
    """The descriptors ``pid`` holds open."""
    return [int(fd) for fd in os.listdir(path(pid, "fd"))]


def fd_targets(pid: Pid) -> dict[int, str]:
    """fd -> what it is (``pipe:[N]``, ``socket:[N]``, ``anon_inode:[pidfd]``, a path); one closed while it is
    read is left out."""
    targets: dict[int, str] = {}
    for fd in fds(pid):
        try:
            targets[fd] = os.readlink(path(pid, "fd", str(fd)))
        except OSError:
            continue  # closed while we looked
    return targets


def pidfd_targets(pid: Pid) -> dict[int, int]:
    """fd -> the pid each pidfd ``pid`` holds points at (``Pid:`` of its fdinfo; -1 once that process is reaped)."""
    found: dict[int, int] = {}
    for fd, target in fd_targets(pid).items():
        if target != "anon_inode:[pidfd]":
            continue
        try:
            info = read(pid, f"fdinfo/{fd}")
        except OSError:
            continue  # closed while we looked
        for line in info.splitlines():
            if line.startswith("Pid:"):
                found[fd] = int(line.split()[1])
    return found


def tasks(pid: Pid) -> list[int]:
    """The threads of ``pid``."""
    return [int(task) for task in os.listdir(path(pid, "task"))]


def statm_pages(pid: Pid) -> list[int]:
    return [int(pages) for pages in read(pid, "statm").split()]


def listing() -> Path:
    """``/proc`` itself, for a caller that walks its entries."""
    return Path(ROOT)
