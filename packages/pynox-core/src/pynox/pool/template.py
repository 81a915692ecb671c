"""The template: a clean, warm interpreter that forks one confined child per job.

Started by exec with a scrubbed environment (every job inherits this
process's memory and its ``/proc/self/environ``, so nothing secret may ever be
in it). It preloads the operator's modules, proves it is single-threaded and
holds only its expected descriptors, prepares the policy once, then serves
jobs one at a time: fork, hand the child's pidfd to the server, reap, report.

A job arrives as its :class:`~pynox.job.Confinement` with descriptors: the
job's own (the payload among them, which the template never reads) and one
per granted path, opened by the server when the job started. After a job,
the template confines a child ahead for the next one with the same
confinement and the same grant descriptors; it serves the next job only if
that job's confinement is identical and its grants name the very same files.

Run as ``python -I -c ... <socket fd>`` by :mod:`pynox.pool.worker`.
"""

from __future__ import annotations

import collections
import ctypes
import gc
import importlib
import os
import platform
import signal
import socket
import sys
import threading

import msgspec

from ..errors import KernelSupportError
from ..policy import Runtime, prepare_runtime, reset_environment
from ..policy.grants import close_all, identity
from ..policy.privileges import set_parent_death_signal, set_process_name
from .child import run_job, run_prepared
from .descriptors import sent_with_job
from .frames import Ended, Init, Ready, Started, TemplateFailed, confinement_decoder, init_decoder, recv_raw, send_frame

__all__ = ["main"]


def main() -> None:
    sock = socket.socket(fileno=int(sys.argv[1]))
    # Ctrl-C reaches the whole process group; the server decides how the pool ends, not us.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    set_parent_death_signal(signal.SIGKILL)
    set_process_name("pynox-template")
    if os.getppid() == 1:  # the server died before we could arm the death signal
        os._exit(1)
    try:
        payload, _ = recv_raw(sock)
    except EOFError:
        return
    init = init_decoder.decode(payload)
    try:
        runtime = _warm_up(init, sock.fileno())
    except KernelSupportError as exc:
        send_frame(sock, TemplateFailed(message=str(exc), kind="kernel"))
        return
    except Exception as exc:
        send_frame(sock, TemplateFailed(message=str(exc)))
        return
    send_frame(sock, Ready(python=platform.python_version(), pid=os.getpid(), preloaded=init.preload,
                           landlock_abi=runtime.landlock_abi, read_paths=list(runtime.read_paths),
                           seccomp_unknown=sorted({n for f in runtime.filters.values() for n in f.compiled.unknown})))
    _serve(sock, runtime)


def _warm_up(init: Init, sock_fd: int) -> Runtime:
    sys.path.extend(d for d in init.package_dirs if d not in sys.path)
    for module in init.preload:
        try:
            importlib.import_module(module)
        except Exception as exc:
            raise RuntimeError(f"preloading {module!r} failed: {type(exc).__name__}: {exc}") from None
    _prove_single_threaded(init.preload)
    _prove_descriptors({0, 1, 2, sock_fd}, init.preload)
    runtime = prepare_runtime(tuple(init.package_dirs), tuple(init.data_dirs))
    # Preloads have read their BLAS settings; from here on the environment is what every job starts from.
    reset_environment(init.job_env)
    _behave_as_a_normal_interpreter()
    # Children inherit the heap: objects frozen here are never scanned by a child's collector.
    gc.collect()
    gc.freeze()
    return runtime


def _behave_as_a_normal_interpreter() -> None:
    """The template was started with -I so that nothing of the host's environment shaped it; its jobs
    are ordinary interpreters: the environment a job is given (PYTHONBREAKPOINT, PYTHONASYNCIODEBUG...)
    works as it does outside. The environment is already the jobs' base, so nothing of the host's is
    read from here on."""
    ctypes.c_int.in_dll(ctypes.pythonapi, "Py_IgnoreEnvironmentFlag").value = 0
    ctypes.c_int.in_dll(ctypes.pythonapi, "Py_IsolatedFlag").value = 0
    # sys.flags cannot be instantiated: the same fields, in the same order, as a named tuple.
    names = [name for name in _FLAGS if hasattr(sys.flags, name)]
    values = {name: getattr(sys.flags, name) for name in names} | {"ignore_environment": 0, "isolated": 0,
                                                                   "safe_path": False}
    sys.flags = collections.namedtuple("flags", names)(**values)  # type: ignore[assignment]  # a lookalike


_FLAGS = ("debug", "inspect", "interactive", "optimize", "dont_write_bytecode", "no_user_site", "no_site",
          "ignore_environment", "verbose", "bytes_warning", "quiet", "hash_randomization", "isolated", "dev_mode",
          "utf8_mode", "warn_default_encoding", "safe_path", "int_max_str_digits")


def _prove_single_threaded(preload: list[str]) -> None:
    # fork() copies only the calling thread: a lock held by another one would deadlock a child.
    tasks = os.listdir("/proc/self/task")
    if len(tasks) != 1 or threading.active_count() != 1:
        names = [t.name for t in threading.enumerate() if t is not threading.main_thread()]
        raise RuntimeError(f"the template must stay single-threaded, but after preloading {preload} it runs "
                           f"{len(tasks)} threads {names or ''}: remove the module that starts them")


