"""The container launcher does what its docstring says, seen from outside; and Pynox runs under it, or refuses
in one line when the profile blocks Landlock.

Each refused call is also made outside the launcher, where it must not fail with the launcher's answer, so
the refusal provably comes from the launcher's filter or capabilities, not from this machine.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pyseccomp
import pytest

from tests.harness import procfs
from tests.setups import container

ROOT = Path(__file__).resolve().parents[2]
CLONE_NEWNS = 0x00020000
CLONE_FS = 0x00000200
AF_VSOCK = 40


def _may_launch() -> str | None:
    """Why this process cannot run the launcher, or None: it needs root holding CAP_SYS_ADMIN and CAP_SETPCAP."""
    if os.geteuid() != 0:
        return "the container launcher needs root"
    effective = int(procfs.status("self")["CapEff"], 16)
    if not effective & (1 << 21) or not effective & (1 << 8):
        return "the container launcher needs CAP_SYS_ADMIN and CAP_SETPCAP (is this run already in a container?)"
    return None


@pytest.fixture(autouse=True)
def _launchable(request: pytest.FixtureRequest) -> None:
    reason = _may_launch()
    if reason is not None and request.node.get_closest_marker("pure") is None:
        if os.environ.get("CI"):
            pytest.fail(f"{reason}: CI runs as root", pytrace=False)
        pytest.skip(reason)


def _launch(*command: str, profile: str = "docker") -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tests.setups.container", "--profile", profile, "--", *command],
                          cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)


def _status(*, inside: bool) -> dict[str, str]:
    code = "import sys; sys.stdout.write(open('/proc/self/status').read())"
    done = _launch(sys.executable, "-c", code) if inside else subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert done.returncode == 0, done.stderr
    fields = (line.split(":", 1) for line in done.stdout.splitlines())
    return {key: value.strip() for key, value in fields}


def test_the_process_gets_dockers_capabilities_and_a_filter_but_not_no_new_privs() -> None:
    status = _status(inside=True)
    for key in ("CapBnd", "CapPrm", "CapEff", "CapInh"):
        assert int(status[key], 16) == container.CAPABILITY_MASK == 0xA80425FB, (key, status[key])
    assert int(status["CapAmb"], 16) == 0
    assert status["NoNewPrivs"] == "0"
    assert status["Seccomp"] == "2"
    outside = _status(inside=False)
    assert int(status["Seccomp_filters"]) == int(outside["Seccomp_filters"]) + 1


def test_the_process_starts_at_nice_0_as_a_containers_first_process_does() -> None:
    done = _launch(sys.executable, "-c", "import os; print(os.getpriority(os.PRIO_PROCESS, 0))")
    assert (done.returncode, done.stdout) == (0, "0\n"), done.stderr


# Label: (system call, arguments, the answer inside the docker profile). Arguments are chosen so that outside
# the launcher the call fails harmlessly (or succeeds in the throwaway child) with another answer.
CALLS: dict[str, tuple[str, tuple[int, ...], int]] = {
    "unshare": ("unshare", (CLONE_NEWNS,), errno.EPERM),
    "mount": ("mount", (0, 0, 0, 0, 0), errno.EPERM),
    "setns": ("setns", (-1, 0), errno.EPERM),
    "clone with a namespace flag": ("clone", (CLONE_NEWNS | CLONE_FS, 0, 0, 0, 0), errno.EPERM),  # EINVAL outside
    "clone3": ("clone3", (0, 0), errno.ENOSYS),
    "bpf": ("bpf", (0, 0, 0), errno.EPERM),
    "io_uring_setup": ("io_uring_setup", (1, 0), errno.EPERM),
    "keyctl": ("keyctl", (0, -3, 0), errno.EPERM),  # KEYCTL_GET_KEYRING_ID of the session keyring
    "get_mempolicy": ("get_mempolicy", (0, 0, 0, 0, 0), errno.EPERM),
    "pidfd_getfd": ("pidfd_getfd", (-1, 0, 0), errno.EPERM),
    "syslog": ("syslog", (10, 0, 0), errno.EPERM),  # SYSLOG_ACTION_SIZE_BUFFER
    "socket(AF_VSOCK)": ("socket", (AF_VSOCK, 1, 0), errno.EPERM),
    "socket(46)": ("socket", (46, 1, 0), errno.EPERM),
    "personality(ADDR_NO_RANDOMIZE)": ("personality", (0x0040000,), errno.EPERM),
    # Allowed: the answer is the kernel's, the same inside and outside.
    "socket(AF_INET)": ("socket", (2, 1, 0), 0),
    "personality query": ("personality", (0xFFFFFFFF,), 0),
    "landlock_create_ruleset (version)": ("landlock_create_ruleset", (0, 0, 1), 0),
}

# Makes each call in a fresh child (one process for all: none of them changes what the next one sees) and
# prints {label: errno, or 0 when it succeeded}.
_CALLER = """
import ctypes, json, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
answers = {}
for label, number, args in json.loads(sys.argv[1]):
    result = libc.syscall(ctypes.c_long(number), *[ctypes.c_long(arg) for arg in args])
    answers[label] = 0 if result >= 0 else ctypes.get_errno()
