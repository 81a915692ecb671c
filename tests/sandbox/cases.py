"""Escape cases as data: what a job tries, how the sandbox must refuse it, and the control that shows why.

Each :class:`Case` runs twice:

* **denied**: confined as ``request`` says; ``denied`` says how it must fail,
  and on top of it every denied run must leave the world exactly as it was
  (see ``test_escapes.py``: nothing outside the grants changed, the canary
  token and the host secret absent from the whole result, the template alive);
* **control**: the same code (or ``control_code``) either confined with the
  matching grant (``grant`` merged into ``request``) or, when no grant exists
  for it (starting processes, kernel attack surface), in a plain interpreter
  with the test's own powers (``grant=None``). The control must succeed, so
  the denial provably comes from the policy and not from a broken case.
  A control that only root can run (``control_needs_root`` says why) is
  skipped for any other user; the denial beside it runs for everyone.

``$name`` in code stands for a value of :meth:`harness.World.values`.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import struct
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.harness import procfs

from .harness import Run, World

HostCheck = Callable[[World, Run], None]


@dataclass(frozen=True)
class Expect:
    exit: int | None = 0  # None: not checked
    error: tuple[str, ...] = ()  # acceptable error.type values; empty: no error (confined runs only)
    hint: tuple[str, ...] = ()  # substrings of error.hint
    stdout: tuple[str, ...] = ()  # substrings of stdout
    stderr: tuple[str, ...] = ()  # substrings of stderr
    host: HostCheck | None = None  # what the test observes from outside after the run


@dataclass(frozen=True)
class Case:
    id: str
    rule: str  # the rule of docs/sandbox-contract.md this case proves
    code: str
    denied: Expect
    control: Expect
    request: dict[str, Any] = field(default_factory=dict)
    grant: dict[str, Any] | None = None  # None: the control runs unconfined
    control_code: str | None = None
    needs: tuple[str, ...] = ()  # "landlock:6", "ipv6", "home_canary", "syscall:NAME": both runs need it
    control_needs: tuple[str, ...] = ()  # what the control alone needs beyond ``needs`` ("unfiltered": no
    # outer seccomp filter, such as a container's profile, refusing the call to the control too)
    control_needs_root: str | None = None  # why the control shows the harm only as root (the denial runs for all)
    prepare: Callable[[World], None] | None = None  # arranges the world before either run

    def source(self, world: World, *, control: bool = False) -> str:
        from string import Template

        code = self.control_code if control and self.control_code is not None else self.code
        return Template(textwrap.dedent(code)).substitute({k: str(v) for k, v in world.values().items()})


# A job that calls chmod on a path another of its threads keeps rewriting between its own file and the
# canary; {tries} is the loop header around the call.
_REWRITTEN_PATH = """\
import ctypes, os, threading, time
libc = ctypes.CDLL(None, use_errno=True)
mine, canary = b"$work/mine.txt\\0", b"$canary\\0"
path = ctypes.create_string_buffer(max(len(mine), len(canary)))
stop = []
def rewrite():
    while not stop:
        ctypes.memmove(path, canary, len(canary))
        ctypes.memmove(path, mine, len(mine))
writer = threading.Thread(target=rewrite)
writer.start()
{tries}
    libc.chmod(path, 0o777)
stop.append(True)
writer.join()
print("done")
"""


# A job makes the kernel signal {owner}'s target for it, by writing to a socketpair whose reading end has
# that owner, SIGKILL as its signal and O_ASYNC set.
_SIGNAL_BY_OWNER = """\
import fcntl, os, signal, socket, struct, time
r, w = socket.socketpair()
{owner}
fcntl.fcntl(r, 10, signal.SIGKILL)  # F_SETSIG
fcntl.fcntl(r, fcntl.F_SETFL, fcntl.fcntl(r, fcntl.F_GETFL) | os.O_ASYNC)
w.send(b"x")
time.sleep(0.2)
"""


# Expectations shared by many cases ---------------------------------------------------------------

PERMISSION = ("PermissionError",)
READ_HINT = 'allow_read=["$canary"]'  # formatted per world by the runner
PROCESS_HINT = ("process",)
NETWORK_HINT = ("allow_network=True",)
METADATA_HINT = ("permissions", "no grant allows it")
# Why a control needs root, where the kernel refuses an ordinary user the harm itself.
GIVE_AWAY = "only CAP_CHOWN may give a file to another owner: the kernel refuses an ordinary user's control"


def _denied(*hint: str, error: tuple[str, ...] = PERMISSION, host: HostCheck | None = None) -> Expect:
    return Expect(exit=1, error=error, hint=hint, host=host)


def _works(*stdout: str, host: HostCheck | None = None) -> Expect:
    return Expect(exit=0, stdout=stdout, host=host)


def _not_permission(world: World, run: Run) -> None:
    # Unconfined, the call may fail for its bogus arguments (EFAULT, EINVAL...), never for permission.
    assert "PermissionError" not in run.result.stderr, run.result.stderr


def _marker_absent(world: World, run: Run) -> None:
    assert not world.marker.exists(), "the side effect happened: a process was started"


def _marker_present(world: World, run: Run) -> None:
    assert world.marker.exists(), f"the control did not start the process: {run.result.stderr}"


def _some_interfaces(world: World, run: Run) -> None:
    assert int(run.result.stdout.split()[-1]) >= 1, run.result.stdout


# sysinfo(2) through ctypes: the fields a job could learn the host by (struct sysinfo of <linux/sysinfo.h>).
_SYSINFO_MEMORY = 256 << 20
# A system call made the i386 way (int 0x80) from the x86-64 job: the filter must answer it ENOSYS whatever it is,
# before any rule on its (i386) number; the own-process checks go on to the main filter's for another ABI.
# CALL is the call's i386 number and arguments. Unconfined, the kernel answers it (IA32 emulation).
_INT80 = """\
import ctypes, mmap, os, signal
def int80(nr, *args):
    regs = b"".join(op + (arg & 0xFFFFFFFF).to_bytes(4, "little")
                    for op, arg in zip((b"\\xbb", b"\\xb9", b"\\xba"), (*args, 0, 0, 0)))  # mov ebx, ecx, edx
    code = b"\\x53\\xb8" + nr.to_bytes(4, "little") + regs + b"\\xcd\\x80\\x5b\\xc3"  # push rbx; mov eax; int 0x80; ...
    page = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    page.write(code)
    return ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(page)))()
answer = int80(CALL)
print("int80", "ENOSYS" if answer == -38 else "answered own pid" if answer == os.getpid() else f"answered {answer}")
"""


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
unit = info.mem_unit
print("sysinfo", info.totalram * unit, info.freeram * unit, info.totalswap * unit, info.procs, info.uptime,
      *info.loads)
import os  # glibc answers these from sysinfo
print("sysconf", os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), os.sysconf("SC_AVPHYS_PAGES"))
"""


def _sysinfo_fields(run: Run) -> dict[str, int]:
    line = next(line for line in run.result.stdout.splitlines() if line.startswith("sysinfo "))
    names = ("totalram", "freeram", "totalswap", "procs", "uptime", "load1", "load5", "load15")
    return dict(zip(names, map(int, line.split()[1:]), strict=True))


def _sysconf_memory(run: Run) -> tuple[int, int]:
    line = next(line for line in run.result.stdout.splitlines() if line.startswith("sysconf "))
    physical, available = map(int, line.split()[1:])
    return physical, available


def _host_meminfo_bytes(field: str) -> int:
    for line in procfs.machine("meminfo").splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} in /proc/meminfo")


def _host_uptime() -> float:
    return float(procfs.machine("uptime").split()[0])


