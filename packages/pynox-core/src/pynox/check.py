"""``pynox check``: what this kernel can enforce, proven by trying each rule in a confined child.

Kernel facts come first (release, architecture, the Landlock ABI and what each
level of it covers, seccomp, libseccomp). Then one template runs a short list
of probes, each a real job under the real policy: a control that must work (a
granted read and write), and one attempt per enforced rule that must fail the
way the policy promises. Nothing is inferred from version numbers alone: a rule
counts as enforced here only when its probe was refused here.

The verdict is ``ok`` only if every probe that applies to this kernel passed.
A kernel without Landlock or seccomp fails closed: the template refuses to
start, and the report says why instead of running anything unconfined.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform
import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from . import extensions
from .config import (
    LANDLOCK_ABI_VARIABLE,
    NATIVE_VARIABLE,
    landlock_abi_from_environment,
    load_config,
    native_from_environment,
)
from .errors import ConfigError, KernelSupportError, PoolError, RequestError
from .policy import BACKEND, cgroups, landlock, native, seccomp
from .protocol import Request, Result
from .server.packages import Installer
from .server.runner import run_on
from .server.templates import Template
from .server.tenants import budget_group
from .units import format_size
from .wire.exits import TIMEOUT_EXIT

__all__ = ["CheckReport", "Probe", "run_check"]

# What each Landlock ABI adds, and whether the policy uses it.
LANDLOCK_LEVELS = (
    (1, "files: read, write, execute, create, remove, make links and devices"),
    (2, "rename and hard link across directories (refer)"),
    (3, "truncate"),
    (4, "TCP bind and connect"),
    (5, "ioctl on devices"),
    (6, "scoping: signals and abstract unix sockets stay inside the sandbox"),
    (7, "audit logging of denials (not used by Pynox)"),
)
_SECRET_NAME = "PYNOX_CHECK_HOST_SECRET"


@dataclass
class Probe:
    name: str
    rule: str  # what a pass proves, in one line
    status: str = "fail"  # "pass", "fail" or "skip"
    detail: str = ""
    ms: int = 0


@dataclass
class CheckReport:
    facts: dict[str, Any]
    probes: list[Probe] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    # Set when nothing could be tried: this machine cannot confine code (fail closed).
    error: str | None = None
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.probes) and all(p.status != "fail" for p in self.probes)

    @property
    def verdict(self) -> str:
        if self.error is not None:
            return f"FAIL: Pynox cannot confine code on this machine and will not run any: {self.error}"
        failed = [p.name for p in self.probes if p.status == "fail"]
        if failed:
            return (f"FAIL: {len(failed)} rule(s) the policy promises could not be enforced here: "
                    f"{', '.join(failed)}")
        passed = sum(p.status == "pass" for p in self.probes)
        skipped = len(self.probes) - passed
        extra = f", {skipped} not applicable to this kernel (see warnings)" if skipped else ""
        return f"OK: every rule was proven on this machine ({passed} probes passed{extra}, {self.seconds:.2f}s)"

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "verdict": self.verdict,
            "facts": self.facts,
            "probes": [vars(probe).copy() for probe in self.probes],
            "warnings": list(self.warnings),
            "error": self.error,
            "seconds": round(self.seconds, 3),
        }

    def render(self) -> str:
        facts = self.facts
        lines = [
            "Kernel",
            f"  release        {facts['kernel']} ({facts['architecture']}), Python {facts['python']}, "
            f"uid {facts['uid']}",
            f"  Landlock       ABI {facts['landlock_abi']}" + _landlock_note(facts),
        ]
        for level in facts["landlock_coverage"]:
            mark = "yes" if level["available"] else "no "
            lines.append(f"    {mark}  ABI {level['abi']}: {level['covers']}")
        lines.append(f"  seccomp        {'available' if facts['seccomp'] else 'absent'}"
                     f" (actions: {facts['seccomp_actions'] or 'unknown'})")
        lines.append(f"  libseccomp     {facts['libseccomp'] or 'unknown'}, pyseccomp {facts['pyseccomp']}")
        unknown = facts.get("seccomp_unresolved")
        if unknown is not None:
            lines.append("  deny list      " + (f"unresolved here: {', '.join(unknown)}" if unknown
                                                else "every system call name resolved"))
        lines.append(f"  threads        {facts['threads']}")
        lines.append(f"  memory         {facts['memory']}")
        lines.append(f"  cpu            {facts['cpu']}")
        lines.append(f"  tcp buffers    {facts['tcp']}")
        scope = facts["ptrace_scope"]
        outer = "yes" if facts["outer_seccomp"] else "no"
        lines.append(f"  standing       capabilities {', '.join(facts['capabilities']) or 'none'} (of "
                     f"{', '.join(_CAPABILITY_NAMES)}); outer seccomp filter {outer}; "
                     f"Yama ptrace_scope {'absent' if scope is None else scope}")
        lines.append(f"  backend        {BACKEND}" + (" (cannot confine here)" if self.error else ""))
        lines.append("  native paths")
        for name, _, does in NATIVE_PATHS:
            lines.append(f"    {name:<11} {facts['native'][name]} ({does})")
        if self.probes:
            lines.append("Self-test (each probe is a confined child on this machine)")
            width = max(len(p.name) for p in self.probes)
            for probe in self.probes:
                lines.append(f"  {probe.status.upper():4}  {probe.name:<{width}}  {probe.rule} ({probe.ms} ms)")
                if probe.status != "pass" and probe.detail:
                    lines.append(f"        {probe.detail}")
        for warning in self.warnings:
            lines.append(f"warning: {warning}")
        lines.append(f"Verdict: {self.verdict}")
        return "\n".join(lines)


def _landlock_note(facts: dict[str, Any]) -> str:
    if not facts["landlock_abi"]:
        return f" (unavailable: {facts['landlock_absent']})"
    if facts["landlock_abi"] < facts["landlock_abi_kernel"]:
        return f" (capped by ${LANDLOCK_ABI_VARIABLE}; the kernel has ABI {facts['landlock_abi_kernel']})"
    return ""


def _libseccomp_version() -> str | None:
    path = ctypes.util.find_library("seccomp")
    if path is None:
        return None

    class _Version(ctypes.Structure):
        _fields_ = [("major", ctypes.c_uint), ("minor", ctypes.c_uint), ("micro", ctypes.c_uint)]

    try:
        lib = ctypes.CDLL(path)
        lib.seccomp_version.restype = ctypes.POINTER(_Version)
        version = lib.seccomp_version().contents
    except (OSError, AttributeError):
        return None
    return f"{version.major}.{version.minor}.{version.micro}"


def _kernel_facts() -> dict[str, Any]:
    kernel_abi, absent = landlock.probe()
    cap = landlock_abi_from_environment()
    abi = kernel_abi if cap is None else min(kernel_abi, cap)
    capabilities = _own_capabilities()
    try:
        with open("/proc/sys/kernel/seccomp/actions_avail") as actions:
            seccomp_actions = actions.read().strip()
    except OSError:
        seccomp_actions = ""
    import pyseccomp

    return {
        "kernel": platform.release(),
        "architecture": platform.machine(),
        "python": platform.python_version(),
        "uid": os.geteuid(),
        # What jobs are confined with; the kernel's own; the operator's cap ($PYNOX_LANDLOCK_ABI), if any.
        "landlock_abi": abi,
        "landlock_abi_kernel": kernel_abi,
        "landlock_abi_cap": cap,
        "landlock_absent": absent or None,
        # The pool's own standing: what a container or an ordinary user lacks shows here.
        "capabilities": capabilities,
        "ptrace_scope": _ptrace_scope(),
        "outer_seccomp": _outer_seccomp(),
        "landlock_coverage": [{"abi": level, "covers": covers, "available": abi >= level}
                              for level, covers in LANDLOCK_LEVELS],
        "seccomp": seccomp.supported(),
        "seccomp_actions": seccomp_actions,
        "libseccomp": _libseccomp_version(),
        "pyseccomp": getattr(pyseccomp, "__version__", "unknown"),
        # What bounds the threads of a job (the pid space is shared by the whole machine).
        "threads": _threads_fact(),
        "threads_bounded": cgroups.available().pids is not None,
        # What counts a job's memory: its own pages (rlimits) only, or all the kernel holds for it (a cgroup).
        "memory": _memory_fact(),
        "memory_counted": cgroups.memory_counted(),
        # Whether a job's TCP buffers count against a limit, and what bounds the CPU its threads use at once.
        "tcp": _tcp_fact(),
        "tcp_counted": cgroups.available().tcp_counted,
        "cpu": _cpu_fact(),
        "cpu_bounded": cgroups.available().cpu is not None,
        # Every per-job bound this setup cannot give, as the pool's ready event says them.
        "bounds_not_in_force": cgroups.available().not_in_force(),
        # Whether the native paths serve: the child's confinement in one call, the template's cycle.
        "native": native_paths(),
    }


# The native extensions, each with what it does (pynox/extensions.py loads them).
NATIVE_PATHS = (("_confine", "pynox.policy", "a child's confinement in one call"),
                ("_fork_loop", "pynox.template", "the template's cycle: reap, report, prepare the next"))


def native_paths() -> dict[str, str]:
    """Each native extension's state, as pynox/extensions.py loads it here (a template imports the same files):
    ``loaded``, ``not built: ...``, ``refused: ...`` (built from another source), or ``disabled by
    $PYNOX_NATIVE=0``. The template's cycle runs natively only where children confine natively: loaded
    without that, it says so."""
    try:
        wanted = native_from_environment()
    except ConfigError as exc:
        return dict.fromkeys((name for name, _, _ in NATIVE_PATHS), f"not known: {exc}")
    if wanted is False:
        return dict.fromkeys((name for name, _, _ in NATIVE_PATHS), f"disabled by ${NATIVE_VARIABLE}=0")
    states = {name: extensions.state(package, name) for name, package, _ in NATIVE_PATHS}
    if states["_fork_loop"] == "loaded" and states["_confine"] != "loaded":
        states["_fork_loop"] = "loaded, unused: children confine through the Python steps"
    return states


# Capability numbers (linux/capability.h) the report names.
_CAPABILITY_NAMES = {"CAP_SETPCAP": 8, "CAP_SYS_PTRACE": 19, "CAP_SYS_ADMIN": 21}


def _status_fields() -> dict[str, str]:
    try:
        with open("/proc/self/status") as status:
            return {key: value.strip() for key, _, value in (line.partition(":") for line in status)}
    except OSError:
        return {}


def _own_capabilities() -> list[str]:
    """The capabilities this process holds, of those that change what the pool can do."""
    effective = int(_status_fields().get("CapEff", "0"), 16)
    return [name for name, bit in _CAPABILITY_NAMES.items() if effective >> bit & 1]


def _ptrace_scope() -> int | None:
    """Yama's ptrace_scope (None: no Yama). At 2 only CAP_SYS_PTRACE, at 3 nothing, reaches another process's
    memory; the steward needs that to answer a job's chmod, chown, utime and sysinfo."""
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope") as scope:
            return int(scope.read())
    except (OSError, ValueError):
        return None


