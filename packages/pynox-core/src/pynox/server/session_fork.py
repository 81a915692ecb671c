"""A session fork, the pool's half: what it refuses, and how it finds the copy (docs/architecture.md,
"Forking a session").

A fork is a step of the session running the pool's own code (job/session_fork.py), queued behind its steps
like a save, so it runs only between steps. Before it, the pool refuses what it cannot fork (the reasons
below), registers the copy under its name (max_sessions, the tenant's limits: the copy is a session), and
arms the steward's gate for the step's two forks (fork_gate.py). After it, the copy says its pid on its own
control channel; the pool trusts none of that: the pid must name a process (its tgid is its pid) whose parent
is the session's template, and that process must be stopped, before it is put in cgroups of its own and
adopted by the template (``Template.adopt``).
"""

from __future__ import annotations

import os
import signal
import socket
import time

from ..wire.spec import JobSpec
from ..wire.state import FORK_PID as PID
from .fork_gate import process_facts

__all__ = ["await_copy", "check_filters", "kill_children", "refusal", "shared_memory"]

_STOPPED_EVERY = 0.0005  # seconds between two looks at whether the copy has stopped itself


def refusal(spec: JobSpec, pid: int | None) -> str | None:
    """Why the session with ``spec``, its process ``pid`` (None: it has none), cannot be forked; None if it can."""
    if pid is None:
        return "fork: the session has no process (run a step first, or its process ended)"
    if spec.scratch is not None:
        return ("fork: a session with a scratch directory cannot be forked: Landlock's rules are inherited, so "
                "the copy would keep the right to write in the original's directory, and the pool cannot give it "
                "one of its own (save and restore the state into a new session instead)")
    if spec.pip_dir is not None:
        return ("fork: a session opened with pip_install cannot be forked: the copy would share the original's "
                "package directory")
    try:
        tasks = len(os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return "fork: the session's process ended"
    if tasks > 1:
        return (f"fork: the session left {tasks - 1} threads running; a fork copies only the calling thread, so "
                "the copy could hang on a lock another one held: end them, or fork before starting them")
    return shared_memory(pid)


# A shared mapping of no file on disk: mmap(MAP_SHARED | MAP_ANONYMOUS), System V or memfd memory.
_ANONYMOUS_SHARED = (b"/dev/zero", b"/SYSV", b"/memfd:")


def shared_memory(pid: int) -> str | None:
    """Why process ``pid`` may not be (or become) a fork's copy: it maps memory shared with another process
    that it can write, or anonymous shared memory (``mprotect`` can make that writable). A copy would share
    those pages with its original: charged to the original's cgroup, they go to its parent's once the original
    closes, and the copy holds them beyond its own limit (a chain of forks would hold any amount up to
    RLIMIT_AS). None if it maps none (a read-only mapping of a file, as glibc's gconv cache, is fine)."""
    try:
        with open(f"/proc/{pid}/maps", "rb") as maps:
            lines = maps.read().splitlines()
    except OSError:
        return "fork: the session's process ended"
    held = 0
    for line in lines:
        fields = line.split(maxsplit=5)
        if len(fields) < 5 or fields[1][3:4] != b"s":
            continue
        path = fields[5].strip() if len(fields) == 6 else b""
        if fields[1][1:2] == b"w" or path.startswith(_ANONYMOUS_SHARED) or path.startswith(b"/dev/shm/"):
            start, end = (int(bound, 16) for bound in fields[0].split(b"-"))
            held += end - start
    if held:
        return (f"fork: the session maps {held >> 10} KiB of shared memory (mmap MAP_SHARED): the copy would hold "
                "it outside its own memory limit; unmap it (close the mmap) before the fork")
    return None


def kill_children(pid: int) -> list[int]:
    """Kill every child of the session's process ``pid`` (its fork step's C1, should the job's code have kept it
    alive: the window is closed by then, so none is made meanwhile); the pids killed. Such a child is the
    process's to reap, and the process is stopped: its pid names it until then."""
    killed: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return killed
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children") as listing:
                children = [int(word) for word in listing.read().split()]
        except (OSError, ValueError):
            continue
        for child in children:
            try:
                os.kill(child, signal.SIGKILL)
            except OSError:
                continue
            killed.append(child)
    return killed


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0].decode()
    except (OSError, IndexError, UnicodeDecodeError):
        return "?"


def _filters(pid: int) -> int | None:
    """How many seccomp filters the process has (``Seccomp_filters`` in its status; None if not shown)."""
    try:
        with open(f"/proc/{pid}/status", "rb") as status:
            for line in status:
                if line.startswith(b"Seccomp_filters:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def await_copy(control: socket.socket, template: int, within: float) -> int:
    """The copy's pid, once it said it on ``control`` and is checked from ``/proc``: a process, a child of
    ``template``, stopped. ``ValueError`` saying what is wrong otherwise (it never arrived, or is not that)."""
    deadline = time.monotonic() + within
    said = b""
    while len(said) < PID.size:
        control.settimeout(max(deadline - time.monotonic(), 0.001))
        try:
            chunk = control.recv(PID.size - len(said))
        except TimeoutError:
            raise ValueError("the copy did not say its pid in time") from None
        except OSError as exc:
            raise ValueError(f"the copy's control channel failed ({exc})") from None
        if not chunk:
            raise ValueError("the copy ended before it said its pid")
        said += chunk
    control.settimeout(None)
    pid: int = PID.unpack(said)[0]
    if pid <= 1 or process_facts(pid) != (pid, template):
        raise ValueError(f"pid {pid} is not a process of the session's template")
    while _state(pid) != "T":
        if time.monotonic() > deadline:
            raise ValueError(f"the copy did not stop in time (state {_state(pid)})")
        if process_facts(pid) != (pid, template):
            raise ValueError("the copy ended before it stopped")
        time.sleep(_STOPPED_EVERY)
    return pid


def check_filters(pid: int, original: int) -> None:
    """ValueError unless the copy ``pid`` has one seccomp filter more than ``original``: its own-process
    filter (see job/session_fork.py; the count is all ``/proc`` shows)."""
    before, after = _filters(original), _filters(pid)
    if before is None or after != before + 1:
        raise ValueError(f"the copy has {after} seccomp filters where the original has {before}: it did not "
                         "stack its own-process filter (or this kernel does not show Seccomp_filters)")