def _own_view(world: World, run: Run) -> None:
    """The job saw its own memory limit, its own threads and age, and no load: nothing of the host's."""
    seen = _sysinfo_fields(run)
    assert seen["totalram"] == _SYSINFO_MEMORY, f"totalram is not the job's limit: {seen}"
    assert seen["totalram"] != _host_meminfo_bytes("MemTotal"), seen
    assert 0 < seen["freeram"] < seen["totalram"], seen
    assert seen["totalswap"] == 0 and (seen["load1"], seen["load5"], seen["load15"]) == (0, 0, 0), seen
    assert 1 <= seen["procs"] <= 4, f"procs counts more than the job's threads: {seen}"
    # The job's age (a host booted less than a minute ago would pass this too: the lines above still fail it).
    assert seen["uptime"] < 60, f"uptime is not the job's age: {seen}"
    physical, available = _sysconf_memory(run)
    assert physical == _SYSINFO_MEMORY and available > 0, f"os.sysconf: {physical} bytes, {available} pages free"


def _host_view(world: World, run: Run) -> None:
    seen = _sysinfo_fields(run)
    assert seen["totalram"] == _host_meminfo_bytes("MemTotal"), f"the control did not see the host's RAM: {seen}"
    assert abs(seen["uptime"] - _host_uptime()) < 60, seen
    physical, _ = _sysconf_memory(run)
    assert abs(physical - _host_meminfo_bytes("MemTotal")) < os.sysconf("SC_PAGE_SIZE"), physical


def _readonly_intact(world: World, run: Run) -> None:
    assert (world.readonly / "data.txt").read_text() == "readonly data", "a read-only grant was truncated"


def _readonly_cut(world: World, run: Run) -> None:
    assert (world.readonly / "data.txt").read_text() != "readonly data", "the control did not truncate"


def _sleeper_alive(world: World, run: Run) -> None:
    assert world.sleeper_alive(), "the job killed a process outside the sandbox"


def _sleeper_killed(world: World, run: Run) -> None:
    assert world.sleeper_exited(), "the unconfined control could not kill the sleeper"


def _stop_sleeper(world: World) -> None:
    world.stop_sleeper()


def _sleeper_stopped(world: World, run: Run) -> None:
    assert world.sleeper_state() == "T", "a signal from the job reached a process outside the sandbox"


def _sleeper_running(world: World, run: Run) -> None:
    assert world.sleeper_state() in ("S", "R"), world.sleeper_state()


def _nofile_unchanged(world: World, run: Run) -> None:
    assert " 5 " not in world.sleeper_limit("Max open files"), "the job changed another process's limits"


def _nofile_changed(world: World, run: Run) -> None:
    assert " 5 " in world.sleeper_limit("Max open files")


def _no_tcp(world: World, run: Run) -> None:
    assert world.accepted(world.tcp) is None, "the listener saw a connection"


def _tcp_hello(world: World, run: Run) -> None:
    assert world.accepted(world.tcp) == b"hello"


def _no_tcp6(world: World, run: Run) -> None:
    assert world.tcp6 is not None and world.accepted(world.tcp6) is None


def _tcp6_hello(world: World, run: Run) -> None:
    assert world.tcp6 is not None and world.accepted(world.tcp6) == b"hello"


def _no_udp(world: World, run: Run) -> None:
    assert world.datagram() is None, "the UDP listener received a datagram"


def _udp_hello(world: World, run: Run) -> None:
    assert world.datagram() == b"hello"


def _no_unix(world: World, run: Run) -> None:
    assert world.accepted(world.unix) is None


def _unix_hello(world: World, run: Run) -> None:
    assert world.accepted(world.unix) == b"hello"


def _no_abstract(world: World, run: Run) -> None:
    assert world.accepted(world.abstract) is None


def _abstract_hello(world: World, run: Run) -> None:
    assert world.accepted(world.abstract) == b"hello"


def _file(path_of: Callable[[World], Any], *, exists: bool) -> HostCheck:
    def check(world: World, run: Run) -> None:
        assert path_of(world).exists() == exists, f"{path_of(world)} exists={not exists}"

    return check


def _canary_is(content: str) -> HostCheck:
    def check(world: World, run: Run) -> None:
        assert world.canary.read_text() == content

    return check


def _canary_appended(world: World, run: Run) -> None:
    assert world.canary.read_text() == world.token + "pwned"


def _canary_mode_changed(world: World, run: Run) -> None:
    assert world.canary.stat().st_mode & 0o777 == 0o777


def _set_id(name: str) -> HostCheck:
    def check(world: World, run: Run) -> None:
        assert (world.work / name).stat().st_mode & (stat.S_ISUID | stat.S_ISGID), "the control made no set-id file"
        (world.work / name).unlink()

    return check


_NOATIME = 0x80


def _inode_flags(path: Path) -> int:
    fd = os.open(path, os.O_RDONLY)
    try:
        return struct.unpack("l", fcntl.ioctl(fd, 0x80086601, struct.pack("l", 0)))[0]
    finally:
        os.close(fd)


def _readonly_flags_kept(world: World, run: Run) -> None:
    assert not _inode_flags(world.readonly / "data.txt") & _NOATIME


def _readonly_flags_changed(world: World, run: Run) -> None:
    path = world.readonly / "data.txt"
    assert _inode_flags(path) & _NOATIME, "the control set no flag"
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.ioctl(fd, 0x40086602, struct.pack("l", _inode_flags(path) & ~_NOATIME))
    finally:
        os.close(fd)


def _set_id_in_work(world: World, run: Run) -> None:
    found = [path for path in world.work.iterdir() if path.is_file() and path.stat().st_mode & 0o6000]
    assert found, "the control made no set-id file"
    for path in found:
        path.unlink()


def _no_set_id_in_work(world: World, run: Run) -> None:
    found = [path for path in world.work.iterdir() if path.is_file() and path.stat().st_mode & 0o6000]
    assert not found, [oct(path.stat().st_mode) for path in found]


def _work_owned_by_the_test(world: World, run: Run) -> None:
    assert all(path.lstat().st_uid == os.geteuid() for path in world.work.iterdir())


def _given_away(world: World, run: Run) -> None:
    given = [path for path in world.work.iterdir() if path.lstat().st_uid == 4242]
    assert given, "the control gave no file away"
    for path in given:
        path.unlink()


def _no_set_id(name: str) -> HostCheck:
    def check(world: World, run: Run) -> None:
        path = world.work / name
        assert not path.exists() or not path.stat().st_mode & (stat.S_ISUID | stat.S_ISGID), oct(path.stat().st_mode)
        path.unlink(missing_ok=True)

    return check


# Filesystem: Landlock ----------------------------------------------------------------------------

