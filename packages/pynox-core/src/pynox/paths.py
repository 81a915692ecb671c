"""How paths relate: ``beneath`` (by whole components), ``overlapping``, and where the kernel keeps its settings.

Rules on absolute, normalised paths, used by the request's resolution and
ceiling (``grants``), the runtime list (``policy.runtime``), the hints and a
tool made in the host application, which must not load the kernel policy to
check a grant.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["KERNEL_FILESYSTEMS", "beneath", "kernel_mounts", "mounts", "overlapping"]


def beneath(path: str, parent: str) -> bool:
    """Equal, or a proper descendant by whole components (``/a/bc`` is not beneath ``/a/b``)."""
    return path == parent or path.startswith(parent.rstrip("/") + "/")


def overlapping(path: str, paths: Iterable[str]) -> str | None:
    """The entry of ``paths`` that ``path`` (already resolved) lies beneath or contains, if any."""
    for entry in paths:
        if beneath(path, entry) or beneath(entry, path):
            return entry
    return None


# Filesystems whose files are the kernel's own settings: a process's cgroup limits and membership
# (cgroup, cgroup2), its OOM score and its memory (proc), kernel and device tunables (sysfs, debugfs,
# tracefs, securityfs, configfs, bpf, pstore, efivarfs, binfmt_misc, fusectl). A job of a root pool is uid 0
# without capabilities, and uid 0 owns root's 0644 files there: a write grant over one would let the job
# raise its own memory and thread bounds, or leave its cgroup (seen: memory="64m" held 200 MiB).
KERNEL_FILESYSTEMS = frozenset({"proc", "sysfs", "cgroup", "cgroup2", "debugfs", "tracefs", "securityfs", "configfs",
                                "bpf", "pstore", "efivarfs", "binfmt_misc", "fusectl"})


def kernel_mounts(mountinfo: str = "/proc/self/mountinfo") -> list[str]:
    """Where this process sees a :data:`KERNEL_FILESYSTEMS` mount (read each time: mounts come and go)."""
    return [point for _, point, kind in mounts(mountinfo) if kind in KERNEL_FILESYSTEMS]


def mounts(mountinfo: str = "/proc/self/mountinfo") -> list[tuple[int, str, str]]:
    """(mount id, mount point, filesystem type) of every mount this process sees."""
    found: list[tuple[int, str, str]] = []
    with open(mountinfo) as lines:
        for line in lines:
            mount, _, filesystem = line.partition(" - ")  # "ID PARENT DEV ROOT POINT ... - TYPE SOURCE ..."
            fields, kind = mount.split(), filesystem.split()[:1]
            if len(fields) >= 5 and kind and fields[0].isdigit():
                # The kernel writes a space, tab, newline or backslash of a mount point as an octal escape.
                found.append((int(fields[0]), fields[4].encode().decode("unicode_escape"), kind[0]))
    return found
