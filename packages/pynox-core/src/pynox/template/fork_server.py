"""The template: a clean, warm interpreter that forks one confined child per job.

Started by exec with a scrubbed environment (every job inherits this
process's memory and its ``/proc/self/environ``, so nothing secret may ever be
in it). It preloads the operator's modules, proves it is single-threaded and
holds only its expected descriptors, prepares the policy once, then serves
jobs one at a time: fork, hand the child's pidfd to the server, reap, report.

A job arrives as a :class:`~pynox.wire.frames.Fork` frame with descriptors:
the job's own (the payload among them, which the template never reads) and
one per granted path, opened by the server when the job started. After a job,
the template keeps children confined ahead (``[pool] prepared_children``, see
``_Children``) with the latest job's confinement and the same grant
descriptors, and hands the server the pidfd and control socket of each: the
server gives a later job to one itself (the template is not on that job's
path) only if that job's confinement is identical and its grants name the
very same files, and otherwise has the template discard it. Back to back jobs of one confinement are then
nothing but ends of children here: that cycle (reap, report, prepare the next) runs in a native loop
(``_fork_loop.c``, see ``_Children.serve_natively``) until anything else happens, so that the template writes
almost none of the pages it shares with its children; the Python loop serves everything else, and everything
where the loop is not built or ``$PYNOX_NATIVE`` is ``0``.

Run as ``python -I -c ... <socket fd> <server pid>`` by :mod:`pynox.server.templates`.
"""

from __future__ import annotations

import _socket
import collections
import ctypes
import errno
import gc
import importlib
import itertools
import os
import platform
import select
import signal
import socket
import sys
from collections.abc import Iterable

import msgspec

from ..errors import KernelSupportError
from ..extensions import load
from ..job.child import Setup, job_setup, prepare_template, prepared_setup, run_job, run_prepared
from ..policy import Runtime, native_call, prepare_runtime, reset_environment
from ..policy._libc import prctl
from ..policy.grants import close_all
from ..policy.privileges import set_parent_death_signal, set_process_name
from ..server.fork_gate import process_facts
from ..wire.descriptors import CONTROL, sent_with_job
from ..wire.exits import SETUP_FAILED_EXIT
from ..wire.frames import (
    Adopt,
    Ended,
    Fork,
    Init,
    NotForked,
    Prepare,
    Prepared,
    Ready,
    Reaped,
    Spawn,
    Spawned,
    Started,
    TemplateFailed,
    Unprepared,
    init_decoder,
    recv_raw,
    send_frame,
    template_decoder,
)
from ..wire.signals import INTERRUPT_SIGNAL
from ..wire.spec import Confinement

# A forked child's last resort, bound here: the job's code may have replaced os._exit itself, and a child whose
# exit raised would go on as the template.
_child_exit = os._exit

# Not built, or built from another source: every cycle is served in Python.
_fork_loop, _ = load("pynox.template", "_fork_loop")

__all__ = ["main"]


def main() -> None:
    sock = socket.socket(fileno=int(sys.argv[1]))
    server = int(sys.argv[2])
    _leave_stopping_to_the_server()
    set_parent_death_signal(signal.SIGKILL)
    set_process_name("pynox-template")
    # Reparented (to init, a subreaper, or a container's PID 1): the server died before the death signal
    # was armed. Its pid, not "1", says so: the server itself may be PID 1 of a PID namespace.
    if os.getppid() != server:
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
    ready = Ready(python=platform.python_version(), pid=os.getpid(), preloaded=init.preload,
                  landlock_abi=runtime.landlock_abi, landlock_abi_kernel=runtime.landlock_abi_kernel,
                  read_paths=list(runtime.read_paths), memory_floor=runtime.memory_floor,
                  native=runtime.native is not None,
                  seccomp_unknown=sorted({n for f in runtime.filters.values() for n in f.compiled.unknown}))
    send_frame(sock, ready)
    if init.zygote:
        set_process_name("pynox-zygote")
        _serve_zygote(sock, runtime, init, ready)
    else:
        _serve(sock, runtime, init.prepared)


# A supervisor's stop signals reach more than the pool: Ctrl-C and supervisord's stopasgroup its process group,
# systemd's KillMode=control-group every process of its cgroup, a terminal's hangup its foreground group. The
# server decides how the pool ends (a drain, then a deadline) and how each job ends: the template ignores
# them, and every job inherits that (a job's own code may still install a handler).
_SERVERS_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def _leave_stopping_to_the_server() -> None:
    for signum in _SERVERS_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
    # The pool's interrupt of a session step: only a session's child takes it, once set up (job/interrupts.py).
    signal.signal(INTERRUPT_SIGNAL, signal.SIG_IGN)
    # The server waits for them on a thread with them blocked, and a blocked mask is inherited across exec.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _SERVERS_SIGNALS)