print(json.dumps(answers))
"""


def _answers(*, inside: bool, profile: str = "docker") -> dict[str, int]:
    calls = [(label, int(pyseccomp.resolve_syscall(pyseccomp.Arch.NATIVE, name)), args)
             for label, (name, args, _) in CALLS.items()]
    command = (sys.executable, "-c", _CALLER, json.dumps(calls))
    done = _launch(*command, profile=profile) if inside else subprocess.run(
        command, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    answers: dict[str, int] = json.loads(done.stdout)
    return answers


def test_the_filter_refuses_what_dockers_profile_refuses_and_only_there() -> None:
    inside, outside = _answers(inside=True), _answers(inside=False)
    expected = {label: answer for label, (_, _, answer) in CALLS.items()}
    assert inside == expected, {label: (os.strerror(inside[label]), outside[label])
                                for label in expected if inside[label] != expected[label]}
    for label, answer in expected.items():
        if answer:
            assert outside[label] != answer, f"{label} fails with {errno.errorcode[answer]} outside the launcher too"


def test_the_pre_20_10_18_profile_refuses_only_landlock_besides() -> None:
    inside = _answers(inside=True, profile="docker-pre-20.10.18")
    expected = {label: answer for label, (_, _, answer) in CALLS.items()}
    expected["landlock_create_ruleset (version)"] = errno.EPERM
    assert inside == expected


def test_a_pynox_job_runs_in_the_container() -> None:
    done = _launch(sys.executable, "-m", "pynox", "run", "-c", "print(1)")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout == "1\n"


def test_pynox_refuses_in_one_line_when_the_profile_blocks_landlock() -> None:
    done = _launch(sys.executable, "-m", "pynox", "run", "-c", "print(1)", profile="docker-pre-20.10.18")
    assert done.returncode != 0
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert "Traceback" not in done.stderr and done.stderr.count("pynox run:") == 1, done.stderr
    assert "blocked (EPERM)" in lines[0] and "container's seccomp profile" in lines[0], lines[0]


def test_pynox_check_fails_and_says_why_when_the_profile_blocks_landlock() -> None:
    done = _launch(sys.executable, "-m", "pynox", "check", profile="docker-pre-20.10.18")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    verdict = done.stdout.strip().splitlines()[-1]
    assert verdict.startswith("Verdict: FAIL") and "container's seccomp profile" in verdict, done.stdout


@pytest.mark.pure
def test_the_launcher_wants_a_profile_it_knows_and_a_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert container.main(["--profile", "podman", "--", "true"]) == 2
    assert container.main(["--", *()]) == 2
    assert container.main(["true"]) == 2
    assert capsys.readouterr().err.count("usage:") == 3
