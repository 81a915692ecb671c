"""Both ways a child confines itself install the same policy: the native call and the Python steps.

A child confines itself in one native call (policy/_confine.c) or, where the extension cannot load, through
the Python steps of job/setup.py ($PYNOX_NATIVE=0). For every Landlock ABI and every network mode, a job
confined each way is read from outside, by this (root) process:

* the seccomp programs the kernel holds for it, read back with ``PTRACE_SECCOMP_GET_FILTER`` (the main
  filter, and the own-process filter with the job's pid written in, compared constant by constant: where
  they differ, each side's own pid);
* every system call of its setup that shapes the policy, as ``strace`` saw it from outside, in order: the
  Landlock ruleset's attribute and each rule (its rights, and the path the rule's descriptor names), the
  enforcement, each ``prctl``, each limit, the identity calls, the seccomp loads;
* what ``/proc`` shows of it: credentials, capabilities, no_new_privs, seccomp mode and filter count, the
  signals it blocks, ignores and catches (a session's child takes the pool's interrupt signal), limits, its
  descriptors (the display channel among them), working directory, session and OOM score.

A session's first step is observed too (its child takes the interrupt signal: job/interrupts.py), and so is
the child the template prepares ahead of the next job (its outputs are /dev/null until its job's arrive).

The control: the pool confines natively only when asked to (``pynox check`` says which path its template's
children take, and PYNOX_NATIVE=1 makes a pool that cannot load the extension refuse to start).
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness import procfs
from tests.pool.pool_driver import (
    DEADLINE,
    READY_CHILD,
    PoolProcess,
    descendants,
    leftover_guard,
    own_commands_env,
    pool_process,
    proc_table,
)

pytestmark = pytest.mark.timeout(300)

_subreaper = pytest.fixture(scope="module", autouse=True, name="_subreaper")(leftover_guard)

_PTRACE_DETACH = 17
_PTRACE_SEIZE = 0x4206
_PTRACE_INTERRUPT = 0x4207
_PTRACE_SECCOMP_GET_FILTER = 0x420C
_WALL = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)
_libc.ptrace.restype = ctypes.c_long
_libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]

# The calls of a child's setup that make its policy; the rest (dup2, close, fstat) show in its descriptors.
_TRACED = ("landlock_create_ruleset,landlock_add_rule,landlock_restrict_self,prctl,prlimit64,setrlimit,setsid,"
           "capset,setgroups,setresgid,setresuid,chdir,seccomp")
_STATUS = ("Uid", "Gid", "Groups", "CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs", "Seccomp",
           "Seccomp_filters", "SigBlk", "SigIgn", "SigCgt")
_NETWORKS: dict[str, dict[str, Any]] = {"none": {}, "hosts": {"allow_hosts": ["127.0.0.1:9"]},
                                        "all": {"allow_network": True}}
# Each network mode as a plain job, and a session's first step (no network): the cases each side runs.
_CASES: dict[str, dict[str, Any]] = {**_NETWORKS, "session": {"session": "native-equality"}}
_INTERRUPT_BIT = 1 << (signal.SIGRTMIN + 2 - 1)  # wire/signals.py's INTERRUPT_SIGNAL, in /proc's masks
_JOB = """
import os, time
open({pid!r} + '.new', 'w').write(str(os.getpid()))
os.replace({pid!r} + '.new', {pid!r})  # seen only once closed: not among the job's descriptors
while not os.path.exists({release!r}):
    time.sleep(0.005)
print('released')
"""


def _filters(pid: int) -> list[bytes]:
    """Every seccomp program the kernel holds for ``pid``, read with the job stopped."""
    if _libc.ptrace(_PTRACE_SEIZE, pid, None, None) != 0:
        raise OSError(ctypes.get_errno(), f"PTRACE_SEIZE {pid}")
    try:
        if _libc.ptrace(_PTRACE_INTERRUPT, pid, None, None) != 0:
            raise OSError(ctypes.get_errno(), "PTRACE_INTERRUPT")
        os.waitpid(pid, _WALL)
        programs = []
        for index in range(8):
            count = _libc.ptrace(_PTRACE_SECCOMP_GET_FILTER, pid, ctypes.c_void_p(index), None)
            if count < 0:
                break
            buffer = ctypes.create_string_buffer(count * 8)
            assert _libc.ptrace(_PTRACE_SECCOMP_GET_FILTER, pid, ctypes.c_void_p(index), buffer) == count
            programs.append(buffer.raw)
        return programs
    finally:
        _libc.ptrace(_PTRACE_DETACH, pid, None, None)


def _pid_forms(pid: int) -> tuple[int, int]:
    """How a job's pid stands among a program's constants: itself, and -pid as the kernel's u32."""
    return pid, (-pid) & 0xFFFFFFFF