def _outer_seccomp() -> bool:
    """Whether this process already runs under a seccomp filter (a container's profile, most often)."""
    return _status_fields().get("Seccomp", "0") == "2"


def _steward_reaches_jobs(facts: dict[str, Any]) -> tuple[bool, str]:
    scope = facts["ptrace_scope"]
    if scope == 3 or (scope == 2 and "CAP_SYS_PTRACE" not in facts["capabilities"]):
        return False, (f"Yama's ptrace_scope is {scope}: the pool cannot read its jobs' memory, so it refuses "
                       "every chmod, chown and utime (shutil.copy2 and copytree fail in write grants), "
                       "sysinfo (glibc's sysconf(_SC_PHYS_PAGES) then gives an undefined value), and every "
                       "connection of a job with allow_hosts")
    return True, ""


def _threads_fact() -> str:
    bounds = cgroups.available()
    reason = bounds.pids_reason
    if bounds.pids is not None:
        return reason
    if os.geteuid() != 0:
        return f"not bounded per job ({reason}); RLIMIT_NPROC of uid {os.geteuid()} bounds them all together"
    return f"not bounded per job ({reason}); only memory bounds them (RLIMIT_NPROC never applies to root)"


def _memory_fact() -> str:
    bounds = cgroups.available()
    if bounds.memory is not None:
        return bounds.memory_reason + " (tmpfs pages and kernel buffers included)"
    return (f"its own pages only ({bounds.memory_reason}): memfd and System V shm are refused, and each file a "
            "job writes is bounded by its memory")


