"""A session's own code cannot create a process, during a step or from a thread an earlier step left behind.

This is the rule a fork of a session (issue 48) must keep: whatever copy of a session's process the pool
makes, the job's code may never make one itself. A session lives across steps, so it has two chances a job
has not: a thread started by one step runs again in the next, and the process waits between steps. Each is
tried here with ``fork``, ``clone`` (a fork: no ``CLONE_THREAD``) and ``clone3``, and judged from outside: no
child of the session's process exists, none wrote the file a successful fork writes, and between steps the
process is stopped (it runs nothing, so it can try nothing). The control runs the same code in a plain
interpreter, where it forks.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from pynox.policy.seccomp import syscall_number
from tests.harness import procfs
from tests.pool.pool_driver import leftover_guard, pool_process, proc_table
from tests.sandbox.harness import run_unconfined

pytestmark = pytest.mark.timeout(120)

_subreaper = pytest.fixture(scope="module", autouse=True, name="_subreaper")(leftover_guard)

EPERM, ENOSYS = 1, 38


def _numbers() -> dict[str, int | None]:
    def number(name: str) -> int | None:
        try:
            return syscall_number(name)
        except Exception:  # not on this architecture (aarch64 has no fork)
            return None
    return {name: number(name) for name in ("fork", "clone", "clone3")}


# Each way of making a process; a copy that exists writes a file named after its pid in ``out``, then exits.
# ``attempt()`` gives each way's outcome: "forked", or the errno the kernel answered.
_ATTEMPT = """\
import ctypes, os, threading, json
libc = ctypes.CDLL(None, use_errno=True)
NUMBERS = {numbers!r}
OUT = {out!r}

def _copy():
    try:
        with open(os.path.join(OUT, str(os.getpid())), "w") as marker:
            marker.write("forked")
    finally:
        os._exit(0)

def _way(name):
    if name == "os.fork":
        try:
            pid = os.fork()
        except OSError as exc:
            return exc.errno
    elif name == "clone3":
        args = (ctypes.c_uint64 * 8)(0, 0, 0, 0, 17, 0, 0, 0)  # flags 0, exit signal SIGCHLD: a fork
        pid = libc.syscall(NUMBERS["clone3"], ctypes.byref(args), ctypes.c_size_t(64))
    elif name == "clone":
        pid = libc.syscall(NUMBERS["clone"], 17, 0, 0, 0, 0)  # SIGCHLD, no CLONE_THREAD: a fork
    else:
        pid = libc.syscall(NUMBERS["fork"])
    if pid == -1:
        return ctypes.get_errno()
    if pid == 0:
        _copy()
    os.waitpid(pid, 0)
    return "forked"

def attempt():
    ways = ["os.fork", "clone", "clone3"] + (["fork"] if NUMBERS["fork"] is not None else [])
    return {{way: _way(way) for way in ways}}
"""

# A thread the first step leaves behind: it keeps trying, and runs whenever the process does.
_LEAVE_A_THREAD = """
tries = []
def _keep_trying():
    while len(tries) < 200:
        tries.append(attempt())
        time.sleep(0.005)
import time
threading.Thread(target=_keep_trying, daemon=True).start()
"""


def _attempt_code(out: Path) -> str:
    return _ATTEMPT.format(numbers=_numbers(), out=str(out))


def _ok(result: dict[str, Any]) -> dict[str, Any]:
    assert result["exit"] == 0 and result["error"] is None, result
    return result


def _denied(outcomes: dict[str, object]) -> None:
    for way, outcome in outcomes.items():
        # clone3 carries its flags in memory the filter cannot read: it is refused ENOSYS, so glibc falls back
        # to clone, which is refused EPERM.
        expected = {ENOSYS, EPERM} if way == "clone3" else {EPERM}
        assert outcome in expected, (way, outcome)


def _children(pid: int) -> list[int]:
    return [child for child, row in proc_table().items() if row[0] == pid]


def test_the_same_code_forks_when_unconfined(tmp_path: Path) -> None:
    """The control: every way works in a plain interpreter (clone3 too, unless an outer filter refuses it)."""
    out = tmp_path / "out"
    out.mkdir()
    run = run_unconfined(_attempt_code(out) + "print(json.dumps(attempt()))", cwd=str(tmp_path))
    assert run.result.exit == 0, run.result.stderr
    outcomes = json.loads(run.result.stdout)
    assert outcomes["os.fork"] == "forked" and outcomes["clone"] == "forked", outcomes
    assert outcomes["clone3"] in ("forked", ENOSYS), outcomes  # Docker's default profile answers ENOSYS
    assert len(list(out.iterdir())) == sum(outcome == "forked" for outcome in outcomes.values())


def test_a_session_step_cannot_fork(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    with pool_process("--workers=1", cwd=tmp_path) as pool:
        _ok(pool.run(_attempt_code(out), session="s", allow_write=["out"]))
        result = _ok(pool.run("import os\nprint(os.getpid(), json.dumps(attempt()))", session="s"))
        pid_text, outcomes = result["stdout"].split(" ", 1)
        _denied(json.loads(outcomes))
        pid = int(pid_text)
        assert _children(pid) == [], proc_table()
        assert list(out.iterdir()) == []
        # The session goes on: the refusals were Python errors, not its end.
        assert _ok(pool.run("print(1 + 1)", session="s"))["stdout"] == "2\n"


def test_a_thread_left_by_a_step_cannot_fork_in_a_later_step_nor_between_steps(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    with pool_process("--workers=1", cwd=tmp_path) as pool:
        first = _ok(pool.run(_attempt_code(out) + _LEAVE_A_THREAD + "import os\nprint(os.getpid())",
                             session="s", allow_write=["out"]))
        pid = int(first["stdout"])
        # Between steps the process is stopped: its thread tries nothing while the pool waits for a step.
        deadline = time.monotonic() + 5
        while procfs.stat(pid).state != "T" and time.monotonic() < deadline:  # the SIGSTOP is on its way
            time.sleep(0.01)
        assert procfs.stat(pid).state == "T", procfs.stat(pid)
        assert len(procfs.tasks(pid)) == 2  # the thread lives on, frozen with the process
        time.sleep(0.3)
        assert procfs.stat(pid).state == "T"
        # The next step runs, and the thread with it: it keeps trying while the step waits.
        result = _ok(pool.run("time.sleep(0.5)\nprint(json.dumps(tries))", session="s"))
        tries = json.loads(result["stdout"])
        assert tries, "the thread left behind did not run during the next step"
        for outcomes in tries:
            _denied(outcomes)
        assert _children(pid) == [], proc_table()
        assert list(out.iterdir()) == []