FILESYSTEM = [
    Case("read_canary", "landlock.read",
         'print(open("$canary").read())',
         _denied(READ_HINT), _works("$token"), grant={"allow_read": ["$outside"]}),
    Case("list_outside_dir", "landlock.read",
         'import os; print(os.listdir("$outside"))',
         _denied("allow_read"), _works("canary.txt"), grant={"allow_read": ["$outside"]}),
    Case("read_nested_outside", "landlock.read",
         'print(open("$outside/sub/nested.txt").read())',
         _denied("allow_read"), _works("$token"), grant={"allow_read": ["$outside"]}),
    Case("overwrite_canary", "landlock.write",
         'open("$canary", "w").write("pwned")',
         _denied("allow_write"), _works(host=_canary_is("pwned")), grant={"allow_write": ["$outside"]}),
    Case("append_canary", "landlock.write",
         'open("$canary", "a").write("pwned")',
         _denied("allow_write"), _works(host=_canary_appended), grant={"allow_write": ["$outside"]}),
    Case("create_outside", "landlock.write",
         'open("$outside/new.txt", "w").write("x")',
         _denied("allow_write"), _works(host=_file(lambda w: w.outside / "new.txt", exists=True)),
         grant={"allow_write": ["$outside"]}),
    Case("mkdir_outside", "landlock.write",
         'import os; os.mkdir("$outside/newdir")',
         _denied("allow_write"), _works(host=_file(lambda w: w.outside / "newdir", exists=True)),
         grant={"allow_write": ["$outside"]}),
    Case("delete_canary", "landlock.write",
         'import os; os.remove("$canary")',
         _denied("allow_write"), _works(host=_file(lambda w: w.canary, exists=False)),
         grant={"allow_write": ["$outside"]}),
    Case("truncate_canary", "landlock.write",
         'import os; os.truncate("$canary", 0)',
         _denied("allow_write"), _works(host=_canary_is("")), grant={"allow_write": ["$outside"]},
         needs=("landlock:3",)),
    # Below ABI 3 Landlock does not govern truncation: seccomp refuses it by name, and a read-only open with
    # O_TRUNC, at those ABIs (the controls run with the test's own powers, which a write grant below ABI 3
    # does not give: truncating by name is refused there even inside one).
    Case("truncate_outside_any_abi", "seccomp.truncate",
         'import os; os.truncate("$canary", 0)',
         _denied(), _works(host=_canary_is(""))),
    Case("truncate_read_grant", "seccomp.truncate",
         'import os; os.truncate("$readonly/data.txt", 3)',
         _denied(host=_readonly_intact), _works(host=_readonly_cut), request={"allow_read": ["$readonly"]}),
    # Access mode 3 opens for neither reading nor writing, so Landlock below ABI 3 asks for no right at all.
    Case("open_ioctl_only_truncating", "seccomp.truncate",
         'import os; os.close(os.open("$readonly/data.txt", os.O_ACCMODE | os.O_TRUNC))',
         _denied(host=_readonly_intact), _works(host=_readonly_cut), request={"allow_read": ["$readonly"]}),
    Case("open_read_only_truncating", "seccomp.truncate",
         'import os; os.close(os.open("$readonly/data.txt", os.O_RDONLY | os.O_TRUNC))',
         _denied(host=_readonly_intact), _works(host=_readonly_cut), request={"allow_read": ["$readonly"]}),
    Case("write_into_read_grant", "landlock.read_only",
         'open("$readonly/data.txt", "w").write("pwned")',
         _denied("readable but not writable", 'allow_write=["$readonly/data.txt"]'),
         _works(), request={"allow_read": ["$readonly"]}, grant={"allow_write": ["$readonly"]}),
    Case("dotdot_absolute", "landlock.dotdot",
         'print(open("$work/../outside/canary.txt").read())',
         _denied(READ_HINT), _works("$token"),
         request={"allow_write": ["$work"]}, grant={"allow_read": ["$outside"]}),
    Case("dotdot_relative", "landlock.dotdot",
         'import os; os.chdir("$work"); print(open("../outside/canary.txt").read())',
         _denied(READ_HINT), _works("$token"),
         request={"allow_write": ["$work"]}, grant={"allow_read": ["$outside"]}),
    Case("symlink_made_inside", "landlock.symlink",
         'import os; os.symlink("$canary", "$work/link"); print(open("$work/link").read())',
         _denied(READ_HINT), _works("$token"),
         request={"allow_write": ["$work"]}, grant={"allow_read": ["$outside"]}),
    Case("symlink_dir_made_inside_write", "landlock.symlink",
         'import os; os.symlink("$outside", "$work/door"); open("$work/door/canary.txt", "w").write("pwned")',
         _denied("allow_write"), _works(host=_canary_is("pwned")),
         request={"allow_write": ["$work"]}, grant={"allow_write": ["$work", "$outside"]}),
    # Below ABI 2 (refer) Landlock refuses every link or rename across directories, even between two write
    # grants (EXDEV): the denials hold at every ABI, the granted controls need ABI 2.
    Case("hardlink_into_grant", "landlock.hardlink",
         'import os; os.link("$canary", "$work/hard"); print(open("$work/hard").read())',
         _denied("hard-linked", error=("OSError",), host=_file(lambda w: w.work / "hard", exists=False)),
         _works("$token"), request={"allow_write": ["$work"]}, grant={"allow_write": ["$work", "$outside"]},
         control_needs=("landlock:2",)),
    Case("rename_into_grant", "landlock.rename",
         'import os; os.rename("$canary", "$work/stolen"); print(open("$work/stolen").read())',
         _denied("allow_write", host=_file(lambda w: w.work / "stolen", exists=False)),
         _works("$token"), request={"allow_write": ["$work"]}, grant={"allow_write": ["$work", "$outside"]},
         control_needs=("landlock:2",)),
    Case("rename_out_of_grant", "landlock.rename",
         'import os; os.rename("$work/mine.txt", "$outside/dropped.txt")',
         _denied(host=_file(lambda w: w.work / "mine.txt", exists=True)),
         _works(host=_file(lambda w: w.outside / "dropped.txt", exists=True)),
         request={"allow_write": ["$work"]}, grant={"allow_write": ["$work", "$outside"]},
         control_needs=("landlock:2",)),
    Case("etc_passwd", "landlock.host",
         'print(open("/etc/passwd").read())',
         _denied('allow_read=["/etc/passwd"]'), _works("root:"), grant={"allow_read": ["/etc/passwd"]}),
    Case("fake_home_key", "landlock.host",
         'print(open("$fake_home/.ssh/id_rsa").read())',
         _denied("allow_read"), _works("$token"), grant={"allow_read": ["$fake_home"]}),
    Case("real_home_file", "landlock.host",
         'print(open("$home_canary").read())',
         _denied("allow_read"), _works("$token"), grant={"allow_read": ["$home_canary"]}, needs=("home_canary",)),
    Case("real_home_listing", "landlock.host",
         'import os; print(os.listdir("$real_home"))',
         _denied("allow_read"), _works(".pynox-test-canary-"), grant={"allow_read": ["$real_home"]},
         needs=("home_canary",)),
    Case("parent_proc_environ", "landlock.proc",
         'import os; print(len(open(f"/proc/{os.getppid()}/environ").read()) > 0)',
         _denied(), _works("True")),
    Case("runtime_not_writable", "landlock.runtime",
         'import os; open(os.__file__, "a").write("# pwned")',
         _denied(), _works("import"), control_code='import os; print(open(os.__file__).read())',
         grant={}),
]

_CTYPES = """\
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def check(result):
    if result == -1:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return result
"""


# File metadata: seccomp (Landlock does not govern it) ----------------------------------------------