def _tcp_fact() -> str:
    bounds = cgroups.available()
    if bounds.memory is None or not bounds.tcp_counted:
        return "not counted against any limit"
    if bounds.memory.version == 2:
        return "counted in the job's memory (cgroup v2)"
    return "counted (cgroup v1 memory.kmem.tcp): a budget of their own, as large as the job's memory"


def _cpu_fact() -> str:
    bounds = cgroups.available()
    if bounds.cpu is not None:
        return bounds.cpu_reason
    return f"no quota per job ({bounds.cpu_reason}): a job's threads may keep every core busy until its timeout"


# The self-test ------------------------------------------------------------------------------------


@dataclass
class _Lab:
    """A scratch tree for the probes: a granted directory, one never granted, and a loopback listener."""

    root: str
    token: str
    listener: socket.socket

    @property
    def port(self) -> int:
        return int(self.listener.getsockname()[1])

    @property
    def unlisted_port(self) -> int:
        """A port next to the listener's, which an allow_hosts probe lists instead of it."""
        return self.port + 1 if self.port < 65535 else self.port - 1

    @property
    def granted(self) -> str:
        return os.path.join(self.root, "granted")

    @property
    def outside(self) -> str:
        return os.path.join(self.root, "outside")


@contextmanager
def _lab() -> Iterator[_Lab]:
    root = tempfile.mkdtemp(prefix="pynox-check-")
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        token = f"pynox-check-{os.urandom(8).hex()}"
        for name in ("granted", "outside"):
            os.mkdir(os.path.join(root, name))
            with open(os.path.join(root, name, "token.txt"), "w") as f:
                f.write(token)
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        listener.settimeout(0.05)
        yield _Lab(root, token, listener)
    finally:
        listener.close()
        shutil.rmtree(root, ignore_errors=True)


