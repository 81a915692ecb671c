"""The main seccomp filter as a tree decides every system call as the linear list does.

The pool compiles the filter as libseccomp's binary tree (quicker for the kernel to load at every child),
and as one linear list where libseccomp is older. Both programs are run here, by a small interpreter of
classic BPF, on every system call number of both ABIs the filter sees, with each argument set in turn to
every value some rule compares against (and its neighbours); they must return the same action for each.
The rules themselves are proven on the real kernel by the rest of tests/sandbox; this says the form the
kernel is given does not change them. A control shows the comparison sees a program that differs by one
rule.
"""

from __future__ import annotations

import errno
import socket
import struct

import pytest

from pynox.policy import seccomp
from pynox.policy.own_process import OwnProcessFilter, assemble
from pynox.wire.spec import NetworkMode

pytestmark = pytest.mark.pure

_AUDIT_ARCH_X86_64 = 0xC000003E
_AUDIT_ARCH_I386 = 0x40000003
_X32 = 0x40000000
_INSTRUCTION = struct.Struct("=HBBI")
_MASK = 0xFFFFFFFF


class Program:
    """A classic BPF program, decoded once, run as the kernel's seccomp would run it."""

    def __init__(self, program: bytes) -> None:
        self.code = [_INSTRUCTION.unpack_from(program, offset)
                     for offset in range(0, len(program), _INSTRUCTION.size)]
        # What its comparisons test an argument's word against, as seen in the runs so far (the values
        # whose neighbours decide branches; the numbers of the system calls are tried anyway).
        self.constants: set[int] = set()

    def run(self, words: dict[int, int]) -> tuple[int, set[int]]:
        """The action for the call whose seccomp_data has ``words`` (byte offset -> 32-bit word; absent: 0),
        and the offsets it read."""
        a = x = 0
        memory = [0] * 16
        read: set[int] = set()
        argument = False  # A holds (a function of) an argument's word
        pc = 0
        code = self.code
        while True:
            op, jt, jf, k = code[pc]
            pc += 1
            kind = op & 0x07
            if kind == 0x00:  # LD
                mode = op & 0xE0
                if mode == 0x20:  # ABS: a 32-bit word of seccomp_data
                    read.add(k)
                    a = words.get(k, 0)
                    argument = k >= 16
                elif mode == 0x00:
                    a, argument = k, False
                elif mode == 0x60:
                    a, argument = memory[k], False
                else:
                    raise ValueError(f"unexpected load {op:#x}")
            elif kind == 0x05:  # JMP
                test = op & 0xF0
                if test == 0x00:
                    pc += k
                    continue
                source = x if op & 0x08 else k
                if argument and not op & 0x08:
                    self.constants.add(k)
                if test == 0x10:
                    taken = a == source
                elif test == 0x20:
                    taken = a > source
                elif test == 0x30:
                    taken = a >= source
                elif test == 0x40:
                    taken = bool(a & source)
                else:
                    raise ValueError(f"unexpected jump {op:#x}")
                pc += jt if taken else jf
            elif kind == 0x06:  # RET
                return (a if op & 0x18 == 0x10 else k), read
            elif kind == 0x04:  # ALU
                source = x if op & 0x08 else k
                if argument and not op & 0x08 and op & 0xF0 == 0x50:
                    self.constants.add(k)  # a mask: its bits alone, and all of them, are values to try
                alu = op & 0xF0
                if alu == 0x50:
                    a &= source
                elif alu == 0x40:
                    a |= source
                elif alu == 0x00:
                    a = (a + source) & _MASK
                elif alu == 0x10:
                    a = (a - source) & _MASK
                elif alu == 0xA0:
                    a ^= source
                elif alu == 0x60:
                    a = (a << source) & _MASK
                elif alu == 0x70:
                    a >>= source
                else:
                    raise ValueError(f"unexpected arithmetic {op:#x}")
            elif kind == 0x01:  # LDX
                x = memory[k] if op & 0xE0 == 0x60 else k
            elif kind == 0x02:
                memory[k] = a
            elif kind == 0x03:
                memory[k] = x
            else:  # MISC: TAX, TXA
                if op & 0xF8 == 0x00:
                    x = a
                else:
                    a = x


_NR, _ARCH = 0, 4  # offsets in seccomp_data; the arguments' words start at 16


def _variants(constants: set[int], *, neighbours: bool = True) -> list[int]:
    deltas = (-1, 0, 1) if neighbours else (0,)
    return sorted({value + delta for value in constants | {0, _MASK} for delta in deltas
                   if 0 <= value + delta <= _MASK})