METADATA = [
    Case("chmod_canary", "seccomp.metadata",
         'import os; os.chmod("$canary", 0o777)',
         _denied(*METADATA_HINT), _works(host=_canary_mode_changed)),
    Case("fchmod_read_grant", "seccomp.metadata",
         'import os; fd = os.open("$readonly/data.txt", os.O_RDONLY); os.fchmod(fd, 0o4777)',
         _denied(*METADATA_HINT), _works(), request={"allow_read": ["$readonly"]}),
    Case("chown_canary", "seccomp.metadata",
         'import os; os.chown("$canary", 0, 0)',
         _denied(*METADATA_HINT), _works(), control_needs_root=GIVE_AWAY),
    Case("file_flags_read_grant", "seccomp.metadata",
         'import fcntl, os, struct\nfd = os.open("$readonly/data.txt", os.O_RDONLY)\n'
         'flags = struct.unpack("l", fcntl.ioctl(fd, 0x80086601, struct.pack("l", 0)))[0]\n'
         'fcntl.ioctl(fd, 0x40086602, struct.pack("l", flags | 0x80))',
         _denied(*METADATA_HINT, host=_readonly_flags_kept), _works(host=_readonly_flags_changed),
         request={"allow_read": ["$readonly"]}),
    Case("setxattr_canary", "seccomp.metadata",
         'import os; os.setxattr("$canary", "user.pynox", b"1")',
         _denied(*METADATA_HINT), _works()),
    Case("utime_canary", "seccomp.metadata",
         'import os; os.utime("$canary", (0, 0))',
         _denied(*METADATA_HINT), _works()),
    # The pool performs these calls on the job's behalf, only for files beneath a write grant: every way
    # of naming a file outside one must still be refused, with the harm checked from the host.
    Case("utime_now_canary", "seccomp.metadata",
         'import os; os.utime("$canary")',
         _denied(*METADATA_HINT), _works()),
    Case("chmod_through_planted_symlink", "seccomp.metadata",
         'import os; link = f"$work/link-{os.getpid()}"; os.symlink("$canary", link); os.chmod(link, 0o777)',
         _denied(*METADATA_HINT), _works(host=_canary_mode_changed), request={"allow_write": ["$work"]}),
    Case("chmod_dirfd_dotdot", "seccomp.metadata",
         'import os; fd = os.open("$work", os.O_RDONLY); os.chmod("../outside/canary.txt", 0o777, dir_fd=fd)',
         _denied(*METADATA_HINT), _works(host=_canary_mode_changed), request={"allow_write": ["$work"]}),
    # Landlock does not check an O_PATH open: the job can hold a descriptor of any file it can name.
    Case("fchmod_o_path_descriptor", "seccomp.metadata",
         'import os; fd = os.open("$canary", os.O_PATH); os.chmod(fd, 0o777)',
         _denied(error=("OSError",)), _works(host=_canary_mode_changed), request={"allow_write": ["$work"]},
         control_code='import os; fd = os.open("$canary", os.O_PATH); os.chmod(f"/proc/self/fd/{fd}", 0o777)'),
    Case("chmod_proc_self_fd_link", "seccomp.metadata",
         'import os; fd = os.open("$canary", os.O_PATH); os.chmod(f"/proc/self/fd/{fd}", 0o777)',
         _denied(error=("PermissionError", "OSError")), _works(host=_canary_mode_changed),
         request={"allow_write": ["$work"]}),
    Case("utimensat_empty_path", "seccomp.metadata",
         _CTYPES + 'fd = os.open("$canary", os.O_PATH)\ncheck(libc.utimensat(fd, b"", None, 0x1000))',
         _denied(*METADATA_HINT, error=("OSError", "PermissionError")), _works(),
         request={"allow_write": ["$work"]}),
    Case("chmod_hard_link_to_outside", "seccomp.metadata",
         'import os; link = f"$work/hard-{os.getpid()}"; os.link("$canary", link); os.chmod(link, 0o777)',
         _denied(error=("PermissionError", "OSError")), _works(host=_canary_mode_changed),
         request={"allow_write": ["$work"]}),
    Case("chmod_setuid_own_file", "seccomp.metadata",
         'import os; path = f"$work/own-{os.getpid()}"; open(path, "w").close(); os.chmod(path, 0o4755)',
         _denied(*METADATA_HINT, host=_no_set_id_in_work), _works(host=_set_id_in_work),
         request={"allow_write": ["$work"]}),
    Case("chmod_setgid_own_file", "seccomp.metadata",
         'import os; path = f"$work/own-{os.getpid()}"; open(path, "w").close(); os.chmod(path, 0o2755)',
         _denied(*METADATA_HINT, host=_no_set_id_in_work), _works(host=_set_id_in_work),
         request={"allow_write": ["$work"]}),
    Case("chown_own_file_to_another_user", "seccomp.metadata",
         'import os; path = f"$work/given-{os.getpid()}"; open(path, "w").close(); os.chown(path, 4242, 4242)',
         _denied(*METADATA_HINT, host=_work_owned_by_the_test), _works(host=_given_away),
         request={"allow_write": ["$work"]}, control_needs_root=GIVE_AWAY),
    # The pool reads the path from the job's memory while another thread rewrites it: whatever it read,
    # the change happens only if that file is in the write grant.
    Case("chmod_path_rewritten_meanwhile", "seccomp.metadata",
         _REWRITTEN_PATH.format(tries="for _ in range(3000):"),
         Expect(exit=0, stdout=("done",)), _works("done", host=_canary_mode_changed),
         request={"allow_write": ["$work"]},
         # Unconfined, the race is won sooner or later; on a loaded machine 3,000 tries may all lose it,
         # so the control tries until it wins (10 s at most): it proves the harm is possible.
         control_code=_REWRITTEN_PATH.format(
             tries="deadline = time.monotonic() + 10\n"
                   "while os.stat('$canary').st_mode & 0o777 != 0o777 and time.monotonic() < deadline:")),
    # Whoever holds a filter's listener answers its calls, and may let them run unchecked: a job must never
    # have a listener of its own (the newest filter's answer would win over the pool's).
    Case("own_seccomp_listener", "seccomp.metadata",
         _CTYPES + "libc.prctl(38, 1, 0, 0, 0)\n"
         "allow = (ctypes.c_uint16 * 4)(0x06, 0, 0, 0)\n"
         "allow_k = ctypes.c_uint32.from_address(ctypes.addressof(allow) + 4); allow_k.value = 0x7FFF0000\n"
         "class Prog(ctypes.Structure):\n"
         "    _fields_ = [('len', ctypes.c_ushort), ('filter', ctypes.c_void_p)]\n"
         "prog = Prog(1, ctypes.addressof(allow))\n"
         "print('listener', check(libc.syscall($nr_seccomp, 1, 8, ctypes.byref(prog))))",
         _denied(error=("PermissionError",)), _works("listener")),
    # A write grant is for contents: a file the job creates there must not be a setuid or setgid program
    # of the pool's uid (often root), which any user of the host could then run.
    Case("create_setuid_file", "seccomp.metadata",
         'import os; os.close(os.open("$work/suid", os.O_CREAT | os.O_WRONLY, 0o4755))',
         _denied(*METADATA_HINT, host=_no_set_id("suid")), _works(host=_set_id("suid")),
         request={"allow_write": ["$work"]}),
    Case("create_setgid_file", "seccomp.metadata",
         'import os; os.close(os.open("$work/sgid", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o2755))',
         _denied(*METADATA_HINT, host=_no_set_id("sgid")), _works(host=_set_id("sgid")),
         request={"allow_write": ["$work"]}),
    Case("creat_setuid_file", "seccomp.metadata",
         _CTYPES + 'check(libc.creat(b"$work/creat", 0o6755))',
         _denied(*METADATA_HINT, error=("OSError", "PermissionError"), host=_no_set_id("creat")),
         _works(host=_set_id("creat")), request={"allow_write": ["$work"]}),
    Case("mknod_setuid_file", "seccomp.metadata",
         'import os, stat; os.mknod("$work/node", stat.S_IFREG | 0o4755)',
         _denied(*METADATA_HINT, host=_no_set_id("node")), _works(host=_set_id("node")),
         request={"allow_write": ["$work"]}),
    Case("openat2_setuid_file", "seccomp.metadata",
         _CTYPES + "class How(ctypes.Structure):\n"
         '    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]\n'
         "how = How(os.O_CREAT | os.O_WRONLY, 0o4755, 0)\n"
         'check(libc.syscall($nr_openat2, -100, b"$work/o2", ctypes.byref(how), ctypes.sizeof(how)))',
         _denied(error=("OSError",), host=_no_set_id("o2")), _works(host=_set_id("o2")),
         request={"allow_write": ["$work"]}),
]

# Starting programs and processes: seccomp --------------------------------------------------------


