"""The paths a confined CPython needs to start, import and format text, granted read-only to every job.

Computed once in the template, after preloading, from the live interpreter: its
prefixes, every ``sys.path`` entry, the shared libraries it links, locale,
time zone and certificate data. Nothing here is writable by a job, and a write
grant that overlaps any of these paths is refused, so a job can never change
the code the next job imports.
"""

from __future__ import annotations

import os
import site
import sys
from collections.abc import Iterable

from ..paths import beneath

__all__ = [
    "DEVICE_READ", "DEVICE_WRITE", "NETWORK_FILES", "OWN_PROC_DIRECTORIES", "OWN_PROC_ENTRIES",
    "runtime_paths",
]

_SYSTEM = (
    "/lib", "/lib64", "/lib32", "/usr/lib", "/usr/lib64", "/usr/lib32", "/usr/local/lib",
    "/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d",
    "/usr/share/locale", "/usr/lib/locale", "/etc/locale.alias",
    "/usr/share/zoneinfo", "/etc/localtime", "/etc/timezone",
    "/etc/ssl", "/etc/pki", "/etc/ca-certificates", "/usr/share/ca-certificates",
    "/sys/devices/system/cpu",  # BLAS libraries size their thread pools from it
)
DEVICE_READ = ("/dev/zero", "/dev/urandom", "/dev/random", "/dev/full")
DEVICE_WRITE = ("/dev/null",)
# What a job may read of its own /proc/<pid>: its memory, maps, status, limits, descriptors, command
# line, environment. Not the whole directory: net/ lists the host's listening ports, unix socket paths,
# routes and neighbours; mountinfo and cgroup show the host's mount table and cgroup path; task/ holds
# all of that again per thread.
# Each is a rule a child adds while it is confined, on the way of the next job when jobs come back to back:
# the list is what Python and its usual libraries (psutil, resource reports) read, and no more.
OWN_PROC_ENTRIES = ("stat", "statm", "status", "maps", "mem", "fd", "limits", "cmdline", "comm", "environ")
OWN_PROC_DIRECTORIES = ("fd",)
# Name resolution; granted only with the network.
NETWORK_FILES = ("/etc/resolv.conf", "/etc/hosts", "/etc/nsswitch.conf", "/etc/gai.conf",
                 "/etc/host.conf", "/etc/services", "/etc/protocols")


def _python_paths(package_dirs: Iterable[str]) -> list[str]:
    paths = {sys.base_prefix, sys.prefix, sys.exec_prefix, sys.base_exec_prefix}
    paths.update(site.getsitepackages())
    paths.update(entry for entry in sys.path if entry)
    paths.update(package_dirs)
    return sorted(paths)


def runtime_paths(package_dirs: Iterable[str] = (), data_dirs: Iterable[str] = ()) -> list[str]:
    """Existing runtime paths, each also by its resolved name (Landlock rules attach to inodes).
    ``data_dirs``: what the runtime's libraries read in every job (matplotlib's prepared font cache)."""
    found: set[str] = set()
    for path in (*_python_paths(package_dirs), *_SYSTEM, *data_dirs):
        if os.path.exists(path):
            found.add(os.path.abspath(path))
            found.add(os.path.realpath(path))
    # A child of another listed path adds nothing to the read grant; keep the list short.
    return _minimal(found)


def _minimal(paths: Iterable[str]) -> list[str]:
    result: list[str] = []
    for path in sorted(paths):
        if not any(beneath(path, kept) for kept in result):
            result.append(path)
    return result