def _prove_descriptors(expected: set[int], preload: list[str]) -> None:
    listing = os.open("/proc/self/fd", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        listed = {int(fd) for fd in os.listdir(listing)} - expected - {listing}
    finally:
        os.close(listing)
    # listdir works on a duplicate of `listing`, closed by now: keep only descriptors still open.
    extra = sorted(fd for fd in listed if _is_open(fd))
    if extra:
        targets = []
        for fd in extra:
            try:
                targets.append(f"{fd} -> {os.readlink(f'/proc/self/fd/{fd}')}")
            except OSError:
                targets.append(str(fd))
        raise RuntimeError(f"after preloading {preload} the template holds unexpected descriptors "
                           f"({', '.join(targets)}): jobs would inherit them")


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


class _Job:
    """One job as the template received it: its confinement, its own descriptors, its grant descriptors."""

    def __init__(self, raw: bytes, fds: list[int]) -> None:
        self.confinement = confinement_decoder.decode(raw)
        own = len(sent_with_job(self.confinement.host_channel, self.confinement.session))
        self.fds, self.grants = fds[:own], fds[own:]
        # What a prepared child must match: the same confinement, grants naming the same files.
        self.key = (raw, identity(self.grants))


class _Prepared:
    """A child forked and confined ahead of the next job, with the confinement and grant descriptors of
    the last one. It owns those descriptors while it waits: they keep the granted inodes alive, so the
    identity it is matched by cannot be taken by another file."""

    def __init__(self, job: _Job, runtime: Runtime) -> None:
        self.key = job.key
        self.grants = job.grants
        self.control, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.pid = os.fork()
        if self.pid == 0:
            run_prepared(job.confinement, runtime, child_end.fileno(), self.grants)
        child_end.close()
        self.reaped = False

    def hand_over(self, job: _Job) -> bool:
        """Give the job's own descriptors to this child; False if it cannot take them (it died, and is
        then reaped)."""
        try:
            send_frame(self.control, _HandOver(), job.fds)
        except OSError:
            self.discard()
            return False
        finally:
            self.control.close()
        return True

    def discard(self) -> None:
        """Kill and reap the child, once: a failed hand-over has already done it, and once reaped, the pid
        may belong to another process."""
        self.control.close()
        if self.reaped:
            return
        self.reaped = True
        try:
            os.kill(self.pid, signal.SIGKILL)  # still our unreaped child: the pid cannot have been reused
            os.waitpid(self.pid, 0)
        except ChildProcessError:
            pass

    def release(self) -> None:
        close_all(self.grants)


class _HandOver(msgspec.Struct, tag=True):
    """The template's word to a prepared child: your job's descriptors are attached."""


def _serve(sock: socket.socket, runtime: Runtime) -> None:
    prepared: _Prepared | None = None
    try:
        while True:
            try:
                raw, fds = recv_raw(sock)
            except EOFError:
                return
            job = _Job(raw, fds)
            pid = None
            if prepared is not None:
                if not job.confinement.session and prepared.key == job.key and prepared.hand_over(job):
                    pid = prepared.pid
                else:
                    prepared.discard()
                prepared.release()
                prepared = None
            if pid is None:
                _refresh(runtime)
                pid = os.fork()
                if pid == 0:
                    signal.signal(signal.SIGINT, signal.default_int_handler)
                    run_job(job.confinement, runtime, job.fds, job.grants)
            close_all(job.fds)  # the child has them; the payload among them was never read here
            if not _report_start(sock, pid) or not _report_end(sock, pid):
                close_all(job.grants)
                return
            # The next job most likely has the same confinement (one tool, one profile): confine a child
            # for it now, while the result travels and the agent thinks. Not while this job runs: on two
            # cores the preparation would take the CPU the job and the server need.
            if job.confinement.session:
                close_all(job.grants)
            else:
                _refresh(runtime)
                prepared = _Prepared(job, runtime)
    finally:
        if prepared is not None:
            prepared.discard()
            prepared.release()


def _refresh(runtime: Runtime) -> None:
    """Reopen runtime rules whose path names another file now (see RuntimeRules), before a fork."""
    runtime.rules.refresh()
    runtime.network_rules.refresh()


def _report_start(sock: socket.socket, pid: int) -> bool:
    """Hand the child's pidfd to the server (for SIGKILL at its deadline). False if the server is gone."""
    pidfd = os.pidfd_open(pid)
    try:
        send_frame(sock, Started(pid=pid), [pidfd])
    except (BrokenPipeError, ConnectionResetError):
        return False  # the server closed our socket: we are being stopped
    finally:
        os.close(pidfd)
    return True


def _report_end(sock: socket.socket, pid: int) -> bool:
    """Reap the child and say how it ended. False if the server is gone."""
    _, status, usage = os.wait4(pid, 0)
    try:
        send_frame(sock, Ended(status=status, cpu_us=int((usage.ru_utime + usage.ru_stime) * 1e6),
                               max_rss_kb=usage.ru_maxrss))
    except (BrokenPipeError, ConnectionResetError):
        return False
    return True


if __name__ == "__main__":
    main()