PROCESSES = [
    Case("subprocess_run", "seccomp.process",
         'import subprocess; subprocess.run(["/usr/bin/touch", "$marker"])',
         _denied(*PROCESS_HINT, host=_marker_absent), _works(host=_marker_present),
         request={"allow_write": ["$work"]}),
    Case("os_system", "seccomp.process",
         'import os; print("status", os.system("/usr/bin/touch $marker"))',
         Expect(exit=0, stdout=("status 32512",), host=_marker_absent), _works("status 0", host=_marker_present),
         request={"allow_write": ["$work"]}),
    Case("os_fork", "seccomp.process",
         'import os\npid = os.fork()\nif pid == 0:\n    os._exit(0)\nos.waitpid(pid, 0); print("forked")',
         _denied(*PROCESS_HINT), _works("forked")),
    Case("os_execv", "seccomp.process",
         'import os; os.execv("/usr/bin/touch", ["touch", "$marker"])',
         _denied(*PROCESS_HINT, host=_marker_absent), _works(host=_marker_present),
         request={"allow_write": ["$work"]}),
    Case("os_posix_spawn", "seccomp.process",
         'import os; pid = os.posix_spawn("/usr/bin/touch", ["touch", "$marker"], {}); os.waitpid(pid, 0)',
         _denied(*PROCESS_HINT, host=_marker_absent), _works(host=_marker_present),
         request={"allow_write": ["$work"]}),
    Case("multiprocessing", "seccomp.process",
         """\
         import multiprocessing
         def touch():
             open("$marker", "w").close()
         child = multiprocessing.Process(target=touch)
         child.start()
         child.join()
         """,
         _denied(*PROCESS_HINT, host=_marker_absent), _works(host=_marker_present),
         request={"allow_write": ["$work"]}),
    Case("ctypes_execve", "seccomp.process",
         _CTYPES + textwrap.dedent("""\
         argv = (ctypes.c_char_p * 3)(b"touch", b"$marker", None)
         envp = (ctypes.c_char_p * 1)(None)
         check(libc.execve(b"/usr/bin/touch", argv, envp))
         """),
         _denied(*PROCESS_HINT, host=_marker_absent), _works(host=_marker_present),
         request={"allow_write": ["$work"]}),
    Case("ctypes_fork", "seccomp.process",
         _CTYPES + 'pid = check(libc.fork())\nif pid == 0:\n    os._exit(0)\nos.waitpid(pid, 0); print("forked")',
         _denied(*PROCESS_HINT), _works("forked")),
    Case("raw_syscall_fork", "seccomp.process",
         _CTYPES + 'pid = check(libc.syscall($nr_fork))\nif pid == 0:\n    os._exit(0)\n'
         'os.waitpid(pid, 0); print("forked")',
         _denied(*PROCESS_HINT), _works("forked"), needs=("syscall:fork",)),
    Case("raw_syscall_clone", "seccomp.process",
         _CTYPES + 'pid = check(libc.syscall($nr_clone, 17, 0, 0, 0, 0))\nif pid == 0:\n    os._exit(0)\n'
         'os.waitpid(pid, 0); print("cloned")',
         _denied(*PROCESS_HINT), _works("cloned")),
    Case("raw_syscall_clone3", "seccomp.process",
         _CTYPES + textwrap.dedent("""\
         args = (ctypes.c_uint64 * 8)(0, 0, 0, 0, 17, 0, 0, 0)  # flags=0, exit_signal=SIGCHLD: a fork
         pid = check(libc.syscall($nr_clone3, ctypes.byref(args), ctypes.c_size_t(64)))
         if pid == 0:
             os._exit(0)
         os.waitpid(pid, 0); print("cloned")
         """),
         Expect(exit=1, error=("OSError",), stderr=(f"[Errno {errno.ENOSYS}]",)), _works("cloned"),
         control_needs=("unfiltered",)),  # Docker's profile answers clone3 ENOSYS to the control too
]

# Sockets: seccomp (every family without the grant; never netlink or packet) and Landlock (TCP, scoping)

NETWORK = [
    Case("tcp_connect", "network.tcp",
         'import socket; s = socket.create_connection(("127.0.0.1", $tcp_port)); s.sendall(b"hello"); s.close()',
         _denied(*NETWORK_HINT, host=_no_tcp), _works(host=_tcp_hello), grant={"allow_network": True}),
    Case("tcp6_connect", "network.tcp",
         'import socket; s = socket.create_connection(("::1", $tcp6_port)); s.sendall(b"hello"); s.close()',
         _denied(*NETWORK_HINT, host=_no_tcp6), _works(host=_tcp6_hello), grant={"allow_network": True},
         needs=("ipv6",)),
    Case("udp_send", "network.udp",
         'import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); '
         's.sendto(b"hello", ("127.0.0.1", $udp_port))',
         _denied(*NETWORK_HINT, host=_no_udp), _works(host=_udp_hello), grant={"allow_network": True}),
    Case("unix_connect", "network.unix",
         'import socket; s = socket.socket(socket.AF_UNIX); s.connect("$unix_path"); s.sendall(b"hello"); s.close()',
         _denied("never allowed", host=_no_unix), _works(host=_unix_hello),
         request={"allow_write": ["$work"], "allow_network": True}),
    Case("abstract_unix_scoped", "landlock.scope_abstract",
         'import socket; s = socket.socket(socket.AF_UNIX); s.connect("\\0$abstract_name"); s.sendall(b"hello")',
         _denied(host=_no_abstract), _works(host=_abstract_hello),
         request={"allow_network": True}),
    # The host's interfaces, addresses and MACs through the socket ioctls, on a socketpair end: no network,
    # no host identity. The control, unconfined, lists the host's interfaces (loopback at least).
    Case("interfaces_through_socketpair", "network.identity",
         'import array, fcntl, socket, struct\na, b = socket.socketpair()\nbuf = array.array("B", bytes(4096))\n'
         'got = fcntl.ioctl(a.fileno(), 0x8912, struct.pack("iL", 4096, buf.buffer_info()[0]))  # SIOCGIFCONF\n'
         'print("interfaces", struct.unpack("i", got[:4])[0] // 40)',
         _denied(), Expect(exit=0, stdout=("interfaces",), host=_some_interfaces)),
    # sysinfo(2) answers with the host's RAM, process count, load and uptime: the job gets its own view instead
    # (its memory limit, its threads, its age), written by the pool. The control, unconfined, sees the host's.
    Case("sysinfo_host_view", "network.identity", _SYSINFO,
         Expect(exit=0, stdout=("sysinfo",), host=_own_view), Expect(exit=0, stdout=("sysinfo",), host=_host_view),
         request={"memory": "256m"}),
    Case("netlink_socket", "network.families",
         'import socket; socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0).close(); print("opened")',
         _denied(), _works("opened"), request={"allow_network": True}),
    Case("packet_socket", "network.families",
         'import socket; socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0).close(); print("opened")',
         _denied(), _works("opened"), request={"allow_network": True},
         control_needs_root="a packet socket needs CAP_NET_RAW: the kernel refuses an ordinary user's control"),
]

# Other processes: Landlock scoping (signals), seccomp (limits) ------------------------------------

SIGNALS = [
    Case("kill_template", "landlock.scope_signal",
         'import os, signal; os.kill(os.getppid(), signal.SIGKILL)',
         _denied(), _works("self"), control_code='import os; os.kill(os.getpid(), 0); print("self")',
         grant={}),
    Case("kill_outside_process", "landlock.scope_signal",
         'import os, signal; os.kill($sleeper_pid, signal.SIGKILL)',
         _denied(host=_sleeper_alive), _works(host=_sleeper_killed)),
    # Signal 0 checks permission without delivering anything: the test process must survive a broken policy.
    Case("signal_test_process", "landlock.scope_signal",
         'import os; os.kill($test_pid, 0); print("reachable")',
         _denied("no grant allows it"), _works("reachable")),
    Case("pidfd_kill_outside_process", "landlock.scope_signal",
         'import os, signal; signal.pidfd_send_signal(os.pidfd_open($sleeper_pid), signal.SIGKILL)',
         _denied(host=_sleeper_alive), _works(host=_sleeper_killed)),
    # kill(-1) names every process: refused by the own-process filter (and by scoping, which would make it
    # report success with every target refused). The proof is the stopped sleeper staying stopped.
    # SIGCONT: should the policy ever fail, continuing running processes harms nothing.
    Case("kill_everything", "seccomp.own_process",
         'import os, signal; os.kill(-1, signal.SIGCONT)',
         _denied(host=_sleeper_stopped), _works(host=_sleeper_running),
         control_code='import os, signal; os.kill($sleeper_pid, signal.SIGCONT)',
         prepare=_stop_sleeper),
    # The kernel signals a descriptor's owner when it becomes ready (SIGIO, or whatever F_SETSIG picks):
    # before Landlock's signal scoping (ABI 6) nothing but the own-process filter stands in the way.
    Case("sigio_owner_outside_process", "seccomp.own_process",
         _SIGNAL_BY_OWNER.format(owner="fcntl.fcntl(r, 8, $sleeper_pid)  # F_SETOWN"),
         _denied(host=_sleeper_alive), _works(host=_sleeper_killed)),
    Case("sigio_owner_ex_outside_process", "seccomp.own_process",
         _SIGNAL_BY_OWNER.format(owner="fcntl.fcntl(r, 15, struct.pack('ii', 1, $sleeper_pid))  # F_SETOWN_EX"),
         _denied(host=_sleeper_alive), _works(host=_sleeper_killed)),
    Case("sigio_owner_socket_ioctl", "seccomp.own_process",
         _SIGNAL_BY_OWNER.format(owner="fcntl.ioctl(r, 0x8901, struct.pack('i', $sleeper_pid))  # FIOSETOWN"),
         _denied(host=_sleeper_alive), _works(host=_sleeper_killed)),
    # The same through the i386 convention: the own-process part of the filter lets another ABI's calls through to
    # the main filter's, which answers them ENOSYS (Landlock's scoping would say EPERM: the answer is seccomp's).
    Case("int80_kill_outside_process", "seccomp.other_abi",
         _INT80.replace("CALL", "37, $sleeper_pid, signal.SIGKILL"),  # i386 kill
         Expect(exit=0, stdout=("int80 ENOSYS",), host=_sleeper_alive),
         _works("int80 answered 0", host=_sleeper_killed), needs=("ia32",)),
    Case("prlimit_outside_process", "seccomp.prlimit",
         'import resource; resource.prlimit($sleeper_pid, resource.RLIMIT_NOFILE, (5, 5))',
         _denied(host=_nofile_unchanged), _works(host=_nofile_changed)),
    # Denied by the kernel because the job holds no capability and the target does (commoncap).
    Case("renice_outside_process", "privileges.capabilities",
         'import os; os.setpriority(os.PRIO_PROCESS, $sleeper_pid, 19)',
         _denied(), _works()),
]