def _warm_up(init: Init, sock_fd: int) -> Runtime:
    sys.path.extend(d for d in init.package_dirs if d not in sys.path)
    for module in init.preload:
        try:
            importlib.import_module(module)
        except Exception as exc:
            raise RuntimeError(f"preloading {module!r} failed: {type(exc).__name__}: {exc}") from None
    prepare_template()  # what every job would otherwise build for itself, built once from the preloads
    _prove_single_threaded(init.preload)
    _prove_descriptors({0, 1, 2, sock_fd}, init.preload)
    runtime = prepare_runtime(tuple(init.package_dirs), tuple(init.data_dirs), max_abi=init.landlock_abi,
                              native=init.native)
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
    # sys.flags cannot be instantiated: a named tuple of the same fields in the same order (those that
    # unpack, __match_args__), with the ones that do not (3.13's gil) as attributes, as on sys.flags.
    flags = sys.flags
    names = list(flags.__match_args__)
    extra = {name: getattr(flags, name) for name in dir(flags)
             if not name.startswith("_") and name not in names and name not in dir(tuple)
             and name not in ("n_fields", "n_sequence_fields", "n_unnamed_fields")}
    values = {name: getattr(flags, name) for name in names} | {"ignore_environment": 0, "isolated": 0,
                                                               "safe_path": False}
    lookalike = type("flags", (collections.namedtuple("flags", names),), {"__slots__": (), **extra})
    sys.flags = lookalike(**values)  # a lookalike (the type made above is Any to mypy)


def _prove_single_threaded(preload: list[str]) -> None:
    # fork() copies only the calling thread: a lock held by another one would deadlock a child.
    tasks = os.listdir("/proc/self/task")
    # threading only if a preload imported it: pynox's own modules do not, so that a job's child has no threading
    # state to rebuild after its fork (its hook, ~110 copy-on-write faults a child); /proc counts every thread.
    threading = sys.modules.get("threading")
    if len(tasks) != 1 or (threading is not None and threading.active_count() != 1):
        names = [t.name for t in threading.enumerate() if t is not threading.main_thread()] if threading else []
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


class _Lineage:
    """A job's confinement and the descriptors of its grants, which children are prepared from while it is the
    latest job forked here. The descriptors are kept while it is the latest or one of its children lives:
    they keep the granted inodes alive, so the identity the server matches a prepared child by cannot be
    taken by another file."""

    def __init__(self, job: int, confinement: Confinement, grants: list[int]) -> None:
        self.job, self.confinement, self.grants = job, confinement, grants
        self.living = 0  # its children not reaped yet
        # The setups of children prepared from it (job/child.prepared_setup, their native call in them), by what
        # each was laid out for (the number of the child's end of its control socket, which alternates between
        # two as pidfds come and go, and the generations of the runtime's rules): the next child's is the same
        # while these are the same. Each child writes its own copy of it; the template never changes it.
        self.setups: dict[tuple[int, int, int], Setup] = {}

    def close(self) -> None:
        close_all(self.grants)
        self.grants = []


class _Child:
    """A child this template forked and has not reaped yet, and the lineage it comes of (None for a session's
    child: nothing is prepared from a session's grants)."""

    # No instance dict: every object the template writes between two forks is a copy-on-write fault.
    __slots__ = ("discarded", "lineage", "pid", "pidfd", "prepared", "serial", "sock")

    def __init__(self, serial: int, pid: int, lineage: _Lineage | None, *, prepared: bool,
                 sock: socket.socket | None = None, pidfd: int | None = None) -> None:
        self.serial, self.pid, self.lineage = serial, pid, lineage
        self.prepared = prepared  # confined ahead of its job, rather than forked for one
        self.sock = sock  # a session fork's copy: the socket it is reported on (None: the server's own)
        self.pidfd = os.pidfd_open(pid) if pidfd is None else pidfd  # given: the native loop opened it
        self.discarded = False
        if lineage is not None:
            lineage.living += 1


