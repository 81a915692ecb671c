"""The second seccomp filter: a system call that names a process may name only the job itself.

Without it a job could renice, reschedule (``SCHED_IDLE``), pin or
de-prioritise the I/O of any process of its uid that holds no capabilities
(another job, a child prepared for another tenant's next job), and probe which
pids exist with ``getpriority`` or ``sched_getscheduler``. The kernel allows
all of that between processes of one uid; Landlock does not govern it.

The rule needs the job's own pid, which only the child knows, and libseccomp
cannot compare one argument with two values in one rule. So this small filter
is written here in classic BPF, assembled once in the template with a
placeholder where the pid goes, and each child writes its pid into those
instructions. A job's child installs it merged with the main filter
(:mod:`.seccomp`) into one program (:meth:`OwnProcessFilter.before`: this
filter first, its allows going on to the main one), which decides as the two
stacked would (the stricter answer wins) at the kernel's cost of one filter;
a session fork's copy stacks it, for its own pid, on the one it inherited.

A pid argument is allowed when it is 0 (the caller, by the kernel's
convention) or the job's own pid; ``kill`` also takes the job's own process
group (``-pid``: the job leads its own session). Priority calls take
``PRIO_PROCESS`` or ``PRIO_PGRP`` only, never a whole uid. Everything else is
``EPERM``. Threads of the job other than its main one cannot be named by tid.

``fcntl(fd, F_SETOWN, pid)`` names the process the kernel signals when the
descriptor becomes ready (``SIGIO``, or any signal ``F_SETSIG`` picks, for any
write to a pipe): without this rule a job could have the kernel send any
signal to any process its uid may signal, root's included, on every kernel
before Landlock's signal scoping (ABI 6, Linux 6.12). It too may name only the
job or its own process group. ``F_SETOWN_EX`` and the socket ioctls that set an
owner pass it in memory a filter cannot read; the main filter refuses them.
"""

from __future__ import annotations

import ctypes
import errno
import struct
import sys

import msgspec
import pyseccomp

from ._libc import prctl

__all__ = ["OwnProcessFilter", "assemble"]

_PLACEHOLDER = 0x7A5A_F00D  # never a pid: pid_max is at most 2**22
_NEGATED = (-_PLACEHOLDER) & 0xFFFF_FFFF

_LD_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_JGT = 0x25  # BPF_JMP | BPF_JGT | BPF_K
_JGE = 0x35  # BPF_JMP | BPF_JGE | BPF_K
_RET = 0x06  # BPF_RET | BPF_K
_RET_A = 0x16  # BPF_RET | BPF_A
_JA = 0x05  # BPF_JMP | BPF_JA
_ALLOW = 0x7FFF_0000
_EPERM = 0x0005_0000 | errno.EPERM
_ENOSYS = 0x0005_0000 | errno.ENOSYS
_ERRNO_ACTION = 0x0005_0000
_ACTION = 0xFFFF_0000
_X32_BIT = 0x4000_0000
_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2
_INSTRUCTION = struct.Struct("=HBBI")

# Calls whose first argument is a pid (or thread group id).
_PID_FIRST = (
    "sched_setaffinity", "sched_getaffinity", "sched_setscheduler", "sched_getscheduler", "sched_setparam",
    "sched_getparam", "sched_setattr", "sched_getattr", "sched_rr_get_interval", "migrate_pages", "move_pages",
    "get_robust_list", "getpgid", "getsid", "setpgid", "pidfd_open", "tgkill", "tkill", "rt_sigqueueinfo",
    "rt_tgsigqueueinfo",
    # Resource limits: the kernel lets a process change those of any other of its uid (a job could lower
    # the pool's RLIMIT_CPU and have it killed).
    "prlimit64",
)
# (which, who) calls: the kinds of "which" that name a process or a process group, lowest and highest.
_WHICH_WHO = {"getpriority": (0, 1), "setpriority": (0, 1), "ioprio_get": (1, 2), "ioprio_set": (1, 2)}
# fcntl's command that names a process (or, negative, a process group) to signal.
F_SETOWN = 8
# The (which, who) checks by their bounds of ``which``: one body for each pair of calls that shares them.
_WHICH_WHO_BODIES = {f"which-{lowest}-{highest}": (lowest, highest) for lowest, highest in _WHICH_WHO.values()}


def _body(name: str) -> str:
    """The check a call takes (its body's label): calls with the same check share one."""
    if name in _WHICH_WHO:
        return "which-{}-{}".format(*_WHICH_WHO[name])
    return name if name in ("kill", "fcntl") else "pid-first"


