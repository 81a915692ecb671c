"""The real sandbox, driven from outside, and the world a case tries to escape into.

:class:`Sandbox` keeps one warm template for the whole module and runs each
request through it exactly as ``pynox.server.runner.run_once`` does (resolve, run,
result), so a case costs a fork rather than an interpreter start. A template
that a case broke is replaced before the next run; the case itself fails.

:class:`World` is what a case may reach for: a canary outside every grant, a
writable and a read-only grant, a fake home and a canary in the real home,
listeners the test owns (TCP, UDP, unix, abstract unix) and a sleeping
process the job must not be able to touch. Everything a job must leave alone
is snapshotted before a run and compared after it. A world that could not be
built whole ends whatever it had started before the error reaches the test.
"""

from __future__ import annotations

import ctypes
import functools
import grp
import os
import pwd
import secrets
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pyseccomp

from pynox.policy.seccomp import syscall_number
from pynox.protocol import Request, Result
from pynox.server.runner import run_on
from pynox.server.templates import Template
from tests.harness import procfs

# Put into the test process's environment before the template starts: no job may ever see it.
SECRET_NAME = "PYNOX_TEST_HOST_SECRET"
SECRET = "host-secret-" + secrets.token_hex(8)
UNCONFINED_TIMEOUT = 30.0
# Syscalls a case calls by number through ctypes; resolved for this architecture (negative: it has none).
SYSCALLS = (
    "fork", "clone", "clone3", "ptrace", "mount", "umount2", "unshare", "setns", "chroot", "pivot_root",
    "bpf", "perf_event_open", "userfaultfd", "io_uring_setup", "keyctl", "add_key", "kexec_load",
    "init_module", "process_vm_readv", "shmget", "ioctl", "personality", "ioprio_set", "capget",
    "inotify_init1", "mq_open", "io_setup", "io_destroy", "listmount", "openat2", "seccomp",
)


@dataclass
class Run:
    result: Result
    elapsed: float  # seconds, measured by the test around the whole run


class Sandbox:
    """One template serving every case of a module; replaced whenever a job broke it."""

    def __init__(self) -> None:
        self.template: Template | None = None
        self.replaced = 0

    def _ready_template(self) -> Template:
        if self.template is not None and (self.template.broken or self.template.process.poll() is not None):
            self.template.close()
            self.template = None
            self.replaced += 1
        if self.template is None:
            self.template = Template([], [])
        return self.template

    def run(self, request: Request, cwd: str) -> Run:
        template = self._ready_template()
        start = time.monotonic()
        result = run_on(template, request, cwd=cwd)
        return Run(result, time.monotonic() - start)

    def alive(self) -> bool:
        return self.template is not None and self.template.process.poll() is None

    def close(self) -> None:
        if self.template is not None:
            self.template.close()
            self.template = None


def run_unconfined(code: str, cwd: str, env: dict[str, str] | None = None) -> Run:
    """The same code in a plain interpreter with the test's own powers: the control for denials."""
    base = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", **(env or {})}
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=base, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=UNCONFINED_TIMEOUT, check=False)
    return Run(Result(id=None, exit=done.returncode, stdout=done.stdout, stderr=done.stderr),
               time.monotonic() - start)


def _syscall_numbers() -> dict[str, int]:
    return {f"nr_{name}": syscall_number(name) for name in SYSCALLS}


def _loopback6_available() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


# A process of the test's uid that holds no capability, like a job or a child prepared for one: the
# kernel lets any process of that uid renice, reschedule or re-pin it, so only the policy protects it.
_CAPLESS = """
import ctypes, os, sys, time
# Below the lowest priority, so that a renice to 19 shows (the test itself may run niced).
try:
    os.setpriority(os.PRIO_PROCESS, 0, 10)
except PermissionError:
    sys.exit(f"cannot lower its niceness from {os.getpriority(os.PRIO_PROCESS, 0)} to 10 without root: "
             "run the suite at a niceness of 10 or less, so that a renice to 19 can show")
libc = ctypes.CDLL(None, use_errno=True)
class Header(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]
class Data(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]
if libc.capset(ctypes.byref(Header(0x20080522, 0)), (Data * 2)()) != 0:
    sys.exit("capset failed")
print("ready", flush=True)
time.sleep(120)
"""


def _ioprio(pid: int) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return int(libc.syscall(pyseccomp.resolve_syscall(pyseccomp.Arch.NATIVE, "ioprio_get"), 1, pid))