def _same_constant(mine: int, my_pid: int, theirs: int, their_pid: int) -> bool:
    """Equal, or each side's own pid in the same form (pid for pid, -pid for -pid)."""
    if mine == theirs:
        return True
    mine_forms, their_forms = _pid_forms(my_pid), _pid_forms(their_pid)
    return mine in mine_forms and theirs in their_forms and mine_forms.index(mine) == their_forms.index(theirs)


def _same_program(mine: bytes, my_pid: int, theirs: bytes, their_pid: int) -> bool:
    """The two programs are the same but for each job's pid in the own-process filter, compared instruction by
    instruction: a constant that differs must be each side's pid at the same place. (Masking every constant equal
    to a pid would also mask a system call's number when a pid happened to equal it, pids being small after a
    wrap at a low pid_max, and then only on one side.)"""
    if len(mine) != len(theirs):
        return False
    for offset in range(0, len(mine), 8):
        if mine[offset:offset + 4] != theirs[offset:offset + 4]:  # code, jt, jf
            return False
        k_mine = int.from_bytes(mine[offset + 4:offset + 8], sys.byteorder)
        k_theirs = int.from_bytes(theirs[offset + 4:offset + 8], sys.byteorder)
        if not _same_constant(k_mine, my_pid, k_theirs, their_pid):
            return False
    return True


_HEX = re.compile(r"(0x[0-9a-f]+)")


def _same_calls(mine: list[str] | None, my_pid: int, theirs: list[str] | None, their_pid: int) -> bool:
    """The two setups made the same calls, but for each job's pid among the constants strace printed (the
    own-process program), compared constant by constant for the same reason as :func:`_same_program`."""
    if mine is None or theirs is None:
        return mine is theirs
    if len(mine) != len(theirs):
        return False
    for my_line, their_line in zip(mine, theirs, strict=True):
        my_parts, their_parts = _HEX.split(my_line), _HEX.split(their_line)
        if len(my_parts) != len(their_parts):
            return False
        for index, (a, b) in enumerate(zip(my_parts, their_parts, strict=True)):
            if a == b:
                continue
            if index % 2 == 0 or not _same_constant(int(a, 16), my_pid, int(b, 16), their_pid):
                return False
    return True


def _normalised(line: str, pid: int) -> str:
    line = re.sub(r"\b\d+<([^>]*)>", r"<\1>", line)  # a descriptor by what it names, not its number
    line = line.replace(procfs.path(pid) + "/", procfs.path("PID") + "/")
    line = re.sub(r"0x[0-9a-f]{6,}", "ADDR", line)
    return re.sub(r" = \d+$", " = ok", line)


def _proc_facts(pid: int) -> dict[str, Any]:
    status = procfs.status(pid)
    descriptors = {}
    for fd, target in procfs.fd_targets(pid).items():
        try:
            info = procfs.read(pid, f"fdinfo/{fd}")
        except FileNotFoundError:
            # Closed since it was listed: a child prepared ahead still ending its setup (its caller reads until
            # two readings agree). A job waiting on its release closes none, so its reading loses nothing.
            continue
        flags = next(line for line in info.splitlines() if line.startswith("flags:"))
        descriptors[fd] = (re.sub(r":\[\d+\]", "", target), flags.split()[1])
    stat = procfs.stat(pid).fields
    return {
        "status": {name: status[name] for name in _STATUS},
        "limits": procfs.read(pid, "limits"),
        "descriptors": dict(sorted(descriptors.items())),
        "cwd": os.readlink(procfs.path(pid, "cwd")),
        "leads_its_session": int(stat[3]) == pid and int(stat[2]) == pid,  # session id, process group id
        "oom_score_adj": procfs.read(pid, "oom_score_adj"),
        "comm": procfs.read(pid, "comm"),
    }