# Root becomes an unused uid without capabilities, starts a process of that uid below the lowest priority,
# and renices every process of the uid: only its own target (and itself) may change.
_RENICE_OWN_UID = """\
import ctypes, os, signal, time
os.setpriority(os.PRIO_PROCESS, 0, 10)
os.setgroups([])
os.setresgid($scratch_id, $scratch_id, $scratch_id)
os.setresuid($scratch_id, $scratch_id, $scratch_id)
target = os.fork()
if target == 0:
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: a control that dies takes it along
    time.sleep(30)
    os._exit(0)
try:
    os.setpriority(os.PRIO_USER, 0, 19)
    with open(f"/proc/{target}/stat") as stat_file:
        print("target nice", stat_file.read().rsplit(")", 1)[1].split()[16])
finally:
    os.kill(target, 9)
    os.waitpid(target, 0)
"""


def _capless_untouched(world: World, run: Run) -> None:
    assert world.scheduling(world.capless.pid) == world.capless_state, "the job changed another process"


def _capless_changed(world: World, run: Run) -> None:
    assert world.scheduling(world.capless.pid) != world.capless_state, "the control changed nothing"


# A process of the same uid without capabilities (another job, a prepared child): the kernel would let a
# job renice, reschedule, re-pin and de-prioritise it; the own-process filter refuses any pid but its own.
OTHER_PROCESSES = [
    Case("renice_capless_process", "seccomp.own_process",
         'import os; os.setpriority(os.PRIO_PROCESS, $capless_pid, 19)',
         _denied(host=_capless_untouched), _works(host=_capless_changed)),
    Case("sched_idle_capless_process", "seccomp.own_process",
         'import os; os.sched_setscheduler($capless_pid, os.SCHED_IDLE, os.sched_param(0))',
         _denied(host=_capless_untouched), _works(host=_capless_changed)),
    Case("pin_capless_process", "seccomp.own_process",
         'import os; os.sched_setaffinity($capless_pid, {0})',
         _denied(host=_capless_untouched), _works(host=_capless_changed)),
    Case("ioprio_capless_process", "seccomp.own_process",
         _CTYPES + 'check(libc.syscall($nr_ioprio_set, 1, $capless_pid, 3 << 13)); print("set")',
         _denied(host=_capless_untouched), _works("set", host=_capless_changed)),
    # Run as the test's uid, the control would renice every process of it, this test runner among them, for
    # good (only root may lower a niceness again): it runs as root, under an unused uid with a target of that
    # uid, and leaves the test's own processes alone.
    Case("renice_every_process_of_the_uid", "seccomp.own_process",
         'import os; os.setpriority(os.PRIO_USER, 0, 19)',
         _denied(host=_capless_untouched), _works("target nice 19", host=_capless_untouched),
         control_code=_RENICE_OWN_UID,
         control_needs_root="run by an ordinary user, the control would renice every process of its uid, this "
                            "test runner included, and none of them could lower its niceness again"),
    # Probing which pids exist and what they are.
    Case("probe_priority", "seccomp.own_process",
         'import os; print("nice", os.getpriority(os.PRIO_PROCESS, $sleeper_pid))',
         _denied(), _works("nice")),
    Case("probe_scheduler", "seccomp.own_process",
         'import os; print("policy", os.sched_getscheduler($sleeper_pid))',
         _denied(), _works("policy")),
    Case("capget_outside_process", "seccomp.surface",
         _CTYPES + 'header = (ctypes.c_uint32 * 2)(0x20080522, $sleeper_pid)\n'
         'data = (ctypes.c_uint32 * 6)()\ncheck(libc.syscall($nr_capget, header, data)); print("caps", data[0])',
         _denied(), _works("caps")),
]

# Sockets without the network: nothing outside the job's own process ------------------------------------


def _no_unix_datagram(world: World, run: Run) -> None:
    assert world.unix_datagram() is None, "the host's datagram socket received the job's bytes"


def _unix_datagram_hello(world: World, run: Run) -> None:
    assert world.unix_datagram() == b"hello"


PRIVATE_SOCKETS = [
    Case("datagram_pair_to_host_socket", "seccomp.socketpair",
         'import socket; a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM); '
         'a.sendto(b"hello", "$unix_dgram_path")',
         _denied(host=_no_unix_datagram), _works(host=_unix_datagram_hello)),
    Case("stream_pair_bind_abstract", "seccomp.addressing",
         'import socket; a, b = socket.socketpair(); a.bind("\\0$abstract_name-squat"); print("bound")',
         _denied(), _works("bound")),
]

# The job's own /proc: not the host's sockets, routes, mounts or cgroups ------------------------------------

OWN_PROC = [
    Case("proc_net_tcp", "landlock.own_proc", 'print(open("/proc/self/net/tcp").read())',
         _denied(), _works(":$tcp_port_hex")),
    Case("proc_net_unix", "landlock.own_proc", 'print(open("/proc/net/unix").read())',
         _denied(), _works("$unix_dgram_path")),
    Case("proc_mountinfo", "landlock.own_proc", 'print(open("/proc/self/mountinfo").read())',
         _denied(), _works(" / ")),
    Case("proc_cgroup", "landlock.own_proc", 'print(open("/proc/self/cgroup").read())',
         _denied(), _works(":/")),
    Case("proc_thread_net", "landlock.own_proc",
         'import os; print(open(f"/proc/self/task/{os.getpid()}/net/tcp").read())',
         _denied(), _works(":$tcp_port_hex")),
]

# Budgets the kernel keeps per uid, shared with the pool and every other job -------------------------------


def _no_message_queue(world: World, run: Run) -> None:
    assert not world.message_queue_exists(), "the job left a message queue behind"


def _message_queue_made(world: World, run: Run) -> None:
    assert world.message_queue_exists(), "the control made no message queue"