@dataclass
class World:
    """Paths, listeners and a process outside the sandbox, built fresh for every test."""

    root: Path
    token: str = field(default_factory=lambda: "canary-" + secrets.token_hex(12))
    _closers: list[object] = field(default_factory=list)
    _processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.outside = self.root / "outside"
        self.canary = self.outside / "canary.txt"
        self.work = self.root / "work"
        self.readonly = self.root / "readonly"
        self.fake_home = self.root / "home"
        self.marker = self.work / "marker"
        for directory in (self.outside / "sub", self.work, self.readonly, self.fake_home / ".ssh"):
            directory.mkdir(parents=True)
        self.canary.write_text(self.token)
        (self.outside / "sub" / "nested.txt").write_text(self.token)
        (self.work / "mine.txt").write_text("mine")
        (self.readonly / "data.txt").write_text("readonly data")
        (self.fake_home / ".ssh" / "id_rsa").write_text(self.token)
        # The home of the test's uid (root's is /root), as the passwd database has it: HOME may point elsewhere.
        self.real_home = Path(pwd.getpwuid(os.geteuid()).pw_dir)
        self.home_canary: Path | None = self.real_home / f".pynox-test-canary-{secrets.token_hex(6)}"
        try:
            self.home_canary.write_text(self.token)
        except OSError:
            self.home_canary = None  # a home the test cannot write to: the cases that need the canary skip
        try:
            self._start()
        except BaseException:
            self.close()  # what was started before the error: a half-built world must not outlive the test
            raise

    def _start(self) -> None:
        self.tcp = self._listen(socket.AF_INET, socket.SOCK_STREAM, ("127.0.0.1", 0))
        self.tcp6 = self._listen(socket.AF_INET6, socket.SOCK_STREAM, ("::1", 0)) if _loopback6_available() else None
        self.udp = self._listen(socket.AF_INET, socket.SOCK_DGRAM, ("127.0.0.1", 0))
        self.unix_path = self.work / "listener.sock"
        self.unix = self._listen(socket.AF_UNIX, socket.SOCK_STREAM, str(self.unix_path))
        self.abstract_name = "pynox-test-" + secrets.token_hex(8)
        self.abstract = self._listen(socket.AF_UNIX, socket.SOCK_STREAM, "\0" + self.abstract_name)
        self.unix_dgram_path = self.root / "datagram.sock"
        self.unix_dgram = self._listen(socket.AF_UNIX, socket.SOCK_DGRAM, str(self.unix_dgram_path))
        self.mq_name = "/pynox-test-" + secrets.token_hex(8)
        # A process of the test's own uid: the job must not signal it, renice it or change its limits.
        self.sleeper = subprocess.Popen(["sleep", "120"], stdin=subprocess.DEVNULL)
        self._processes.append(self.sleeper)
        self.capless = subprocess.Popen([sys.executable, "-c", _CAPLESS], stdin=subprocess.DEVNULL,
                                        stdout=subprocess.PIPE)
        self._processes.append(self.capless)
        assert self.capless.stdout is not None
        ready = self.capless.stdout.readline()
        assert ready == b"ready\n", f"the capless process did not start (exit {self.capless.wait(10)}), see its stderr"
        self.capless_state = self.scheduling(self.capless.pid)

    def _listen(self, family: int, kind: int, address: object) -> socket.socket:
        sock = socket.socket(family, kind)
        self._closers.append(sock)
        sock.bind(address)
        if kind == socket.SOCK_STREAM:
            sock.listen(8)
        return sock

    def values(self) -> dict[str, object]:
        """What ``$name`` in a case's code stands for."""
        return {
            "token": self.token, "outside": self.outside, "canary": self.canary, "work": self.work,
            "readonly": self.readonly, "fake_home": self.fake_home, "marker": self.marker,
            "home_canary": self.home_canary, "real_home": self.real_home, "scratch_id": self.scratch_id,
            "tcp_port": self.tcp.getsockname()[1], "tcp6_port": self.tcp6.getsockname()[1] if self.tcp6 else 0,
            "udp_port": self.udp.getsockname()[1], "unix_path": self.unix_path,
            "abstract_name": self.abstract_name, "sleeper_pid": self.sleeper.pid, "test_pid": os.getpid(),
            "secret_name": SECRET_NAME, "tcp_port_hex": f"{self.tcp.getsockname()[1]:04X}",
            "unix_dgram_path": self.unix_dgram_path, "capless_pid": self.capless.pid, "mq_name": self.mq_name,
            **_syscall_numbers(),
        }

    @functools.cached_property
    def scratch_id(self) -> int:
        """A uid and gid that no account, group or process has: a control run as it touches nothing else."""
        return _unused_id()

    # Observations from outside -------------------------------------------------------------------

    def snapshot(self) -> dict[str, tuple[object, ...]]:
        """Everything a denied job must leave exactly as it was: names, contents, modes, times, links."""
        roots = [self.outside, self.readonly, self.fake_home]
        state: dict[str, tuple[object, ...]] = {}
        for root in roots:
            for path in sorted([root, *root.rglob("*")]):
                state[str(path)] = _describe(path)
        if self.home_canary is not None:
            state[str(self.home_canary)] = _describe(self.home_canary)
        return state

    def accepted(self, listener: socket.socket) -> bytes | None:
        """What a connection to ``listener`` sent, or None when nobody connected."""
        listener.settimeout(0.2)
        try:
            conn, _ = listener.accept()
        except (TimeoutError, BlockingIOError):
            return None
        with conn:
            conn.settimeout(2.0)
            chunks = []
            while chunk := conn.recv(4096):
                chunks.append(chunk)
            return b"".join(chunks)

    def datagram(self) -> bytes | None:
        self.udp.settimeout(0.2)
        try:
            return self.udp.recv(4096)
        except TimeoutError:
            return None

    def unix_datagram(self) -> bytes | None:
        self.unix_dgram.settimeout(0.2)
        try:
            return self.unix_dgram.recv(4096)
        except TimeoutError:
            return None

    @staticmethod
    def scheduling(pid: int) -> tuple[object, ...]:
        """How the kernel schedules ``pid``: nice value, policy, CPU affinity, I/O priority."""
        nice = int(procfs.stat(pid).fields[16])
        return nice, os.sched_getscheduler(pid), sorted(os.sched_getaffinity(pid)), _ioprio(pid)

    def message_queue_exists(self) -> bool:
        libc = ctypes.CDLL(None, use_errno=True)
        fd = libc.mq_open(self.mq_name.encode(), os.O_RDONLY)
        if fd >= 0:
            os.close(fd)
            return True
        return False

    def sleeper_alive(self) -> bool:
        return self.sleeper.poll() is None

    def sleeper_exited(self, within: float = 5.0) -> bool:
        try:
            self.sleeper.wait(timeout=within)
        except subprocess.TimeoutExpired:
            return False
        return True

    def stop_sleeper(self) -> None:
        self.sleeper.send_signal(signal.SIGSTOP)
        deadline = time.monotonic() + 5
        while self.sleeper_state() != "T" and time.monotonic() < deadline:
            time.sleep(0.005)

    def sleeper_state(self) -> str:
        time.sleep(0.05)  # a signal is delivered asynchronously; give a continued process time to run
        return procfs.stat(self.sleeper.pid).state

    def sleeper_limit(self, name: str) -> str:
        return next(line + "\n" for line in procfs.read(self.sleeper.pid, "limits").splitlines()
                    if line.startswith(name))

    def close(self) -> None:
        """Ends everything the world started; also what a world that failed halfway had started."""
        for sock in self._closers:
            sock.close()  # type: ignore[attr-defined]
        for process in self._processes:
            if process.poll() is None:
                process.send_signal(signal.SIGKILL)
            process.wait()
            if process.stdout is not None:
                process.stdout.close()
        if hasattr(self, "mq_name"):
            ctypes.CDLL(None).mq_unlink(self.mq_name.encode())
        if self.home_canary is not None:
            self.home_canary.unlink(missing_ok=True)


