"""A bound on the threads of a job: one pids cgroup per template.

Every thread takes a pid from the machine's pid space (``pid_max``, 32768 by
default), and a job's threads cost it only their stacks: a 1 GiB job can hold
about 20,000 of them, two such jobs the whole machine. ``RLIMIT_NPROC`` would
bound them, but the kernel never applies it to uid 0, and a pool run as root
runs its jobs as uid 0 unless ``run_as`` says otherwise.

So the server puts each template in a cgroup of its own whose ``pids.max``
is the template itself plus :data:`MAX_JOB_TASKS`: a template serves one job
at a time, and the child it prepares ahead only exists between jobs. A job
that reaches the bound gets ``EAGAIN`` from ``clone``, which Python reports as
``RuntimeError: can't start new thread`` (with a hint, see ``hints.py``). A job
cannot leave its cgroup: Landlock gives it no access to the cgroup files.

Both cgroup versions work: the v1 ``pids`` hierarchy, or v2 when the pool's
own cgroup may have children with the ``pids`` controller (the root cgroup,
or a delegated one). Where neither is available, :func:`detect` says why and
threads are bounded only by memory; ``pynox check`` reports which it is.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import functools
import os
import time
from dataclasses import dataclass

__all__ = ["MAX_JOB_TASKS", "TaskLimit", "available", "detect", "remove"]

MAX_JOB_TASKS = 256  # threads of one job, its main thread included
_CGROUP_ROOT = "/sys/fs/cgroup"
_REMOVE_WAIT = 2.0  # seconds a cgroup may take to empty after its processes were killed
_cleaned_at_exit: set[str] = set()


@dataclass(frozen=True)
class TaskLimit:
    """Where this pool's cgroups go: ``base`` is a directory of the pids hierarchy we may create in."""

    base: str
    version: int

    def describe(self) -> str:
        return f"pids cgroup v{self.version} under {self.base}: at most {MAX_JOB_TASKS} threads per job"

    def pool_directory(self) -> str:
        return os.path.join(self.base, f"pynox-{os.getpid()}")

    def make_pool_directory(self) -> str:
        """This pool's cgroup, holding its templates' (with the pids controller for them, on v2)."""
        pool = self.pool_directory()
        with contextlib.suppress(FileExistsError):
            os.mkdir(pool)
            if self.version == 2:
                _write(os.path.join(pool, "cgroup.subtree_control"), "+pids")
        return pool

    def confine_template(self, pid: int, name: str) -> str:
        """Put process ``pid`` (a template, before it forks anything) in a new cgroup; returns its path."""
        pool = self.make_pool_directory()
        if pool not in _cleaned_at_exit:
            _cleaned_at_exit.add(pool)
            atexit.register(remove_pool, self)
        path = os.path.join(pool, name)
        os.mkdir(path)
        try:
            _write(os.path.join(path, "pids.max"), str(MAX_JOB_TASKS + 1))
            _write(os.path.join(path, "cgroup.procs"), str(pid))
        except BaseException:
            remove(path)
            raise
        return path


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


def remove_pool(limit: TaskLimit) -> None:
    """At the pool's end: remove every cgroup it made (their processes are gone or going)."""
    pool = limit.pool_directory()
    try:
        names = [entry.path for entry in os.scandir(pool) if entry.is_dir()]
    except FileNotFoundError:
        return
    for path in names:
        remove(path, _REMOVE_WAIT)
    remove(pool, _REMOVE_WAIT)


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


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


def detect() -> tuple[TaskLimit | None, str]:
    """The mechanism that can bound a job's threads here, or None and why not."""
    try:
        own, mounts = _own_cgroups(), _mounts()
    except OSError as exc:
        return None, f"cannot read this process's cgroups: {exc}"
    if "pids" in own:
        for point, kind, options in mounts:
            if kind == "cgroup" and "pids" in options.split(","):
                return _usable(TaskLimit(os.path.normpath(os.path.join(point, own["pids"].lstrip("/"))), 1))
    if "" in own:
        for point, kind, _ in mounts:
            if kind == "cgroup2":
                base = os.path.normpath(os.path.join(point, own[""].lstrip("/")))
                try:
                    with open(os.path.join(base, "cgroup.controllers")) as controllers:
                        if "pids" not in controllers.read().split():
                            return None, f"the pids controller is not available in {base}"
                except OSError as exc:
                    return None, f"cannot read {base}/cgroup.controllers: {exc}"
                return _usable(TaskLimit(base, 2))
    return None, "no pids cgroup controller is mounted"


@functools.cache
def available() -> tuple[TaskLimit | None, str]:
    """:func:`detect`, once per process, after removing what pools that died without cleaning left."""
    limit, reason = detect()
    if limit is not None:
        _sweep(limit.base)
    return limit, reason


def _sweep(base: str) -> None:
    for entry in os.scandir(base):
        name = entry.name
        if not (name.startswith("pynox-") and name[6:].isdigit() and entry.is_dir()):
            continue
        pid = int(name[6:])
        if pid == os.getpid() or os.path.exists(f"/proc/{pid}"):
            continue
        for leaf in os.scandir(entry.path):
            if leaf.is_dir():
                remove(leaf.path)
        remove(entry.path)


def _usable(limit: TaskLimit) -> tuple[TaskLimit | None, str]:
    """Try it: make this pool's directory and one cgroup in it, with a limit, holding nobody."""
    probe = os.path.join(limit.pool_directory(), "probe")
    try:
        os.mkdir(os.path.join(limit.make_pool_directory(), "probe"))
        _write(os.path.join(probe, "pids.max"), str(MAX_JOB_TASKS + 1))
    except OSError as exc:
        remove(probe)
        remove(limit.pool_directory())
        return None, f"cannot create a pids cgroup under {limit.base}: {exc}"
    remove(probe)
    return limit, limit.describe()