def _arg(index: int) -> int:
    """Offset of the low 32 bits of argument ``index`` in ``struct seccomp_data`` (pid_t is 32 bits)."""
    return 16 + 8 * index + (4 if sys.byteorder == "big" else 0)


class _Assembler:
    def __init__(self) -> None:
        self.code: list[tuple[int, str | int, str | int, int]] = []
        self.labels: dict[str, int] = {}

    def label(self, name: str) -> None:
        self.labels[name] = len(self.code)

    def emit(self, op: int, k: int, jt: str | int = 0, jf: str | int = 0) -> None:
        self.code.append((op, jt, jf, k))

    def bytes(self) -> tuple[bytes, list[int]]:
        out, patches = bytearray(), []
        for index, (op, jt, jf, k) in enumerate(self.code):
            offsets = [self.labels[j] - index - 1 if isinstance(j, str) else j for j in (jt, jf)]
            if not all(0 <= offset <= 255 for offset in offsets):  # classic BPF jumps are one byte
                raise ValueError(f"BPF jump out of range at instruction {index}: {offsets}")
            if k in (_PLACEHOLDER, _NEGATED) and op == _JEQ:
                patches.append(index)
            out += _INSTRUCTION.pack(op, offsets[0], offsets[1], k)
        return bytes(out), patches


def _search(asm: _Assembler, numbers: list[tuple[int, str]], name: str) -> None:
    """With the system call number loaded: jump to the label of the number among ``numbers`` (sorted), or allow
    a number that is not one of them; a tree of comparisons halving the list down to three or fewer."""
    if len(numbers) <= 3:
        for number, label in numbers:
            asm.emit(_JEQ, number, label)
        asm.emit(_RET, _ALLOW)  # a call that names no process
        return
    middle = len(numbers) // 2
    asm.emit(_JGE, numbers[middle][0], 0, f"{name}-below")
    _search(asm, numbers[middle:], f"{name}-a")
    asm.label(f"{name}-below")
    _search(asm, numbers[:middle], f"{name}-b")


def _pid_check(asm: _Assembler, *, negated: bool = False) -> None:
    """With the pid argument loaded: allow 0 and the job's pid (and -pid), refuse anything else."""
    asm.emit(_JEQ, 0, "allow")
    asm.emit(_JEQ, _PLACEHOLDER, "allow")
    if negated:
        asm.emit(_JEQ, _NEGATED, "allow")
    asm.emit(_RET, _EPERM)


def assemble(*, shared: bool = True) -> tuple[bytes, list[int], list[str]]:
    """The program, the indices of the instructions that take the pid, and the names this libseccomp or
    architecture does not know (they are left to the main filter, or do not exist here). ``shared=False``:
    one body per call (the longer form, which tests/sandbox/test_filter_forms.py compares with this one)."""
    resolved: dict[str, int] = {}
    unknown: list[str] = []
    for name in (*_PID_FIRST, "kill", *_WHICH_WHO, "fcntl"):
        number = pyseccomp.resolve_syscall(pyseccomp.Arch.NATIVE, name)
        if number < 0:
            unknown.append(name)
        else:
            resolved[name] = number
    asm = _Assembler()
    asm.emit(_LD_ABS, 4)  # arch
    # A foreign ABI is refused by the main filter; this one has nothing to add.
    asm.emit(_JEQ, pyseccomp.system_arch(), 0, "allow")
    asm.emit(_LD_ABS, 0)  # syscall number
    asm.emit(_JGE, _X32_BIT, "enosys")
    # Calls that take the same check share one body (every pid-first call but kill, the two priority calls, the
    # two I/O priority calls): a program a third the size of one body per call, the same answers. The kernel
    # translates and compiles the program again at every child's install: its cost goes with the length.
    bodies: dict[str, str] = {name: _body(name) if shared else name for name in resolved}
    if shared:
        # The numbers searched as a binary tree, not one by one: the kernel runs the program on every system
        # call number when it installs it (the action cache, while interrupts are off), each time down the
        # list to the number's place; through a tree it takes a third of the steps.
        _search(asm, sorted((number, f"check-{bodies[name]}") for name, number in resolved.items()), "search")
    else:
        for name, number in resolved.items():
            asm.emit(_JEQ, number, f"check-{bodies[name]}")
        asm.emit(_RET, _ALLOW)  # a call that names no process
    # Classic BPF jumps only forward: the shared answers come last.
    for body in dict.fromkeys(bodies.values()):
        asm.label(f"check-{body}")
        if body in _WHICH_WHO_BODIES or body in _WHICH_WHO:
            lowest, highest = _WHICH_WHO_BODIES[body] if body in _WHICH_WHO_BODIES else _WHICH_WHO[body]
            asm.emit(_LD_ABS, _arg(0))
            asm.emit(_JGT, highest, "eperm")
            asm.emit(_JGE, lowest, 0, "eperm")
            asm.emit(_LD_ABS, _arg(1))
            _pid_check(asm)
        elif body == "fcntl":
            asm.emit(_LD_ABS, _arg(1))
            asm.emit(_JEQ, F_SETOWN, 0, "allow")  # only F_SETOWN names a process
            asm.emit(_LD_ABS, _arg(2))
            _pid_check(asm, negated=True)
        else:
            asm.emit(_LD_ABS, _arg(0))
            _pid_check(asm, negated=body == "kill")
    asm.label("eperm")
    asm.emit(_RET, _EPERM)
    asm.label("allow")
    asm.emit(_RET, _ALLOW)
    asm.label("enosys")
    asm.emit(_RET, _ENOSYS)
    program, patches = asm.bytes()
    return program, patches, unknown