class _Trace:
    """``strace`` following a template from outside: every child it forks from now on is traced too, each
    into a file of its own (``out.<pid>``)."""

    def __init__(self, template: int, out: Path) -> None:
        self.out = out
        command = [shutil.which("strace") or "strace", "-ff", "-qq", "-v", "-y", "-X", "raw", "-s", "64",
                   "-e", f"trace={_TRACED}", "-o", str(out), "-p", str(template)]
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        end = time.monotonic() + DEADLINE
        while _tracer(template) == 0:
            assert time.monotonic() < end and self.process.poll() is None, "strace did not attach"
            time.sleep(0.01)

    def detach(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
        self.process.wait(timeout=DEADLINE)

    def calls(self, pid: int) -> list[str]:
        """The calls ``pid`` made, in order (``-ff``: a file of its own, so no call is split by another's)."""
        lines = Path(f"{self.out}.{pid}").read_text().splitlines()
        return [_normalised(line.strip(), pid) for line in lines if not line.startswith(("+++", "---"))]


def _tracer(pid: int) -> int:
    return int(procfs.status(pid).get("TracerPid", "0"))


def _ready_child(pool: PoolProcess, job: int, filters: str) -> int:
    """The child the template prepared ahead of the next job, once its setup is done: its filters are
    installed (as many as the job's) and its seccomp listener handed to the pool."""
    end = time.monotonic() + DEADLINE
    while True:
        table = proc_table()
        for pid in descendants(pool.pid, table):
            if pid != job and table[pid][3] == READY_CHILD:
                try:
                    status = procfs.read(pid, "status")
                    held = list(procfs.fd_targets(pid).values())
                except OSError:
                    continue
                if f"Seccomp_filters:\t{filters}\n" in status and not any("seccomp" in fd for fd in held):
                    return pid
        assert time.monotonic() < end, "the template prepared no child ahead of the next job"
        time.sleep(0.01)


def _observe(pool: PoolProcess, tmp: Path, mode: str) -> dict[str, Any]:
    """Run a job with a read grant, a write grant and the network ``mode`` (or a session's first step);
    what it was confined with, and for a plain job without network the child prepared after it."""
    network = _CASES[mode]
    work = tmp / f"work-{mode}"
    work.mkdir()
    readable = tmp / "readable.txt"
    readable.write_text("x")
    pid_file, release = work / "pid", work / "release"
    # A session's child comes from a template of its own, started for it: its calls are not traced (its
    # programs and /proc facts are compared; the plain jobs' calls cover the same native call).
    (template,) = pool.templates()
    trace = _Trace(template, tmp / f"{work.name}.strace") if mode != "session" else None
    try:
        request_id = pool.submit(code=_JOB.format(pid=str(pid_file), release=str(release)),
                                 allow_write=[str(work)], allow_read=[str(readable)], **network)
        end = time.monotonic() + DEADLINE
        while not pid_file.exists() or not pid_file.read_text():
            assert time.monotonic() < end, f"the job never started: {pool.responses(request_id)}"
            time.sleep(0.01)
        pid = int(pid_file.read_text())
    finally:
        if trace is not None:
            trace.detach()
    calls = trace.calls(pid) if trace is not None else None
    # Each side runs in a directory of its own: named alike, its grants are the same paths.
    seen: dict[str, Any] = json.loads(json.dumps({"calls": calls, "proc": _proc_facts(pid)}).replace(str(tmp), "SIDE"))
    programs = _filters(pid)
    seen["filters"], seen["pid"] = programs, pid
    release.touch()
    result = pool.result(request_id)
    assert result["exit"] == 0 and result["stdout"] == "released\n", result
    if mode == "none":  # the template confines the next child ahead once this job has ended
        ready = _ready_child(pool, pid, seen["proc"]["status"]["Seccomp_filters"])
        facts, settled = None, _proc_facts(ready)
        while facts != settled:  # read until two readings agree: it may still be ending its setup
            time.sleep(0.05)
            facts, settled = settled, _proc_facts(ready)
        seen["ready"] = json.loads(json.dumps(facts).replace(str(tmp), "SIDE"))
        seen["ready_filters"], seen["ready_pid"] = _filters(ready), ready
    return seen


@pytest.fixture(scope="module")
def kernel_abi() -> int:
    done = subprocess.run([sys.executable, "-m", "pynox", "check", "--json"], capture_output=True, text=True,
                          env={**own_commands_env(), "PYNOX_NATIVE": "1"}, timeout=120, check=False)
    facts = json.loads(done.stdout)["facts"]
    # The control: asked for it, the pool's children confine natively (and a pool that cannot load the
    # extension refuses to start), so the two sides below are the two paths.
    assert facts["confinement"] == "native", facts.get("confinement")
    return int(facts["landlock_abi_kernel"])


@pytest.fixture
def observe(tmp_path: Path) -> Iterator[Any]:
    def run(native: str, abi: int) -> dict[str, dict[str, Any]]:
        env = {**os.environ, "PYNOX_NATIVE": native, "PYNOX_LANDLOCK_ABI": str(abi)}
        side = tmp_path / f"native-{native}"
        side.mkdir()
        with pool_process("--workers=1", cwd=side, env=env) as pool:
            return {mode: _observe(pool, side, mode) for mode in _CASES}
    yield run


def _can_read_filters() -> None:
    """Reading seccomp programs back needs CAP_SYS_ADMIN and CAP_SYS_PTRACE, which root in a container
    lacks (that leg proves the container's behaviour; the host's run proves this). strace is needed where
    they are held: in CI its absence fails, never skips."""
    effective = int(procfs.status("self")["CapEff"], 16)
    if not effective & (1 << 21) or not effective & (1 << 19):
        pytest.skip("reading a job's seccomp programs needs CAP_SYS_ADMIN and CAP_SYS_PTRACE")
    if shutil.which("strace") is None:
        if os.environ.get("CI"):
            pytest.fail("strace reads each child's setup from outside: install it (CI must prove this)")
        pytest.skip("strace reads each child's setup from outside")


@pytest.mark.needs_root("reading a process's seccomp programs needs CAP_SYS_ADMIN and ptrace")
@pytest.mark.parametrize("abi", range(1, 8))
def test_native_and_python_paths_install_the_same_policy(observe: Any, kernel_abi: int, abi: int) -> None:
    _can_read_filters()
    native, python = observe("1", abi), observe("0", abi)
    for mode in _CASES:
        a, b = native[mode], python[mode]
        # The main filter for this mode with the own-process filter merged in, one program (a container's or the
        # host's own beside it): it holds each job's pid, masked where the two programs differ.
        assert len(a["filters"]) >= 1 and len(a["filters"]) == len(b["filters"]), mode
        newest = a["filters"][0]
        assert any(int.from_bytes(newest[offset + 4:offset + 8], sys.byteorder) == a["pid"]
                   for offset in range(0, len(newest), 8)), mode
        for mine, theirs in zip(a["filters"], b["filters"], strict=True):
            assert _same_program(mine, a["pid"], theirs, b["pid"]), mode
        assert a["proc"] == b["proc"], mode
        # Printed whole when they differ: which call differs is what a reader of CI's log needs.
        assert _same_calls(a["calls"], a["pid"], b["calls"], b["pid"]), (mode, a["pid"], b["pid"], a["calls"],
                                                                          b["calls"])
        # The display channel is among the job's descriptors (by number: the facts went through JSON), on both sides.
        assert "10" in a["proc"]["descriptors"], a["proc"]["descriptors"]
        if mode == "session":
            continue
        added = [call for call in a["calls"] if call.startswith("landlock_add_rule(")]
        # Each rule's descriptor named a path: the runtime's, the grants and the job's own /proc entries.
        assert added and all("<" in call for call in added), added
        assert any(procfs.path("PID", "status") in call for call in added), added
    # A session's child catches the pool's interrupt signal, unblocked; a plain job's ignores it.
    for side in (native, python):
        session, plain = side["session"]["proc"]["status"], side["none"]["proc"]["status"]
        assert int(session["SigCgt"], 16) & _INTERRUPT_BIT and not int(session["SigBlk"], 16) & _INTERRUPT_BIT
        assert int(plain["SigIgn"], 16) & _INTERRUPT_BIT and not int(plain["SigCgt"], 16) & _INTERRUPT_BIT
    # The child prepared ahead: the same facts (its outputs, report and display channel are /dev/null), and
    # the same programs.
    a, b = native["none"], python["none"]
    assert a["ready"] == b["ready"], {key: (a["ready"][key], b["ready"][key]) for key in a["ready"]
                                      if a["ready"][key] != b["ready"][key]}
    assert a["ready"]["descriptors"]["10"][0] == "/dev/null", a["ready"]["descriptors"]
    for mine, theirs in zip(a["ready_filters"], b["ready_filters"], strict=True):
        assert _same_program(mine, a["ready_pid"], theirs, b["ready_pid"])
    # The modes differ where they should: the same path does not simply install one thing everywhere.
    assert native["none"]["filters"][0] != native["all"]["filters"][0] != native["hosts"]["filters"][0]


def _program(*constants: int) -> bytes:
    return b"".join(b"\x15\x00\x01\x00" + k.to_bytes(4, sys.byteorder) for k in constants)


def test_a_pid_equal_to_a_call_number_is_told_from_it() -> None:
    """After a wrap at pid_max 32768 a job's pid can equal a system call's number in the programs (302 is
    prlimit64 on x86_64): only the pid's own place may differ, and only by being each side's pid."""
    assert _same_program(_program(302, 7001, (-7001) & 0xFFFFFFFF), 7001, _program(302, 302, (-302) & 0xFFFFFFFF), 302)
    assert not _same_program(_program(302, 7001), 7001, _program(303, 302), 302)
    assert not _same_program(_program(302, 7001), 7001, _program(302, 303), 302)  # a pid is not any number
    assert not _same_program(_program(7001), 7001, _program((-302) & 0xFFFFFFFF), 302)  # pid for -pid
    assert _same_calls(["seccomp(0x12e, 0x1b59)"], 7001, ["seccomp(0x12e, 0x12e)"], 302)
    assert not _same_calls(["seccomp(0x1b59, 0x1b59)"], 7001, ["seccomp(0x12e, 0x12f)"], 302)
    assert _same_calls(None, 1, None, 2) and not _same_calls(None, 1, [], 2)


@pytest.mark.parametrize("value", ["2", "yes", "native"])
def test_a_pool_refuses_a_pynox_native_it_does_not_know(value: str) -> None:
    done = subprocess.run([sys.executable, "-m", "pynox", "pool"], input="", capture_output=True, text=True,
                          env={**own_commands_env(), "PYNOX_NATIVE": value}, timeout=120, check=False)
    first = json.loads(done.stdout.splitlines()[0])
    assert first["event"] == "error" and first["error"]["type"] == "ConfigError", first
    assert first["error"]["message"] == (f"$PYNOX_NATIVE must be 0 (the Python steps) or 1 (the native call), "
                                         f"got {value!r}"), first
    assert done.returncode != 0


def _load_error_of(package: Path, extension: str) -> str:
    """Why ``package``'s extension (``policy._confine``, ``template._fork_loop``) is not used, as pynox/extensions.py
    says it imported from there in a fresh interpreter ("None": it is)."""
    parent, _, name = extension.rpartition(".")
    done = subprocess.run([sys.executable, "-c", f"from pynox import extensions; "
                                                 f"print(extensions.load('pynox.{parent}', {name!r})[1])"],
                          capture_output=True, text=True, timeout=120, check=True,
                          env={**os.environ, "PYTHONPATH": str(package.parent)})
    return done.stdout.strip()


@pytest.mark.parametrize("extension", ["policy._confine", "template._fork_loop"])
@pytest.mark.parametrize("edit", ["none", "touched", "changed", "changed, its old times kept"])
def test_an_extension_built_from_another_source_is_not_used(tmp_path: Path, edit: str, extension: str) -> None:
    """An editable install whose C source changed since its build (a checkout, an edit) would pass the new
    Python's arguments to the old C: the extension is then not loaded, and says why, whatever the source's times
    say (``cp -p``, tar and an older file's checkout keep a source older than the build). The same source, only
    written again (a checkout of the same text), is still used."""
    import pynox

    parent, _, name = extension.rpartition(".")
    installed = Path(pynox.__file__).parent
    beside = (installed / parent / f"{name}.c").exists()
    if _load_error_of(installed.parent / "pynox", extension) != "None" or not beside:
        pytest.skip(f"{extension} does not load here, or no source is beside it (a wheel)")
    package = tmp_path / "pynox"
    shutil.copytree(installed, package, ignore=shutil.ignore_patterns("__pycache__"))
    source = package / parent / f"{name}.c"
    built = package / parent / f"{name}{sysconfig.get_config_var('EXT_SUFFIX')}"  # this interpreter's build
    os.utime(source, ns=(built.stat().st_mtime_ns - 10**9,) * 2)  # the copy keeps no order between the two
    if edit == "touched":
        os.utime(source, ns=(built.stat().st_mtime_ns + 10**9,) * 2)
    if edit.startswith("changed"):
        source.write_bytes(source.read_bytes() + b"/* an edit since the build */\n")
    if edit == "changed, its old times kept":
        os.utime(source, ns=(built.stat().st_mtime_ns - 10**9,) * 2)
    said = _load_error_of(package, extension)
    if edit.startswith("changed"):
        assert said == (f"{built.name} was built from another {name}.c than the one beside it (rebuild it: "
                        "pip install -e packages/pynox-core)"), said
    else:
        assert said == "None", said


_BUILD_IN_PLACE = """
import sys, setuptools
sys.argv = ["setup.py", "-q", "build_ext", "--inplace"]
build = setuptools.setup
setuptools.setup = lambda **kw: build(package_dir={"": "src"}, packages=[], **kw)
exec(compile(open("setup.py").read(), "setup.py", "exec"), {"__file__": "setup.py", "__name__": "__main__"})
"""


def _loaded_here(package: Path, extension: str) -> tuple[str, bool]:
    """As :func:`_load_error_of`, and whether the loader read and hashed the source (imported hashlib)."""
    parent, _, name = extension.rpartition(".")
    done = subprocess.run([sys.executable, "-c", f"import sys; from pynox import extensions; "
                                                 f"print(extensions.load('pynox.{parent}', {name!r})[1]); "
                                                 "print('hashlib' in sys.modules)"],
                          capture_output=True, text=True, timeout=120, check=True,
                          env={**os.environ, "PYTHONPATH": str(package.parent)})
    said, hashed = done.stdout.splitlines()
    return said, hashed == "True"


@pytest.mark.parametrize("extension", ["policy._confine", "template._fork_loop"])
def test_the_source_the_build_hashed_is_trusted_only_while_unchanged(tmp_path: Path, extension: str) -> None:
    """Built in place (as an editable install builds), the source beside the extension is the file the build
    hashed: while it is unchanged, loading stats it and reads nothing (control: no hash). The same file rewritten
    in place, with the same size and its old times put back (what ``cp -p`` over it does), is hashed again and
    refused."""
    import pynox

    project = Path(pynox.__file__).parents[2]
    if not (project / "setup.py").exists() or shutil.which("cc") is None:
        pytest.skip("no checkout with setup.py here, or no C compiler")
    # A venv of Python 3.12 or later has no setuptools (pip builds the package in an isolated environment of its
    # own): the build this test makes needs it here. The main run's 3.11 venv has it; the 3.12 and 3.13 legs skip.
    pytest.importorskip("setuptools", reason="this interpreter's environment has no setuptools to build with")
    copy = tmp_path / "core"
    shutil.copytree(project / "src", copy / "src", ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    shutil.copy(project / "setup.py", copy)
    # setup.py's own build, in place, without pyproject.toml (whose metadata this venv's setuptools may not read).
    subprocess.run([sys.executable, "-c", _BUILD_IN_PLACE], cwd=copy, check=True, capture_output=True, timeout=300)
    package = copy / "src" / "pynox"
    parent, _, name = extension.rpartition(".")
    source = package / parent / f"{name}.c"
    assert _loaded_here(package, extension) == ("None", False)
    text, held = source.read_bytes(), source.stat()
    edited = text.replace(b"/*", b"//", 1)  # the same size
    assert edited != text and len(edited) == len(text)
    with open(source, "r+b") as same_file:
        same_file.write(edited)
    os.utime(source, ns=(held.st_atime_ns, held.st_mtime_ns))
    assert source.stat().st_ino == held.st_ino and source.stat().st_mtime_ns == held.st_mtime_ns
    built = package / parent / f"{name}{sysconfig.get_config_var('EXT_SUFFIX')}"
    assert _loaded_here(package, extension) == (
        f"{built.name} was built from another {name}.c than the one beside it (rebuild it: "
        "pip install -e packages/pynox-core)", True)