SHARED_BUDGETS = [
    # A lease makes every other opener of the file wait up to 45 s: on /etc/ld.so.cache, every program the
    # host starts. The control releases its lease at once.
    Case("file_lease_on_a_runtime_file", "seccomp.budgets",
         'import fcntl, os\nfd = os.open("/etc/ld.so.cache", os.O_RDONLY)\nfcntl.fcntl(fd, 1024, fcntl.F_WRLCK)\n'
         'fcntl.fcntl(fd, 1024, fcntl.F_UNLCK)\nprint("leased")',
         _denied(), _works("leased"),
         control_needs_root="a lease on a file of another owner (root's /etc/ld.so.cache) needs CAP_LEASE: the "
                            "kernel refuses an ordinary user's control"),
    Case("aio_context", "seccomp.budgets",
         _CTYPES + 'context = ctypes.c_ulong(0)\ncheck(libc.syscall($nr_io_setup, 1, ctypes.byref(context)))\n'
         'libc.syscall($nr_io_destroy, context)\nprint("created")',
         _denied(), _works("created")),
    Case("inotify_instance", "seccomp.budgets",
         _CTYPES + 'check(libc.syscall($nr_inotify_init1, 0)); print("created")',
         _denied(), _works("created")),
    # Pages written into a memfd count against no limit of the job's: with memory=128m it held 2 GiB. The
    # control, unconfined, holds 300 MiB in one.
    Case("memfd_beyond_memory_limit", "seccomp.budgets",
         'import os\nfd = os.memfd_create("hoard")\nchunk = bytes(1 << 20)\nfor _ in range(300):\n'
         '    os.write(fd, chunk)\nprint("held", os.fstat(fd).st_size >> 20, "MiB")',
         _denied(), _works("held 300 MiB"), request={"memory": "128m"}),
    Case("message_queue", "seccomp.budgets",
         _CTYPES + 'check(libc.mq_open(b"$mq_name", os.O_CREAT | os.O_RDWR, 0o600, None)); print("created")',
         _denied(host=_no_message_queue), _works("created", host=_message_queue_made)),
]

# Kernel attack surface: seccomp answers EPERM before the kernel looks at the (bogus) arguments -------


# Calls Docker's default seccomp profile refuses to a container without extra capabilities: under it the
# unconfined control is refused too and cannot show the harm (the denials still run there).
_CONTAINER_REFUSES = {"mount", "umount2", "unshare", "setns", "pivot_root", "bpf", "perf_event_open", "userfaultfd",
                      "io_uring_setup", "keyctl", "add_key", "kexec_load", "init_module", "personality"}


def _syscall_case(name: str, args: str, *, case_id: str | None = None, control_needs_root: str | None = None) -> Case:
    code = _CTYPES + f'check(libc.syscall($nr_{name}, {args})); print("returned")'
    # Unconfined, the call may succeed (exit 0) or fail for its arguments (exit 1): either is fine.
    return Case(case_id or name, "seccomp.surface", code, _denied(),
                Expect(exit=None, host=_not_permission), needs=(f"syscall:{name}",),
                control_needs=("unfiltered",) if name in _CONTAINER_REFUSES else (),
                control_needs_root=control_needs_root)


SURFACE = [
    _syscall_case("ptrace", "0, 0, 0, 0"),
    _syscall_case("listmount", "0, 0, 0, 0"),  # the host's mount table, without /proc
    _syscall_case("mount", "None, None, None, 0, None"),
    _syscall_case("umount2", "None, 0"),
    _syscall_case("unshare", "0x10000000"),
    _syscall_case("setns", "-1, 0"),
    _syscall_case("chroot", "None"),
    _syscall_case("pivot_root", "None, None", control_needs_root="pivot_root checks CAP_SYS_ADMIN before its "
                  "arguments: the kernel refuses an ordinary user's control with EPERM"),
    _syscall_case("bpf", "5, None, 0", control_needs_root="bpf needs CAP_BPF while unprivileged BPF is disabled "
                  "(kernel.unprivileged_bpf_disabled, the default): the kernel refuses an ordinary user's control"),
    _syscall_case("perf_event_open", "None, 0, -1, -1, 0"),
    _syscall_case("userfaultfd", "ctypes.c_int(-1)"),
    _syscall_case("io_uring_setup", "1, None"),
    _syscall_case("keyctl", "9999, 0, 0, 0, 0"),
    _syscall_case("add_key", "None, None, None, 0, 0"),
    _syscall_case("kexec_load", "0, 0, None, ctypes.c_ulong(0xFFFFFFFF)"),
    _syscall_case("init_module", "None, 0, None"),
    _syscall_case("process_vm_readv", "0, None, 0, None, 0, 0xFF"),
    _syscall_case("shmget", "0, 0, 0"),
    _syscall_case("personality", "0x0040000"),
    _syscall_case("ioctl", "0, ctypes.c_ulong(0x5412), None", case_id="ioctl_tiocsti"),
    # The kernel compares the low 32 bits of the request; so must the filter.
    _syscall_case("ioctl", "0, ctypes.c_ulong(0x1_0000_5412), None", case_id="ioctl_tiocsti_high_bits"),
    # A call the job may make (getpid), made the i386 way: ENOSYS, so no rule can be bypassed through another ABI's
    # numbers. Unconfined, the kernel answers with the pid.
    Case("int80_getpid", "seccomp.other_abi", _INT80.replace("CALL", "20"),  # i386 getpid
         Expect(exit=0, stdout=("int80 ENOSYS",)), _works("int80 answered own pid"), needs=("ia32",)),
]

# Environment and privileges ------------------------------------------------------------------------

_ENV_CODE = """\
import os
print(sorted(os.environ.items()))
print(open("/proc/self/environ", "rb").read())
print("home", os.path.expanduser("~"))
"""


def _env_minimal(world: World, run: Run) -> None:
    first = run.result.stdout.splitlines()[0]
    for name in ("PATH", "HOME", "LANG"):
        assert f"'{name}'" in first
    assert "home /nonexistent" in run.result.stdout, "HOME must not point at a real home"


_STATUS_CODE = """\
import ctypes, resource
fields = dict(line.split(":", 1) for line in open("/proc/self/status"))
for name in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs", "Seccomp"):
    print(name, fields[name].strip())
print("dumpable", ctypes.CDLL(None).prctl(3, 0, 0, 0, 0))
print("core", resource.getrlimit(resource.RLIMIT_CORE))
print("priority", resource.getrlimit(resource.RLIMIT_NICE), resource.getrlimit(resource.RLIMIT_RTPRIO))
"""


def _holds_setpcap() -> bool:
    return bool(int(procfs.status("self")["CapEff"], 16) >> 8 & 1)  # CAP_SETPCAP, which emptying the bounding set needs


def _unprivileged(world: World, run: Run) -> None:
    out = run.result.stdout
    # The bounding set is emptied where the pool (here the test, whose uid and powers it has) can empty it.
    for name in ("CapInh", "CapPrm", "CapEff", "CapAmb", *(("CapBnd",) if _holds_setpcap() else ())):
        assert f"{name} 0000000000000000" in out, out
    assert "NoNewPrivs 1" in out and "Seccomp 2" in out and "dumpable 1" in out and "core (0, 0)" in out
    assert "priority (0, 0) (0, 0)" in out, out  # whatever the pool inherited: no real-time class, no raise


def _privileged_outside(world: World, run: Run) -> None:
    # Outside, as root, the test's capabilities are real, so the zeros above come from the policy.
    assert "CapEff 0000000000000000" not in run.result.stdout, run.result.stdout
    assert "NoNewPrivs 0" in run.result.stdout


HYGIENE = [
    Case("host_environment", "hygiene.environment", _ENV_CODE,
         Expect(exit=0, host=_env_minimal), _works("$secret_name"), grant={"env": {"$secret_name": "given"}}),
    Case("privileges", "privileges.capabilities", _STATUS_CODE,
         Expect(exit=0, host=_unprivileged), _works(host=_privileged_outside),
         control_needs_root="an ordinary user holds no capability to drop, so only root's control shows what the "
                            "policy takes away"),
]

# Limits: rlimits in the child, deadline and output cap enforced from outside ------------------------


def _within(seconds: float) -> HostCheck:
    def check(world: World, run: Run) -> None:
        assert run.elapsed < seconds, f"took {run.elapsed:.2f}s, more than {seconds}s"

    return check