Verdict = tuple[bool, str]
_Judge = Callable[[Result, _Lab, float], Verdict]


def _refused(*types: str) -> _Judge:
    def judge(result: Result, lab: _Lab, elapsed: float) -> Verdict:
        error = result.error
        if error is None or error.type not in types:
            got = f"{error.type}: {error.message}" if error else f"exit {result.exit}, no error"
            return False, f"expected {' or '.join(types)}, got {got}"
        if lab.token in result.stdout + result.stderr:
            return False, "the job printed content it must not be able to read"
        return True, error.message
    return judge


def _printed(expected: str) -> _Judge:
    def judge(result: Result, lab: _Lab, elapsed: float) -> Verdict:
        if result.exit == 0 and expected in result.stdout:
            return True, "worked"
        return False, f"exit {result.exit}: {(result.error.message if result.error else result.stderr)[-300:]}"
    return judge


def _no_connection(judge: _Judge) -> _Judge:
    def both(result: Result, lab: _Lab, elapsed: float) -> Verdict:
        try:
            conn, _ = lab.listener.accept()
        except (TimeoutError, BlockingIOError):
            return judge(result, lab, elapsed)
        conn.close()
        return False, "the loopback listener received a connection"
    return both


def _connection(judge: _Judge) -> _Judge:
    def both(result: Result, lab: _Lab, elapsed: float) -> Verdict:
        try:
            conn, _ = lab.listener.accept()
        except (TimeoutError, BlockingIOError):
            return False, "the loopback listener received no connection"
        conn.close()
        return judge(result, lab, elapsed)
    return both


def _connect_code(lab: _Lab) -> str:
    return (f"import socket; socket.create_connection(('127.0.0.1', {lab.port}), timeout=2).close(); "
            "print('connected')")


def _file_absent(path: Callable[[_Lab], str], judge: _Judge) -> _Judge:
    def both(result: Result, lab: _Lab, elapsed: float) -> Verdict:
        if os.path.exists(path(lab)):
            return False, f"{path(lab)} was created"
        return judge(result, lab, elapsed)
    return both


def _mode_kept(path: Callable[[_Lab], str], judge: _Judge) -> _Judge:
    def both(result: Result, lab: _Lab, elapsed: float) -> Verdict:
        if os.stat(path(lab)).st_mode & 0o777 == 0o777:
            return False, f"the mode of {path(lab)} changed"
        return judge(result, lab, elapsed)
    return both


def _kept_whole(result: Result, lab: _Lab, elapsed: float) -> Verdict:
    with open(os.path.join(lab.granted, "token.txt")) as token:
        if token.read() != lab.token:
            return False, "the file granted read-only was truncated"
    return _refused("PermissionError")(result, lab, elapsed)


def _timed_out(result: Result, lab: _Lab, elapsed: float) -> Verdict:
    if result.exit != TIMEOUT_EXIT:
        return False, f"expected exit {TIMEOUT_EXIT}, got {result.exit}"
    if elapsed > _TIMEOUT + 1.5:
        return False, f"killed after {elapsed:.2f}s for a {_TIMEOUT}s limit"
    return True, f"killed after {elapsed:.2f}s"


_TIMEOUT = 0.3
_STATUS = """\
fields = dict(line.split(":", 1) for line in open("/proc/self/status"))
wanted = {"CapInh": "0" * 16, "CapPrm": "0" * 16, "CapEff": "0" * 16, "CapAmb": "0" * 16, "NoNewPrivs": "1",
          "Seccomp": "2"}
wrong = {k: fields[k].strip() for k, v in wanted.items() if fields[k].strip() != v}
print("wrong:", wrong) if wrong else print("all zero")
print("bounding", fields["CapBnd"].strip())
"""