def _differences(one: Program, other: Program) -> list[dict[int, int]]:
    """The calls on which the programs disagree: every number of both ABIs, each argument word the
    programs read set to every compared value and its neighbours, alone and with one other word."""
    differing = []
    calls = [(arch, nr) for arch, numbers in ((_AUDIT_ARCH_X86_64, [*range(0, 470), *(_X32 | n for n in range(16)),
                                                                   0xFFFF]),
                                              (_AUDIT_ARCH_I386, range(0, 8)))
             for nr in numbers]

    def compare(words: dict[int, int]) -> set[int]:
        (first, read_one), (second, read_other) = one.run(words), other.run(words)
        if first != second:
            differing.append(words)
        return (read_one | read_other) - {_NR, _ARCH}

    # Each call with no arguments, which shows what it reads and the values it compares them with; then
    # each word it reads set to each of those values and their neighbours (the comparisons of every call
    # are known by then), and what that reads further too; then two words at once, for rules on two.
    read = {(arch, nr): compare({_NR: nr, _ARCH: arch}) for arch, nr in calls}
    tried: set[int] = set()
    while values := [value for value in _variants(one.constants | other.constants) if value not in tried]:
        tried.update(values)  # a branch taken only now may compare with values not seen before: again, with those
        for (arch, nr), offsets in read.items():
            for offset in sorted(offsets):
                for value in values:
                    offsets |= compare({_NR: nr, _ARCH: arch, offset: value})
    pair_values = _variants(one.constants | other.constants, neighbours=False)
    for (arch, nr), offsets in read.items():
        ordered = sorted(offsets)
        for index, first_offset in enumerate(ordered):
            for second_offset in ordered[index + 1:]:
                for first_value in pair_values:
                    for second_value in pair_values:
                        compare({_NR: nr, _ARCH: arch, first_offset: first_value, second_offset: second_value})
    return differing


@pytest.mark.parametrize("session", [False, True], ids=["job", "session"])
@pytest.mark.parametrize("network", ["none", "hosts", "all"])
@pytest.mark.parametrize("abi", [1, 3, 7])
def test_the_tree_decides_as_the_linear_list(network: NetworkMode, abi: int, session: bool) -> None:
    tree = seccomp.compile_filter(network, abi, session=session).bpf
    linear = seccomp.compile_filter(network, abi, session=session, tree=False).bpf
    if tree == linear:
        pytest.skip("this libseccomp makes no tree: the pool loads the linear list")
    assert _differences(Program(tree), Program(linear)) == []


def _own_program(pid: int, *, shared: bool) -> Program:
    program, patches, unknown = assemble(shared=shared)
    return Program(OwnProcessFilter(program, tuple(patches), tuple(unknown)).for_pid(pid))


def test_the_own_process_filter_as_a_tree_decides_as_the_linear_list() -> None:
    """The own-process filter searches the system call numbers as a tree and gives calls with the same check one
    body (about half the instructions the kernel translates and compiles at every child's install, and a
    third of the steps it runs for each number as it installs it); it decides every call as the linear form
    with a body per call, with a pid written in. Control: the same program written for another pid differs,
    on the calls that name a process only."""
    shared, per_call = _own_program(4242, shared=True), _own_program(4242, shared=False)
    assert len(shared.code) < len(per_call.code) * 0.6, (len(shared.code), len(per_call.code))
    assert _differences(shared, per_call) == []
    differing = {words[_NR] for words in _differences(shared, _own_program(4243, shared=True))}
    # kill, getpriority, setpriority, sched_setaffinity, prlimit64, fcntl among them; getpid not
    assert {62, 140, 141, 203, 302, 72} <= differing and 39 not in differing, differing


class Stacked(Program):
    """Two programs installed one after the other, run as the kernel runs stacked filters: each on the call,
    the strictest action wins (kill < trap < errno < notify < allow, as signed values), and between equals the
    one installed last."""

    def __init__(self, first: Program, last: Program) -> None:
        super().__init__(b"")
        self.first, self.last = first, last

    def run(self, words: dict[int, int]) -> tuple[int, set[int]]:
        (older, read_older), (newer, read_newer) = self.first.run(words), self.last.run(words)
        self.constants = self.first.constants | self.last.constants

        def strictness(value: int) -> int:
            action = value & 0xFFFF0000
            return action - (1 << 32) if action & 0x80000000 else action

        return (older if strictness(older) < strictness(newer) else newer), read_older | read_newer


@pytest.mark.parametrize("session", [False, True], ids=["job", "session"])
@pytest.mark.parametrize("network", ["none", "hosts", "all"])
@pytest.mark.parametrize("abi", [1, 7])
def test_the_merged_filter_decides_as_the_two_stacked(network: NetworkMode, abi: int, session: bool) -> None:
    """A child installs the main filter and the own-process filter as one program (OwnProcessFilter.before):
    it decides every call as the kernel decides for the two stacked (the main filter first), with a pid
    written in. Control: the merged program differs from the main filter alone exactly where the own-process
    filter refuses."""
    main = seccomp.compile_filter(network, abi, session=session).bpf
    program, patches, unknown = assemble()
    own = OwnProcessFilter(program, tuple(patches), tuple(unknown))
    merged = Program(own.before(main).for_pid(4242))
    assert _differences(merged, Stacked(Program(main), Program(own.for_pid(4242)))) == []
    if network == "none" and not session and abi == 7:
        differing = {words[_NR] for words in _differences(merged, Program(main))}
        # kill, getpriority, sched_setaffinity, prlimit64, fcntl among them; getpid and socket not
        assert {62, 140, 203, 302, 72} <= differing and not {39, 41} & differing, differing