def _flood(stream: str, *, truncated: bool, size: int) -> HostCheck:
    def check(world: World, run: Run) -> None:
        assert getattr(run.result, f"{stream}_truncated") is truncated
        assert len(getattr(run.result, stream)) == size
        assert run.elapsed < 5.0, f"a flood took {run.elapsed:.2f}s"

    return check


def _file_size(size: int) -> HostCheck:
    def check(world: World, run: Run) -> None:
        assert (world.work / "big").stat().st_size == size

    return check


_BUSY = """\
import time
end = time.monotonic() + 1.5
while time.monotonic() < end:
    pass
print("finished")
"""

LIMITS = [
    Case("memory_bytearray", "limits.memory",
         'b = bytearray(400 << 20); print("allocated")',
         _denied("memory", error=("MemoryError",)), _works("allocated"),
         request={"memory": "256m"}, grant={"memory": "1g"}),
    Case("memory_growth", "limits.memory",
         'chunks = [bytearray(16 << 20) for _ in range(30)]; print("allocated")',
         _denied("memory", error=("MemoryError",)), _works("allocated"),
         request={"memory": "256m"}, grant={"memory": "1g"}),
    Case("memory_numpy", "limits.memory",
         'import numpy as np; a = np.ones(60_000_000); print("allocated", a.sum())',
         _denied("memory", error=("MemoryError", "_ArrayMemoryError")), _works("allocated 60000000.0"),
         request={"memory": "256m"}, grant={"memory": "1g"}),
    Case("timeout_busy_loop", "limits.timeout", _BUSY,
         Expect(exit=124, error=("TimeoutError",), hint=("timeout",), host=_within(0.4 + 1.0)),
         _works("finished"), request={"timeout": "400ms"}, grant={"timeout": "10s"}),
    Case("timeout_blocked_in_sleep", "limits.timeout",
         'import time; time.sleep(1.5); print("finished")',
         Expect(exit=124, error=("TimeoutError",), hint=("timeout",), host=_within(0.4 + 1.0)),
         _works("finished"), request={"timeout": "400ms"}, grant={"timeout": "10s"}),
    Case("stdout_flood", "limits.output",
         'import sys; sys.stdout.write("x" * (16 << 20))',
         Expect(exit=0, host=_flood("stdout", truncated=True, size=64 << 10)),
         _works(host=_flood("stdout", truncated=False, size=16 << 20)),
         request={"max_output": "64k"}, grant={"max_output": "32m"}),
    Case("stderr_flood_native", "limits.output",
         'import os\nfor _ in range(256):\n    os.write(2, b"e" * 65536)',
         Expect(exit=0, host=_flood("stderr", truncated=True, size=64 << 10)),
         _works(host=_flood("stderr", truncated=False, size=16 << 20)),
         request={"max_output": "64k"}, grant={"max_output": "32m"}),
    Case("file_size", "limits.file_size",
         'open("$work/big", "wb").write(bytes(2 << 20))',
         Expect(exit=1, error=("OSError",), hint=("max_file_size",), stderr=(f"[Errno {errno.EFBIG}]",),
                host=_file_size(1 << 20)),
         _works(host=_file_size(2 << 20)),
         request={"allow_write": ["$work"], "max_file_size": "1m"}, grant={"max_file_size": "4m"}),
]

CASES: list[Case] = [*FILESYSTEM, *METADATA, *PROCESSES, *NETWORK, *SIGNALS, *OTHER_PROCESSES, *PRIVATE_SOCKETS,
                     *OWN_PROC, *SHARED_BUDGETS, *SURFACE, *HYGIENE, *LIMITS]


@dataclass(frozen=True)
class Works:
    """Something ordinary code needs, which must work confined and print what it prints unconfined."""

    id: str
    code: str
    stdout: str
    request: dict[str, Any] = field(default_factory=dict)


WORKS = [
    Works("numpy", "import numpy as np\na = np.arange(1, 1001, dtype=np.float64)\n"
          "print(int(a.sum()), round(float(np.linalg.norm(np.linalg.inv(np.eye(50) * 2))), 6))",
          "500500 3.535534", {"memory": "256m"}),
    Works("pandas", "import pandas as pd\ndf = pd.DataFrame({'k': list('abab'), 'v': [1, 2, 3, 4]})\n"
          "print(df.groupby('k').v.sum().to_dict())", "{'a': 4, 'b': 6}", {"memory": "256m"}),
    Works("threads", "import threading\nout = []\n"
          "threads = [threading.Thread(target=out.append, args=(i * i,)) for i in range(8)]\n"
          "[t.start() for t in threads]; [t.join() for t in threads]\nprint(sorted(out))",
          "[0, 1, 4, 9, 16, 25, 36, 49]"),
    Works("thread_pool", "from concurrent.futures import ThreadPoolExecutor\n"
          "with ThreadPoolExecutor(4) as pool:\n    print(sum(pool.map(abs, range(-10, 10))))", "100"),
    Works("asyncio", "import asyncio\nasync def main():\n    return sum(await asyncio.gather("
          "*(asyncio.sleep(0.01, result=i) for i in range(5))))\nprint(asyncio.run(main()))", "10"),
    Works("write_within_grant", "import os, tempfile\nopen('$work/out.txt', 'w').write('kept')\n"
          "with tempfile.NamedTemporaryFile(dir='$work') as f:\n    f.write(b'x')\n"
          "os.rename('$work/out.txt', '$work/renamed.txt')\nprint(open('$work/renamed.txt').read(), "
          "sorted(os.listdir('$work'))[:2])", "kept ['listener.sock', 'mine.txt']",
          {"allow_write": ["$work"]}),
    # A bad buffer for sysinfo fails as the kernel fails it: NULL and a read-only page (libc's own code) get
    # EFAULT (the pool writes only where the job itself may).
    Works("sysinfo_bad_buffer", """\
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
read_only = ctypes.cast(libc.sysinfo, ctypes.c_void_p)
for buffer in (None, read_only):
    print(libc.sysinfo(buffer), os.strerror(ctypes.get_errno()))
""", "-1 Bad address\n-1 Bad address", {"memory": "256m"}),
    # Metadata of the job's own files, as the stdlib changes it: copy2/copytree copy mode and times,
    # tarfile sets times (and, as root, owner), utime(None) touches.
    Works("metadata_within_grant", """\
import io, os, shutil, stat, tarfile
top = '$work/meta'
shutil.rmtree(top, ignore_errors=True)
os.makedirs(top + '/tree/sub')
src = top + '/tree/sub/src.txt'
open(src, 'w').write('data')
os.chmod(src, 0o640)
os.utime(src, (1_000_000_000, 1_200_000_000))
shutil.copy2(src, top + '/copy.txt')
shutil.copytree(top + '/tree', top + '/tree2')
os.chown(src, -1, os.getgid())
os.chmod(top + '/tree/sub', 0o2750)
os.chmod(top + '/copy.txt', 0o640, follow_symlinks=False)
buffer = io.BytesIO()
with tarfile.open(fileobj=buffer, mode='w') as tar:
    member = tarfile.TarInfo('x.txt'); member.size = 1; member.mtime = 1_234_567_890; member.mode = 0o600
    member.uid, member.gid = os.getuid(), os.getgid()  # as root, tarfile gives each member its owner
    tar.addfile(member, io.BytesIO(b'x'))
buffer.seek(0)
with tarfile.open(fileobj=buffer) as tar:
    tar.extractall(top + '/untarred')
fd = os.open(top + '/copy.txt', os.O_RDONLY)
os.utime(fd, ns=(5, 6_000_000_000))
os.close(fd)
def shown(path):
    info = os.stat(path)
    return f'{stat.filemode(info.st_mode)} {int(info.st_mtime)}'
print(shown(top + '/copy.txt'), shown(top + '/tree2/sub/src.txt'), shown(top + '/untarred/x.txt'),
      shown(top + '/tree/sub')[:10])
shutil.rmtree(top)
""", "-rw-r----- 6 -rw-r----- 1200000000 -rw------- 1234567890 drwxr-s---", {"allow_write": ["$work"]}),
]