def _strictness(value: int) -> int:
    """A return value's action as the kernel ranks actions (signed: the lower, the stricter; kill < trap <
    errno < notify < allow)."""
    action = value & _ACTION
    return action - (1 << 32) if action & 0x8000_0000 else action


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


class OwnProcessFilter(msgspec.Struct, frozen=True):  # not a dataclass: see Runtime (policy/__init__.py)
    """Assembled once in the template; :meth:`install` writes the caller's pid into it and loads it."""

    program: bytes
    patches: tuple[int, ...]
    unknown: tuple[str, ...]

    @classmethod
    def build(cls) -> OwnProcessFilter:
        program, patches, unknown = assemble()
        return cls(program, tuple(patches), tuple(unknown))

    def negations(self) -> tuple[tuple[int, int], ...]:
        """Each instruction that takes the pid, and 1 where it takes ``-pid`` (the native path's patches)."""
        return tuple((index, int(_INSTRUCTION.unpack_from(self.program, index * _INSTRUCTION.size)[3] != _PLACEHOLDER))
                     for index in self.patches)

    def for_pid(self, pid: int) -> bytes:
        program = bytearray(self.program)
        for index in self.patches:
            _, _, _, k = _INSTRUCTION.unpack_from(program, index * _INSTRUCTION.size)
            value = pid if k == _PLACEHOLDER else (-pid) & 0xFFFF_FFFF
            struct.pack_into("=I", program, index * _INSTRUCTION.size + 4, value)
        return bytes(program)

    def before(self, main: bytes) -> OwnProcessFilter:
        """This filter and ``main`` as one program: this one's instructions first, each of its allows a jump to
        ``main``'s first, then ``main``'s. It decides as the two stacked: a call this filter refuses is refused
        with its errno, which is what the kernel answers for the two (the stricter action wins, and between
        two errnos the newer filter's: this one, stacked last), provided ``main`` never answers more strictly
        than with an errno (kill, trap: ``ValueError`` then); any other call is ``main``'s. A child installs
        one filter, where two cost it the kernel's fixed work of a filter twice (a program checked,
        translated, compiled and cached: ~20 us per child here), and every system call the cache does not
        answer runs one program, not two. The pid goes at the same indices (this program comes first)."""
        code = [_INSTRUCTION.unpack_from(main, offset) for offset in range(0, len(main), _INSTRUCTION.size)]
        if any(op == _RET_A or (op == _RET and _strictness(k) < _ERRNO_ACTION) for op, _, _, k in code):
            raise ValueError("the main filter answers more strictly than with an errno: stacked, not merged")
        own = [_INSTRUCTION.unpack_from(self.program, offset)
               for offset in range(0, len(self.program), _INSTRUCTION.size)]
        out = bytearray()
        for index, (op, jt, jf, k) in enumerate(own):
            if op == _RET and k == _ALLOW:  # on to the main filter's first instruction
                op, jt, jf, k = _JA, 0, 0, len(own) - index - 1
            out += _INSTRUCTION.pack(op, jt, jf, k)
        return OwnProcessFilter(bytes(out) + main, self.patches, self.unknown)

    def install(self, pid: int) -> None:
        """Install on the calling thread, for process ``pid``; no_new_privs must already be set."""
        program = self.for_pid(pid)
        buffer = ctypes.create_string_buffer(program, len(program))
        fprog = _SockFprog(len(program) // _INSTRUCTION.size, ctypes.addressof(buffer))
        prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.addressof(fprog), what="seccomp filter (own process)")