def _unprivileged(result: Result, lab: _Lab, elapsed: float) -> Verdict:
    """No capability, no_new_privs, the filter on; and an empty bounding set where the pool could empty it.
    Without CAP_SETPCAP (an ordinary user, a container without it) the bounding set stays as it was, which
    only limits what an exec could gain: a job can never exec, and no_new_privs would forbid any gain."""
    passed, detail = _printed("all zero")(result, lab, elapsed)
    if not passed:
        return passed, detail
    bounding = result.stdout.rpartition("bounding ")[2].strip()
    if "CAP_SETPCAP" in _own_capabilities():
        return (True, "worked") if bounding == "0" * 16 else (False, f"bounding set {bounding} was not emptied")
    return True, (f"bounding set {bounding} kept: the pool has no CAP_SETPCAP to empty it (harmless: "
                  "no_new_privs is set and exec is refused)")


# sysinfo(2) as a job sees it: the pool answers with the job's own view (pynox.server.own_view).
_SYSINFO_MEMORY = 128 << 20
_SYSINFO = """\
import ctypes
class Sysinfo(ctypes.Structure):
    _fields_ = [("uptime", ctypes.c_long), ("loads", ctypes.c_ulong * 3), ("totalram", ctypes.c_ulong),
                ("freeram", ctypes.c_ulong), ("sharedram", ctypes.c_ulong), ("bufferram", ctypes.c_ulong),
                ("totalswap", ctypes.c_ulong), ("freeswap", ctypes.c_ulong), ("procs", ctypes.c_ushort),
                ("totalhigh", ctypes.c_ulong), ("freehigh", ctypes.c_ulong), ("mem_unit", ctypes.c_uint)]
libc = ctypes.CDLL(None, use_errno=True)
info = Sysinfo()
if libc.sysinfo(ctypes.byref(info)) != 0:
    raise OSError(ctypes.get_errno(), "sysinfo")
print("sysinfo", info.totalram * info.mem_unit, info.procs, info.uptime, sum(info.loads), info.totalswap)
"""


def _host_ram() -> int | None:
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return None


def _own_sysinfo(result: Result, lab: _Lab, elapsed: float) -> Verdict:
    passed, detail = _printed("sysinfo ")(result, lab, elapsed)
    if not passed:
        return passed, detail
    ram, procs, uptime, loads, swap = (int(word) for word in result.stdout.rpartition("sysinfo ")[2].split())
    if ram == _host_ram() or ram != _SYSINFO_MEMORY:
        return False, f"totalram is {ram} bytes, not the job's limit ({_SYSINFO_MEMORY})"
    if procs > 4 or uptime > 60 or loads or swap:
        return False, f"the host shows through: {procs} tasks, uptime {uptime}s, loads {loads}, swap {swap}"
    return True, f"the job's own view: {ram >> 20} MiB, {procs} task(s), up {uptime}s, no load"


_ENVIRON = f"""\
import os
initial = open("/proc/self/environ", "rb").read()
visible = {_SECRET_NAME!r} in os.environ or {_SECRET_NAME!r}.encode() in initial
print("leaked" if visible else "clean")
"""


@dataclass(frozen=True)
class _ProbeSpec:
    name: str
    rule: str
    request: Callable[[_Lab], dict[str, Any]]
    judge: _Judge
    min_abi: int = 1
    # Works only where the pool can read its jobs' memory (see _steward_reaches_jobs).
    needs_steward: bool = False


def _denied(name: str, rule: str, code: str) -> _ProbeSpec:
    """A probe whose code, with no grant at all, must fail with PermissionError."""
    return _ProbeSpec(name, rule, lambda lab: {"code": code}, _refused("PermissionError"))