class _Children:
    """Every child of this template, by serial; each is announced once and reported ended once.

    ``limit`` children (``[pool] prepared_children``) are kept prepared from the latest job's lineage: after
    every reap of a child the server did not give up, as many are forked as are missing, unless a child
    forked for its job runs (on two cores the preparation would take the CPU the job and the server need;
    that job's own end tops them up). A child prepared here and handed a job by the server counts until it
    ends: this template does not know it has a job, and its end is what prepares its replacement. A child
    given up is not replaced: one whose job the server no longer knows would otherwise be prepared again.
    After a child killed, only as many are prepared as its memory cgroup has room for (see reap)."""

    def __init__(self, sock: socket.socket, runtime: Runtime, limit: int) -> None:
        self.sock, self.runtime, self.limit = sock, runtime, limit
        self.by_serial: dict[int, _Child] = {}
        self._serials = itertools.count(1)
        self.latest: _Lineage | None = None
        self.copies: list[socket.socket] = []  # the sockets of the session fork's copies adopted here
        # What the serving loop waits on (see _serve): the server's socket, every child's pidfd (by_pidfd) and
        # every copy's socket, registered as they come and unregistered before they close, rather than a
        # poller and its maps built again for every wait.
        self.poller = select.poll()
        self.poller.register(sock, select.POLLIN)
        self.by_pidfd: dict[int, _Child] = {}
        self.room = _MemoryRoom()

    def adopt(self, pid: int, sock: socket.socket) -> None:
        """A session fork's copy, orphaned to this template (a subreaper): announced and reported on ``sock``,
        killed when it closes. Not adopted (``sock`` closed: the server sees its end at once) unless it is a
        process whose parent is this template, and none of its children already."""
        if any(child.pid == pid for child in self.by_serial.values()) or process_facts(pid) != (pid, os.getpid()):
            sock.close()
            return
        try:
            child = _Child(next(self._serials), pid, None, prepared=False, sock=sock)
        except OSError:
            sock.close()
            return
        self._track(child)
        self.copies.append(sock)
        self.poller.register(sock, select.POLLIN)
        try:
            send_frame(sock, Started(serial=child.serial, pid=pid), [child.pidfd])
        except OSError:
            self.drop_copy(sock)

    def drop_copy(self, sock: socket.socket) -> None:
        """The server closed a copy's socket: the copy is killed (its end is reaped, and reported nowhere)."""
        for child in self.by_serial.values():
            if child.sock is sock:
                self._discard(child)
        if sock in self.copies:
            self.poller.unregister(sock)
        self.copies = [other for other in self.copies if other is not sock]
        sock.close()

    def drop_own(self) -> None:
        """The server closed the template's socket while copies live: its own children are killed."""
        for child in self.by_serial.values():
            if child.sock is None:
                self._discard(child)
        self.poller.unregister(self.sock)
        self.sock.close()

    def fork_job(self, job: int, confinement: Confinement, fds: list[int]) -> None:
        """Fork the job's child; announce it with its pidfd. A fork that fails (EAGAIN: the pids cgroup or
        RLIMIT_NPROC full; ENOMEM) is the job's answer (NotForked), not this template's end: it serves on."""
        own = len(sent_with_job(confinement.host_channel, confinement.session))
        own_fds, grants = fds[:own], fds[own:]
        # The server hands jobs to prepared children itself and sends this one here after the last job ended:
        # a child still prepared will never get a job (the server has not seen it yet, or gave it up).
        for other in self.by_serial.values():
            if other.prepared:
                self.discard(other.serial)
        _refresh(self.runtime, confinement)
        # The child's native call, laid out here: every object a child touches is a copy-on-write fault.
        call = (native_call(confinement, self.runtime, grants, own_fds,
                            sent_with_job(confinement.host_channel, confinement.session), prepared=False)
                if self.runtime.native is not None else None)
        setup = job_setup(confinement, self.runtime, own_fds, grants, call)
        try:
            pid = os.fork()
        except OSError as exc:
            close_all(fds)  # the job's own and its grants: nothing was forked to hold them
            send_frame(self.sock, NotForked(job=job, reason=f"{errno.errorcode.get(exc.errno or 0, 'error')}: "
                                                            f"{exc.strerror or exc}"))
            return
        if pid == 0:
            try:  # never returns; should it raise, the child must not go on as the template
                run_job(setup)
            finally:
                _child_exit(SETUP_FAILED_EXIT)
        close_all(own_fds)  # the child has them; the payload among them was never read here
        if confinement.session:  # a fork's copy is orphaned here, not to init (see adopt)
            prctl(_PR_SET_CHILD_SUBREAPER, 1, what="PR_SET_CHILD_SUBREAPER")
        # A session's child is the only one its template forks; any other job's grants may be prepared from,
        # unless none is prepared here (prepared_children = 0): then nothing keeps them past the fork.
        lineage = None
        if confinement.session or self.limit == 0:
            close_all(grants)
        else:
            lineage = _Lineage(job, confinement, grants)
        self._succeed(lineage)
        child = self._add(pid, lineage, prepared=False)
        send_frame(self.sock, Started(serial=child.serial, pid=pid, rules=_generation(self.runtime)), [child.pidfd])

    def _succeed(self, lineage: _Lineage | None) -> None:
        """``lineage`` is the latest now: the one before keeps its grants only while a child of it lives."""
        before, self.latest = self.latest, lineage
        if before is not None and before.living == 0:
            before.close()

    def prepare(self, lineage: _Lineage) -> bool:
        """Fork a child that confines itself now for a job like ``lineage``'s; the server gets its pidfd and its
        control socket, and hands it a later job itself if that job's confinement and grants match. False if
        the fork failed (EAGAIN: the pids cgroup is full, a job's threads filling it now; ENOMEM): none is
        prepared, and a later job forks its own child."""
        _refresh(self.runtime, lineage.confinement)
        # _socket's own objects (close-on-exec, as socket.socketpair's): socket.py would wrap each in a Python
        # object, asking the kernel its name (getsockname) to do so, and close each in three Python calls.
        control, child_end = _socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        laid_out = (child_end.fileno(), self.runtime.rules.generation, self.runtime.network_rules.generation)
        setup = lineage.setups.get(laid_out)
        if setup is None:
            if len(lineage.setups) >= 4:  # a rule reopened: the setups laid out before are stale
                lineage.setups.clear()
            call = (native_call(lineage.confinement, self.runtime, lineage.grants, [child_end.fileno()], (CONTROL,),
                                prepared=True) if self.runtime.native is not None else None)
            setup = lineage.setups[laid_out] = prepared_setup(lineage.confinement, self.runtime, child_end.fileno(),
                                                              lineage.grants, call)
        try:
            pid = os.fork()
        except OSError:
            control.close()
            child_end.close()
            return False
        if pid == 0:
            try:  # never returns; should it raise, the child must not go on as the template
                run_prepared(setup)
            finally:
                _child_exit(SETUP_FAILED_EXIT)
        child_end.close()
        child = self._add(pid, lineage, prepared=True)
        try:
            send_frame(self.sock, Prepared(serial=child.serial, pid=pid, job=lineage.job,
                                           rules=_generation(self.runtime)),
                       [child.pidfd, control.fileno()])
        finally:
            control.close()
        return True

    def _add(self, pid: int, lineage: _Lineage | None, *, prepared: bool) -> _Child:
        child = _Child(next(self._serials), pid, lineage, prepared=prepared)
        self._track(child)
        return child

    def _track(self, child: _Child) -> None:
        self.by_serial[child.serial] = child
        self.by_pidfd[child.pidfd] = child
        self.poller.register(child.pidfd, select.POLLIN)

    def discard(self, serial: int) -> None:
        """Kill a prepared child the server will not use (its end is reported when it is reaped). A child
        already reaped (it died on its own meanwhile) is no longer here: nothing to do."""
        child = self.by_serial.get(serial)
        if child is not None:
            self._discard(child)

    @staticmethod
    def _discard(child: _Child) -> None:
        """Kill a child the server gave up, marked discarded (its end is reaped as any other's: see reap)."""
        child.discarded = True
        try:
            signal.pidfd_send_signal(child.pidfd, signal.SIGKILL)
        except ProcessLookupError:
            pass  # exiting already: its end is reported all the same

    def _missing(self) -> int:
        """How many children to prepare now from the latest lineage (see the class's docstring)."""
        latest = self.latest
        if latest is None:
            return 0
        living = 0
        for other in self.by_serial.values():  # one loop, no generators: this runs after every reap
            if not other.prepared:
                return 0  # a child forked for its job runs
            if other.lineage is latest and not other.discarded:
                living += 1
        return max(self.limit - living, 0)

    def reap(self, child: _Child) -> None:
        """Report how ``child`` ended, and how many children are prepared now; then prepare them."""
        _, status, usage = os.wait4(child.pid, 0)
        self.poller.unregister(child.pidfd)
        os.close(child.pidfd)
        del self.by_serial[child.serial], self.by_pidfd[child.pidfd]
        lineage = child.lineage
        if lineage is not None:
            lineage.living -= 1
            if lineage.living == 0 and lineage is not self.latest:
                lineage.close()
        missing = 0 if child.discarded or child.sock is not None else self._missing()
        ended = Ended(serial=child.serial, status=status, prepares=missing,
                      cpu_us=int((usage.ru_utime + usage.ru_stime) * 1e6), max_rss_kb=usage.ru_maxrss)
        if child.sock is not None:  # a copy: reported to its own session, unless the server let it go
            if child.sock in self.copies:
                try:
                    send_frame(child.sock, ended)
                except OSError:
                    self.drop_copy(child.sock)
            return
        if self.sock.fileno() < 0:  # the server let go of its own children (copies live on)
            return
        send_frame(self.sock, ended)
        # A child killed (for its memory, its deadline, a cancel, or after its result left) may leave its cgroup
        # full of what it wrote into a tmpfs, under its job's limit until the server sets the next job's. A child
        # forked into it would meet the OOM killer before it is the first to be killed (limits.first_to_be_killed):
        # in the fork itself, or before that first step, where the template may be chosen. Only as many are
        # prepared as there is room for; a later job's end, under that job's limit, tops them up.
        fits = self.room.fits(missing) if missing and os.WIFSIGNALED(status) \
            and os.WTERMSIG(status) == signal.SIGKILL else missing
        for forked in range(missing):
            assert self.latest is not None
            # The next job most likely has the same confinement (one tool, one profile).
            # The server is told not to wait for the rest; the next reap retries.
            if forked == fits or not self.prepare(self.latest):
                send_frame(self.sock, Unprepared(count=missing - forked))
                break

    def serve_natively(self) -> Setup | None:
        """The steady state, served by the native loop (template/_fork_loop.c) until anything else happens:
        every child is one prepared from the latest lineage and not discarded, no copy is adopted, and each end
        of a child is reaped, reported and replaced there as :meth:`reap` would, its bytes and its order the
        same, while this process's Python objects (the copy-on-write faults of a cycle) are left alone. It
        returns at anything else: a frame (untouched, for the caller's poll), or children announced that it
        leaves to Python (a cgroup short of room, a rule to reopen, a fork that failed), prepared here as reap
        would; the children it reaped and forked are taken into the books here.

        Returns None in the template (at once where the loop is not built, ``$PYNOX_NATIVE`` is ``0``, or the
        state is another); in a child it forked, that child's setup, for :func:`run_prepared`."""
        latest = self.latest
        if (_fork_loop is None or self.runtime.native is None or latest is None or self.copies
                or len(self.by_serial) > _fork_loop.MAX_CHILDREN or self.sock.fileno() < 0):
            return None
        for child in self.by_serial.values():
            if not child.prepared or child.discarded or child.lineage is not latest:
                return None
        room = self.room.hierarchy()
        if isinstance(room, bool):
            return None  # where its files are is not known yet: reap finds it
        rules, network_rules = self.runtime.rules, self.runtime.network_rules
        generations = (rules.generation, network_rules.generation)
        setups = tuple((key[0], setup) for key, setup in latest.setups.items() if key[1:] == generations)
        watched = (rules.identities(),) if latest.confinement.network == "none" else (
            rules.identities(), network_rules.identities())
        out = _fork_loop.serve(self.sock.fileno(), tuple((c.serial, c.pid, c.pidfd) for c in self.by_serial.values()),
                               next(self._serials), self.limit, latest.job, _generation(self.runtime), setups,
                               watched, None if room is None else (*room, _ROOM_FOR_A_CHILD))
        if isinstance(out, Setup):
            return out  # in a child it forked
        # Native int64s, made before its loop (so that nothing there fails once a child was reaped or forked):
        # count, serial, pending, why, error, then (serial, pid, pidfd) of each child now.
        head = _fork_loop.RESULT_HEAD
        table = memoryview(out).cast("q")
        cells = table[:head + 3 * table[0]].tolist()  # the slots of children not there are not read
        count, serial, pending, why, error = cells[:head]
        now = [cells[at:at + 3] for at in range(head, head + 3 * count, 3)]
        self._serials = itertools.count(serial)
        kept, known = {entry[0] for entry in now}, set(self.by_serial)
        for child in [child for child in self.by_serial.values() if child.serial not in kept]:  # reaped there
            self.poller.unregister(child.pidfd)  # closed there: its number may be a new child's now
            del self.by_serial[child.serial], self.by_pidfd[child.pidfd]
            latest.living -= 1
        for serial, pid, pidfd in now:
            if serial not in known:
                self._track(_Child(serial, pid, latest, prepared=True, pidfd=pidfd))
        if error:
            raise OSError(error, os.strerror(error))  # a send failed: the server closed the socket
        # Announced in its Ended frame and not forked there: the rest of reap's work, as reap does it.
        fits = self.room.fits(pending) if why == _fork_loop.ROOM_UNKNOWN else pending
        for forked in range(pending):
            if why == _fork_loop.FORK_FAILED or forked == fits or not self.prepare(latest):
                send_frame(self.sock, Unprepared(count=pending - forked))
                break
        return None

    def kill_all(self) -> None:
        for sock in self.copies:
            sock.close()
        self.copies = []
        for child in list(self.by_serial.values()):
            try:
                signal.pidfd_send_signal(child.pidfd, signal.SIGKILL)
                os.waitpid(child.pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
            os.close(child.pidfd)
            if child.lineage is not None:
                child.lineage.close()
        self.by_serial.clear()
        self.by_pidfd.clear()
        if self.latest is not None:
            self.latest.close()
            self.latest = None


# What a child prepared ahead adds to its template's memory cgroup as it forks and confines itself (2.2-2.7 MiB,
# docs/performance.md), three times over: the template faults back in meanwhile what the kernel reclaimed at
# the limit (page cache: its own code, its libraries), and a larger preload makes larger page tables.
_ROOM_FOR_A_CHILD = 8 << 20


class _MemoryRoom:
    """What this template's memory cgroup can still take before the kernel's OOM killer runs: its limit less
    what it holds that cannot be reclaimed (page cache can). Read only after a child was killed, in a few small
    reads and with no import: the cgroup may be full then, and every later child would inherit what is loaded."""

    def __init__(self) -> None:
        # Where the memory hierarchy is mounted, found as the server found it (policy/cgroups._find: a v1
        # memory hierarchy, else v2), once: (the name of its line in /proc/self/cgroup, mount point, version),
        # or None where there is none. Which cgroup of it this template is in is read each time (a tenant's
        # job moves it).
        self._where: tuple[bytes, bytes, int] | None = None
        self._found = False

    def hierarchy(self) -> tuple[bytes, bytes, int] | bool | None:
        """Where the memory hierarchy is (found here if not yet), as the native loop reads the room itself; None:
        there is none; False: it could not be found now (the room is not known, and :meth:`fits` looks again)."""
        if not self._found:
            try:
                self._where, self._found = _memory_hierarchy(), True
            except (OSError, ValueError, KeyError, IndexError):
                return False
        return self._where

    def fits(self, children: int) -> int:
        """How many of ``children`` have room to be prepared now (all of them where the room is not known)."""
        room = self._room(children * _ROOM_FOR_A_CHILD)
        return children if room is None else min(children, max(room // _ROOM_FOR_A_CHILD, 0))

    def _room(self, enough: int) -> int | None:
        where = self.hierarchy()
        if not isinstance(where, tuple):  # none, or not found now
            return None
        key, point, version = where
        try:
            own = dict(line.split(b":", 2)[1:] for line in _read(b"/proc/self/cgroup", 1 << 13).splitlines())
            base = os.path.join(point, own[key].lstrip(b"/"))
            limit = _read(os.path.join(base, b"memory.limit_in_bytes" if version == 1 else b"memory.max")).strip()
            if not limit.isdigit():
                return None  # v2's "max": no limit
            held = int(_read(os.path.join(base, b"memory.usage_in_bytes" if version == 1 else b"memory.current")))
            if int(limit) - held >= enough:
                return int(limit) - held
            # Short of it: the page cache in it is room too (memory.stat costs more to read: only now).
            stat = dict(line.split() for line in _read(os.path.join(base, b"memory.stat"), 1 << 13).splitlines())
            held -= int(stat.get(b"active_file", 0)) + int(stat.get(b"inactive_file", 0))
        except (OSError, ValueError, KeyError, IndexError):  # a file of a shape not known: the room is not known
            return None
        return int(limit) - max(held, 0)


def _memory_hierarchy() -> tuple[bytes, bytes, int] | None:
    own = [line.split(b":", 2)[1] for line in _read(b"/proc/self/cgroup", 1 << 13).splitlines()]
    with open("/proc/self/mountinfo", "rb") as lines:  # may be long in a container: read whole, once
        mounts = [(left.split(), right.split()) for left, _, right in (line.partition(b" - ") for line in lines)]
    for key in own:
        if b"memory" in key.split(b","):
            for fields, tail in mounts:
                if len(fields) >= 5 and len(tail) >= 3 and tail[0] == b"cgroup" and b"memory" in tail[2].split(b","):
                    return key, fields[4], 1
    if b"" in own:
        for fields, tail in mounts:
            if len(fields) >= 5 and tail and tail[0] == b"cgroup2":
                return b"", fields[4], 2
    return None


def _read(path: bytes, size: int = 64) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.pread(fd, size, 0)
    finally:
        os.close(fd)


def _readable(sock: socket.socket, pidfds: Iterable[int]) -> list[int]:
    """Wait until the server's socket has a frame or a child behind one of ``pidfds`` ended; which are ready."""
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    for fd in pidfds:
        poller.register(fd, select.POLLIN)
    return [fd for fd, _ in poller.poll()]


def _serve(sock: socket.socket, runtime: Runtime, prepared: int) -> None:
    """Serve the server's frames and reap children, whichever comes first, until the server closes the socket.
    ``prepared``: how many children to keep confined ahead of the next job."""
    children = _Children(sock, runtime, prepared)
    own_open = True
    try:
        while own_open or children.copies:
            if own_open:
                setup = children.serve_natively()
                if setup is not None:  # a child the native loop forked: it never returns
                    try:
                        run_prepared(setup)
                    finally:
                        _child_exit(SETUP_FAILED_EXIT)
            # What is registered now: a descriptor closed while this wait's events are handled may be reused
            # (a new child's pidfd) before its own event comes, which must then not be taken for the new one's.
            watched = children.by_pidfd.copy()
            copies = {copy.fileno(): copy for copy in children.copies} if children.copies else {}
            for fd, _ in children.poller.poll():
                if fd in watched:
                    if watched[fd].pidfd == fd and watched[fd].serial in children.by_serial:
                        children.reap(watched[fd])
                    continue
                if fd in copies:  # a copy's socket brings its own copies' Adopt frames, then its end
                    if copies[fd] in children.copies:
                        _serve_copy(children, copies[fd])
                    continue
                try:
                    raw, fds = recv_raw(sock)
                except EOFError:
                    own_open = False
                    children.drop_own()  # a session's copies outlive the original (see adopt); closes sock
                    continue
                frame = template_decoder.decode(raw)
                if isinstance(frame, Adopt):
                    if len(fds) != 1:
                        close_all(fds)
                        return
                    children.adopt(frame.pid, socket.socket(fileno=fds[0]))
                elif isinstance(frame, Fork):
                    children.fork_job(frame.job, frame.confinement, fds)
                elif isinstance(frame, Spawn):  # a zygote's frame: a template never forks templates
                    close_all(fds)
                    return
                elif isinstance(frame, Prepare):
                    # Only a session's template, before its session: it has forked no job's child (a child it
                    # prepared before may wait: the server has it discarded once the new one is announced).
                    if not frame.confinement.session or not all(c.prepared for c in children.by_serial.values()):
                        close_all(fds)
                        return  # the server broke the template's protocol: it ends, and is replaced
                    # Of a lineage of its own, never the latest: nothing more is prepared from a session's
                    # grants, which are closed when this child ends.
                    lineage = _Lineage(frame.job, frame.confinement, fds)
                    if not children.prepare(lineage):  # the session's first step forks its own child
                        lineage.close()
                        send_frame(sock, Unprepared(count=1))
                else:
                    close_all(fds)
                    children.discard(frame.serial)
    except (BrokenPipeError, ConnectionResetError):
        return  # the server closed our socket: we are being stopped
    finally:
        children.kill_all()


def _serve_copy(children: _Children, sock: socket.socket) -> None:
    """A frame on a copy's socket: the Adopt of that copy's own fork's copy; anything else, or its end, lets
    the copy go (the server closed its socket)."""
    try:
        raw, fds = recv_raw(sock)
        frame = template_decoder.decode(raw)
    except (EOFError, OSError, ValueError, msgspec.DecodeError):
        children.drop_copy(sock)
        return
    if isinstance(frame, Adopt) and len(fds) == 1:
        children.adopt(frame.pid, socket.socket(fileno=fds[0]))
        return
    close_all(fds)
    children.drop_copy(sock)


def _serve_zygote(sock: socket.socket, runtime: Runtime, init: Init, ready: Ready) -> None:
    """A zygote forks templates, and never a job's child: each template it forks is a copy of this warm
    interpreter, which has served nothing and holds nothing of any job, as a template started by exec.

    Sessions' and workers' templates are forked here (see server/zygote.py), so that they all share the pages
    of one warm interpreter copy-on-write, where each used to import its preloads into pages of its own.
    A forked template waits for its Init before it answers: the server puts it in cgroups of its own first,
    as it does a template it started itself, before it forks anything. The zygote reaps the templates it
    forked and reports each one's end to the server (:class:`Reaped`: wait status and usage, as a template
    reports its child's :class:`Ended`). They outlive it: a zygote that dies or is closed leaves its
    templates serving (adopted by init, or a subreaper), and each ends when the server closes its socket
    (its death closes it) like a template started by exec. The zygote dies with the server."""
    zygote = os.getpid()
    kept = _open_descriptors()  # what a forked template inherits and keeps, beside the socket it is given
    templates: dict[int, int] = {}  # pidfd -> pid of each template forked and not yet reaped
    try:
        while True:
            for fd in _readable(sock, templates):
                if fd in templates:
                    pid, status, usage = os.wait4(templates.pop(fd), 0)
                    os.close(fd)
                    send_frame(sock, Reaped(pid=pid, status=status,
                                            cpu_us=int((usage.ru_utime + usage.ru_stime) * 1e6),
                                            max_rss_kb=usage.ru_maxrss))
                    continue
                try:
                    raw, fds = recv_raw(sock)
                except EOFError:
                    return
                frame = template_decoder.decode(raw)
                if not isinstance(frame, Spawn) or len(fds) != 1:
                    close_all(fds)
                    return  # the server broke the zygote's protocol: it ends, and the server replaces it
                pid = os.fork()
                if pid == 0:
                    try:  # never returns; should it raise, the fork must not go on as the zygote
                        _become_template(sock, fds[0], list(templates), zygote, kept, init, ready, runtime)
                    finally:
                        os._exit(0)
                os.close(fds[0])
                pidfd = os.pidfd_open(pid)
                templates[pidfd] = pid
                send_frame(sock, Spawned(pid=pid), [pidfd])
    except (BrokenPipeError, ConnectionResetError):
        return
    finally:
        # Its templates are the server's: each lives until the server closes its socket, this zygote or not.
        close_all(list(templates))


def _become_template(zygote_sock: socket.socket, fd: int, pidfds: list[int], zygote: int, kept: set[int],
                     init: Init, ready: Ready, runtime: Runtime) -> None:
    """In a fork of the zygote: drop what is the zygote's, wait for the server's Init, then serve as a template."""
    kept = kept - {zygote_sock.fileno()}
    zygote_sock.close()
    close_all(pidfds)  # the zygote's handles on its other templates
    # No parent-death signal (the fork cleared the zygote's): a template outlives the zygote, so that the jobs and
    # sessions it serves do not die with it. It ends with the server all the same: the server's end of ``fd`` is
    # the server's alone, so the server's death (or its close) is an EOF that every wait of _serve ends on.
    if os.getppid() != zygote:
        os._exit(1)  # the zygote died before it could report this template: the server has given up on it
    set_process_name("pynox-template")
    sock = socket.socket(fileno=fd)
    try:
        raw, _ = recv_raw(sock)  # sent once the server has put this process in its own cgroups
    except EOFError:
        return
    given = init_decoder.decode(raw)
    if given != msgspec.structs.replace(init, zygote=False):
        send_frame(sock, TemplateFailed(message="a template forked from the zygote was given another Init "
                                                "than the zygote's own"))
        return
    try:
        _prove_descriptors(kept | {fd}, init.preload)
    except RuntimeError as exc:
        send_frame(sock, TemplateFailed(message=str(exc)))
        return
    send_frame(sock, msgspec.structs.replace(ready, pid=os.getpid()))
    # Its children check that it is their parent (job/setup.py): this process's pid, not the zygote's.
    _serve(sock, msgspec.structs.replace(runtime, pid=os.getpid()), given.prepared)


def _open_descriptors() -> set[int]:
    listing = os.open("/proc/self/fd", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        listed = {int(fd) for fd in os.listdir(listing)} - {listing}
    finally:
        os.close(listing)
    return {fd for fd in listed if _is_open(fd)}


_PR_SET_CHILD_SUBREAPER = 36


def _generation(runtime: Runtime) -> int:
    """The generation of the runtime's rules a child forked now holds, as the server is told it (Started,
    Prepared): it moves whenever either set of rules reopened one."""
    return runtime.rules.generation + runtime.network_rules.generation


def _refresh(runtime: Runtime, confinement: Confinement) -> None:
    """Reopen runtime rules whose path names another file now (see RuntimeRules), before a fork: the network's
    name files only for a child that is given them (a child with no network is not: seven stat calls fewer)."""
    runtime.rules.refresh()
    if confinement.network != "none":
        runtime.network_rules.refresh()


if __name__ == "__main__":
    main()