def _unused_id() -> int:
    taken = {int(line.split()[1]) for status in Path("/proc").glob("[0-9]*/status")
             for line in _lines(status) if line.startswith("Uid:")}
    while True:
        # Low enough to be mapped in a container's user namespace (commonly 0..65535).
        candidate = 50_000 + secrets.randbelow(10_000)
        if candidate in taken:
            continue
        try:
            pwd.getpwuid(candidate)
            continue
        except KeyError:
            pass
        try:
            grp.getgrgid(candidate)
            continue
        except KeyError:
            return candidate


def _lines(path: Path) -> list[str]:
    try:
        return path.read_text().splitlines()
    except OSError:
        return []  # the process ended while we looked


def _describe(path: Path) -> tuple[object, ...]:
    info = path.lstat()
    if stat.S_ISLNK(info.st_mode):
        content: object = os.readlink(path)
    elif stat.S_ISREG(info.st_mode):
        content = path.read_bytes()
    else:
        content = None
    return (info.st_mode, info.st_uid, info.st_gid, info.st_nlink, info.st_size, info.st_mtime_ns, content,
            sorted(os.listxattr(path, follow_symlinks=False)))


def build_world(root: Path) -> Iterator[World]:
    world = World(root)
    try:
        yield world
    finally:
        world.close()


class Listener:
    """For the allow_hosts tests: a TCP listener that accepts in a thread, records what each peer sent, and
    answers ``hi``."""

    def __init__(self, address: str, port: int = 0, family: int = socket.AF_INET) -> None:
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((address, port))
        self.sock.listen(64)
        self.address, self.port = address, self.sock.getsockname()[1]
        self.seen: list[bytes] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(2)
                try:
                    conn.sendall(b"hi")
                    self.seen.append(conn.recv(64))
                except OSError:
                    self.seen.append(b"")

    def connections(self) -> int:
        time.sleep(0.2)  # a connection the job made just before it ended is accepted by now
        return len(self.seen)

    def close(self) -> None:
        self.sock.close()