_PROBES = (
    _ProbeSpec("granted_read", "control: a granted read succeeds (the harness works)",
               lambda lab: {"code": f"print(open({lab.granted + '/token.txt'!r}).read())",
                            "allow_read": [lab.granted]},
               lambda result, lab, elapsed: _printed(lab.token)(result, lab, elapsed)),  # the token is per run
    _ProbeSpec("granted_write", "control: a granted write succeeds",
               lambda lab: {"code": f"open({lab.granted + '/written'!r}, 'w').write('x'); print('written')",
                            "allow_write": [lab.granted]},
               _printed("written")),
    _ProbeSpec("read_outside", "reading outside the grants is denied (Landlock)",
               lambda lab: {"code": f"print(open({lab.outside + '/token.txt'!r}).read())",
                            "allow_read": [lab.granted]},
               _refused("PermissionError")),
    _ProbeSpec("write_outside", "writing outside the grants is denied (Landlock)",
               lambda lab: {"code": f"open({lab.outside + '/new'!r}, 'w')", "allow_write": [lab.granted]},
               _file_absent(lambda lab: lab.outside + "/new", _refused("PermissionError"))),
    _ProbeSpec("file_metadata", "chmod outside the write grants is denied (seccomp, answered by the pool)",
               lambda lab: {"code": f"import os; os.chmod({lab.outside + '/token.txt'!r}, 0o777)",
                            "allow_write": [lab.granted]},
               _mode_kept(lambda lab: lab.outside + "/token.txt", _refused("PermissionError"))),
    _ProbeSpec("granted_metadata", "control: chmod and utime work on a file in a write grant",
               lambda lab: {"code": f"import os; path = {lab.granted + '/token.txt'!r}\n"
                                    "os.chmod(path, 0o640); os.utime(path, (1, 2))\n"
                                    "print(oct(os.stat(path).st_mode & 0o777), os.stat(path).st_mtime)",
                            "allow_write": [lab.granted]},
               _printed("0o640 2.0"), needs_steward=True),
    _denied("subprocess", "starting a program is denied (seccomp)",
            "import subprocess; subprocess.run(['true'])"),
    _denied("fork", "fork is denied (seccomp)",
            "import os\nif os.fork() == 0:\n    os._exit(0)"),
    _denied("socket", "opening a socket without the network grant is denied (seccomp)",
            "import socket; socket.socket(socket.AF_INET, socket.SOCK_DGRAM)"),
    _ProbeSpec("tcp_connect", "a TCP connect to a loopback listener is denied",
               lambda lab: {"code": "import socket; socket.create_connection(('127.0.0.1', "
                                    f"{lab.listener.getsockname()[1]}), timeout=1)"},
               _no_connection(_refused("PermissionError"))),
    _ProbeSpec("listed_host", "control: allow_hosts reaches a listed host and port (the pool makes the connection)",
               lambda lab: {"code": _connect_code(lab), "allow_hosts": [f"127.0.0.1:{lab.port}"]},
               _connection(_printed("connected")), needs_steward=True),
    _ProbeSpec("unlisted_port", "allow_hosts refuses a port it does not list (seccomp, answered by the pool)",
               lambda lab: {"code": _connect_code(lab), "allow_hosts": [f"127.0.0.1:{lab.unlisted_port}"]},
               _no_connection(_refused("PermissionError"))),
    _denied("signal_parent", "signalling the template is denied (seccomp; Landlock scoping too from ABI 6)",
            "import os; os.kill(os.getppid(), 0)"),
    _denied("signal_owner", "making the kernel signal another process (F_SETOWN) is denied (seccomp)",
            "import fcntl, os; r, w = os.pipe(); fcntl.fcntl(r, 8, os.getppid())"),
    _ProbeSpec("truncate_read_only", "truncating a file granted read-only is denied (Landlock from ABI 3, "
                                     "seccomp below)",
               lambda lab: {"code": f"import os; os.truncate({lab.granted + '/token.txt'!r}, 3)",
                            "allow_read": [lab.granted]},
               _kept_whole),
    _denied("kernel_surface", "ptrace is denied (seccomp)",
            "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            "if libc.ptrace(0, 0, 0, 0) == -1:\n    raise OSError(ctypes.get_errno(), 'ptrace')"),
    _ProbeSpec("capabilities", "no capabilities, no_new_privs set, seccomp filter on",
               lambda lab: {"code": _STATUS}, _unprivileged),
    _ProbeSpec("environment", "the host's environment is not visible",
               lambda lab: {"code": _ENVIRON}, _printed("clean")),
    _ProbeSpec("memory_limit", "the memory limit raises MemoryError",
               lambda lab: {"code": "b = bytearray(512 << 20)", "memory": "128m"},
               _refused("MemoryError")),
    _denied("other_process", "renicing or probing another process is denied (seccomp)",
            "import os; os.getpriority(os.PRIO_PROCESS, os.getppid())"),
    _denied("own_proc", "the host's sockets and mounts are not readable through /proc/self",
            "print(open('/proc/self/net/tcp').read())"),
    _ProbeSpec("sysinfo", "sysinfo shows the job's own memory limit, tasks and age, not the host's (seccomp, "
                          "answered by the pool)",
               lambda lab: {"code": _SYSINFO, "memory": "128m"}, _own_sysinfo, needs_steward=True),
    _denied("datagram_pair", "a datagram socketpair is denied: it could reach a host socket (seccomp)",
            "import socket; socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)"),
    _ProbeSpec("timeout", f"the wall-clock limit kills a busy loop ({_TIMEOUT}s)",
               lambda lab: {"code": "while True:\n    pass", "timeout": _TIMEOUT},
               _timed_out),
)


def _run_probe(template: Template, spec: _ProbeSpec, lab: _Lab, facts: dict[str, Any]) -> Probe:
    probe = Probe(spec.name, spec.rule)
    abi = template.ready.landlock_abi
    if abi < spec.min_abi:
        probe.status = "skip"
        probe.detail = f"needs Landlock ABI {spec.min_abi}, this kernel has {abi}"
        return probe
    reaches, why = _steward_reaches_jobs(facts)
    if spec.needs_steward and not reaches:
        probe.status = "skip"
        probe.detail = why
        return probe
    start = time.monotonic()
    result = run_on(template, Request(**spec.request(lab)), cwd=lab.root, hint_style="cli", mode="check")
    elapsed = time.monotonic() - start
    passed, probe.detail = spec.judge(result, lab, elapsed)
    probe.status = "pass" if passed else "fail"
    probe.ms = round(elapsed * 1000)
    return probe


@contextmanager
def _host_secret() -> Iterator[None]:
    # A variable in our own environment while the template starts: the environment probe must not see it.
    previous = os.environ.get(_SECRET_NAME)
    os.environ[_SECRET_NAME] = "must-not-leak"
    try:
        yield
    finally:
        if previous is None:
            del os.environ[_SECRET_NAME]
        else:
            os.environ[_SECRET_NAME] = previous


def check_config(path: str, profile: str | None = None) -> list[str]:
    """Validate a ``pynox.toml`` as ``pynox pool --config`` would start with it, without serving: every table
    and key, the profiles against the ceiling, and the memory limits against what a job of its templates
    needs (one template is started with its preloads to know that). Returns what an operator should read;
    raises :class:`ConfigError` naming the file, table and key."""
    config = load_config(path)
    file = config.path or path
    if profile is not None:
        if profile not in config.profiles:
            known = ", ".join(sorted(config.profiles)) or "none are configured"
            raise ConfigError(f"{file}: --profile: no [profiles.{profile}] in the file (known: {known})")
        try:
            config.apply(Request(code="", profile=profile), os.path.dirname(file))
        except RequestError as exc:
            raise ConfigError(f"{file}: [profiles.{profile}]: a request naming it is refused: {exc}") from None
    settings = config.pool
    try:
        template = Template(list(settings.preload), list(settings.package_dirs),
                            landlock_abi=settings.landlock_abi)
    except PoolError as exc:
        raise ConfigError(f"{file}: [pool]: a template could not start with its preload and package_dirs: "
                          f"{exc}") from None
    try:
        floor = template.ready.memory_floor
        config.refuse_memory_below(floor, "a job of this pool needs to start (what its template holds, with the "
                                          "preloaded modules, plus 16 MiB to run)")
    finally:
        template.close()
    lines = [f"{file}: valid" + (f", profile {profile!r} included" if profile else "")]
    lines.append(f"profiles: {', '.join(sorted(config.profiles)) or 'none'}; ceiling: "
                 f"{'[pool.limits]' if config.limits is not None else 'none'}; a job needs at least "
                 f"{floor / (1 << 20):.1f} MiB of memory")
    lines += [f"warning: {warning}" for warning in config.warnings]
    for index, tenant in enumerate(config.tenants):
        if not tenant.has_budget:
            continue
        try:  # made as the pool would make it, then removed: a host that cannot is named now
            budget_group(index, tenant).close()
        except KernelSupportError as exc:
            raise ConfigError(f"{file}: {exc}") from None
        shares = [f"memory_budget {format_size(tenant.memory_budget)}" if tenant.memory_budget else "",
                  f"cpu_weight {tenant.cpu_weight}" if tenant.cpu_weight else ""]
        lines.append(f"tenant {tenant.name!r}: a cgroup of its own, " + ", ".join(filter(None, shares)))
    installs, problem = Installer(settings.installs,
                                  ceiling=config.limits.packages if config.limits else ()).check()
    if problem is not None:
        raise ConfigError(f"{file}: [pool]: {problem}")
    return lines + installs


def run_check() -> CheckReport:
    """Gather kernel facts and run the self-test. Never raises for a kernel that cannot confine: reports it."""
    start = time.monotonic()
    report = CheckReport(_kernel_facts())
    try:
        with _host_secret():
            template = Template([], [])
    except KernelSupportError as exc:
        # The template's message is for a pool ("...`pynox check` tells more"): here, the reason itself.
        report.error = report.facts["landlock_absent"] or str(exc)
    except PoolError as exc:
        report.error = f"the template could not start: {exc}"
    else:
        try:
            report.facts["seccomp_unresolved"] = list(template.ready.seccomp_unknown)
            # How the template's children confine themselves: in one native call, or through the Python steps
            # (the same rules; policy/native.py), and why not natively when the extension cannot load.
            report.facts["confinement"] = ("native" if template.ready.native
                                           else f"python ({native.load_error() or '$PYNOX_NATIVE=0'})")
            with _lab() as lab:
                for spec in _PROBES:
                    try:
                        report.probes.append(_run_probe(template, spec, lab, report.facts))
                    except PoolError as exc:  # a probe that broke its template is a failed rule, not a crash
                        report.probes.append(Probe(spec.name, spec.rule, "fail", f"the template broke: {exc}"))
                        template.close()
                        template = Template([], [])
        finally:
            template.close()
    _add_warnings(report)
    report.seconds = time.monotonic() - start
    return report


def _add_warnings(report: CheckReport) -> None:
    """Everything weaker here than on a current kernel with a pool run as root outside a container."""
    facts = report.facts
    abi, kernel_abi, cap = facts["landlock_abi"], facts["landlock_abi_kernel"], facts["landlock_abi_cap"]
    warn = report.warnings.append
    if cap is not None and cap < kernel_abi:
        warn(f"Landlock is capped at ABI {abi} (${LANDLOCK_ABI_VARIABLE}) on a kernel of ABI {kernel_abi}: jobs "
             "are confined as on that older kernel")
    if 1 <= abi < 2:
        warn(f"Landlock ABI {abi} has no refer right: renaming or hard-linking a file into another directory "
             "fails with EXDEV, even within one write grant (copy it instead)")
    if 1 <= abi < seccomp.TRUNCATE_ABI:
        warn(f"Landlock ABI {abi} does not govern truncation: seccomp refuses truncate() by name and read-only "
             "opens with O_TRUNC everywhere, write grants included (open the file for writing, or ftruncate)")
    if 1 <= abi < 4:
        warn(f"Landlock ABI {abi} has no TCP rules: with the network granted, nothing but seccomp's socket "
             "families limits where a job connects")
    if 1 <= abi < 5:
        warn(f"Landlock ABI {abi} does not govern ioctl on devices: a job may use any ioctl on the device "
             "files it can open (/dev/null, /dev/zero, /dev/urandom and those in its grants)")
    if 1 <= abi < 6:
        warn(f"Landlock ABI {abi} has no scoping: signals to other processes (kill, sigqueue, pidfd, F_SETOWN) "
             "are refused by seccomp alone, and abstract unix sockets are out of reach because seccomp "
             "refuses unix sockets")
    for name, state in facts["native"].items():
        if state.startswith("refused"):
            warn(f"{name} is not used: {state.removeprefix('refused: ')}; its Python path serves meanwhile (the same "
                 "rules, more CPU a job)")
    unresolved = facts.get("seccomp_unresolved")
    if unresolved:
        warn("this libseccomp does not know " + ", ".join(unresolved) + ": if this kernel has them, the filter "
             "cannot deny them (a newer libseccomp can)")
    if not facts["threads_bounded"]:
        warn("nothing bounds the threads of a job here: one job can use up the machine's pid space (see the "
             "threads fact)")
    if not facts["memory_counted"]:
        warn("no cgroup counts a job's memory here: pages it writes into a tmpfs in its grants (/dev/shm, a tmpfs "
             "mount) and kernel buffers count against no limit; each file it writes is bounded by its memory "
             "instead (see the memory fact)")
    if facts["memory_counted"] and not facts["tcp_counted"]:
        warn("a job's TCP buffers count against no limit here (this kernel's v1 memory cgroup has no "
             "memory.kmem.tcp): a job with allow_hosts or the network can hold far more than its memory in them")
    if not facts["cpu_bounded"]:
        warn("no CPU quota per job here: a job's threads may keep every core busy until its timeout (see the cpu "
             "fact)")
    reaches, why = _steward_reaches_jobs(facts)
    if not reaches:
        warn(why)
    if facts["uid"] != 0:
        warn(f"running as uid {facts['uid']}: jobs run as that uid too, and its other processes can read their "
             "memory (use a uid of their own for jobs when other programs run as this one)")
    if facts["outer_seccomp"]:
        warn("this process already runs under a seccomp filter (a container's profile?)"
             + (": the probes above ran under it, so what they proved holds here" if report.probes else ""))
    if facts["uid"] == 0:
        warn("running as root: jobs keep uid 0 without any capability; files owned by root outside the grants "
             "stay protected by Landlock and seccomp only")