def test_a_main_filter_that_kills_is_not_merged() -> None:
    """A main filter that could answer more strictly than with an errno (kill) would take precedence over the
    own-process filter's errno when stacked: it is not merged (the two are then stacked)."""
    program, patches, unknown = assemble()
    own = OwnProcessFilter(program, tuple(patches), tuple(unknown))
    kill = struct.pack("=HBBI", 0x06, 0, 0, 0x80000000)
    with pytest.raises(ValueError):
        own.before(kill)
    assert own.before(struct.pack("=HBBI", 0x06, 0, 0, 0x00050001)).program.endswith(
        struct.pack("=HBBI", 0x06, 0, 0, 0x00050001))


def test_the_comparison_sees_one_rule_changed() -> None:
    """Control: the filters with and without the network differ in their socket rules; compared the same way,
    they differ exactly there, and agree on a call both allow."""
    without = Program(seccomp.compile_filter("none", 7, session=True).bpf)
    with_network = Program(seccomp.compile_filter("all", 7, session=True).bpf)
    differing = {words[_NR] for words in _differences(without, with_network)}
    # socket, connect, accept, bind, listen, accept4, and the socket ioctls: nothing else
    assert {41, 42} <= differing <= {16, 41, 42, 43, 49, 50, 53, 288}, differing
    inet = {_NR: 41, _ARCH: _AUDIT_ARCH_X86_64, 16: socket.AF_INET}
    assert without.run(inet)[0] != with_network.run(inet)[0]
    getpid = {_NR: 39, _ARCH: _AUDIT_ARCH_X86_64}
    assert without.run(getpid)[0] == with_network.run(getpid)[0]


def test_the_interpreter_gives_the_actions_the_rules_name() -> None:
    """The interpreter itself, on calls whose action the rules name: allowed, refused with EPERM, delegated
    to the pool, and a foreign ABI refused with ENOSYS (what the kernel runs is checked by tests/sandbox)."""
    program = Program(seccomp.compile_filter("none", 7, session=True).bpf)
    allow, notify, errno_action = 0x7FFF0000, 0x7FC00000, 0x00050000
    calls = {"getpid": ({_NR: 39, _ARCH: _AUDIT_ARCH_X86_64}, allow),
             "ptrace": ({_NR: 101, _ARCH: _AUDIT_ARCH_X86_64}, errno_action | errno.EPERM),
             "socket(AF_INET)": ({_NR: 41, _ARCH: _AUDIT_ARCH_X86_64, 16: socket.AF_INET}, errno_action | errno.EPERM),
             "chmod": ({_NR: 90, _ARCH: _AUDIT_ARCH_X86_64}, notify),
             "getpid on i386": ({_NR: 20, _ARCH: _AUDIT_ARCH_I386}, errno_action | errno.ENOSYS)}
    assert {name: hex(program.run(words)[0]) for name, (words, _) in calls.items()} == \
        {name: hex(action) for name, (_, action) in calls.items()}


def test_only_a_sessions_filter_hands_its_forks_to_the_pool() -> None:
    """A plain job's filter refuses fork, vfork and clone without CLONE_THREAD itself (EPERM), as before the fork
    gate; a session's child's hands them to the steward (its gate, server/fork_gate.py). Threads are allowed in
    both; every other call is answered alike."""
    plain = Program(seccomp.compile_filter("none", 7, session=False).bpf)
    session = Program(seccomp.compile_filter("none", 7, session=True).bpf)
    allow, notify, eperm = 0x7FFF0000, 0x7FC00000, 0x00050000 | errno.EPERM
    clone_thread = 0x00010000 | 0x00000100 | 0x00000800 | 0x00000400 | 0x00000200  # THREAD|VM|SIGHAND|FILES|FS
    calls = {"fork": {_NR: 57}, "vfork": {_NR: 58}, "clone(SIGCHLD)": {_NR: 56, 16: 17},
             "clone(CLONE_PARENT|SIGCHLD)": {_NR: 56, 16: 0x8000 | 17}, "clone(thread)": {_NR: 56, 16: clone_thread}}
    actions = {name: (hex(plain.run({**words, _ARCH: _AUDIT_ARCH_X86_64})[0]),
                      hex(session.run({**words, _ARCH: _AUDIT_ARCH_X86_64})[0])) for name, words in calls.items()}
    assert actions == {"fork": (hex(eperm), hex(notify)), "vfork": (hex(eperm), hex(notify)),
                       "clone(SIGCHLD)": (hex(eperm), hex(notify)),
                       "clone(CLONE_PARENT|SIGCHLD)": (hex(eperm), hex(notify)),
                       "clone(thread)": (hex(allow), hex(allow))}, actions
    assert {words[_NR] for words in _differences(plain, session)} <= {56, 57, 58}
