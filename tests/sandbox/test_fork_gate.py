"""The fork gate (server/fork_gate.py) under the job's real filter and the pool's real steward.

A job's filter hands ``fork``, ``vfork`` and ``clone`` without ``CLONE_THREAD`` to the steward, which refuses
them with the errno the filter used to give (``EPERM``), unless the pool armed a window for one session fork:
then the session's main thread may fork once, that fork's child may fork once (the double fork that orphans
the copy to the session's template), with glibc's fork flags, and nothing else goes through.

One script plays every part, each in a process of its own: S holds the listener and answers with the pool's
``Steward`` (a child subreaper, as a session's template is to be); P installs the job's own main filter
(``compile_filter``), as a session's process has it, and tries: a fork before any window, in an expired window,
then in an armed one from a thread, with other flags, with the main thread (C1, whose child is the copy), from
the copy, and again from P. The outcomes come back as JSON, with the processes S saw from outside; the test
then checks each, and that the copy was orphaned to S, which reaped it. The control that the same forks work
unconfined is ``test_session_no_fork.py``'s.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.pool.pool_driver import leftover_guard

pytestmark = pytest.mark.timeout(60)

_subreaper = pytest.fixture(scope="module", autouse=True, name="_subreaper")(leftover_guard)

EPERM = 1

_SCRIPT = r"""
import ctypes, json, os, select, socket, threading, time
from pynox.config import landlock_abi_from_environment
from pynox.policy.seccomp import compile_filter, install, syscall_number
from pynox.server.fork_gate import ForkWindow
from pynox.server.steward import Steward

libc = ctypes.CDLL(None, use_errno=True)
libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER: S, as the session's template
S = os.getpid()
ours, theirs = socket.socketpair()
compiled = compile_filter("none", landlock_abi_from_environment() or 1, session=True)


def fork_once():
    try:
        pid = os.fork()
    except OSError as exc:
        return exc.errno
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    return "forked"


p = os.fork()
if p == 0:  # P, the session's process
    try:
        ours.close()
        out = {}
        libc.prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS, as a job's setup sets it
        listener = install(compiled)
        socket.send_fds(theirs, [b"L"], [listener])
        os.close(listener)

        def ask(what):
            theirs.sendall(what)
            theirs.recv(1)

        out["unarmed"] = fork_once()
        ask(b"e")  # an expired window
        out["expired"] = fork_once()
        ask(b"a")  # the window for one session fork
        in_thread = []
        thread = threading.Thread(target=lambda: in_thread.append(fork_once()))
        thread.start()
        thread.join()
        out["thread"] = in_thread[0]
        pid = libc.syscall(syscall_number("clone"), 17, 0, 0, 0, 0)  # SIGCHLD alone: not glibc's flags
        if pid == 0:
            os._exit(0)
        out["other_flags"] = ctypes.get_errno() if pid == -1 else "forked"
        if pid > 0:
            os.waitpid(pid, 0)
        r, w = os.pipe()
        c1 = os.fork()
        if c1 == 0:  # C1
            born_of = os.getpid()
            try:
                copy = os.fork()
            except OSError as exc:
                os.write(w, json.dumps({"c1_fork": exc.errno}).encode())
                os._exit(0)
            if copy == 0:  # the copy
                until = time.monotonic() + 10
                while os.getppid() == born_of and time.monotonic() < until:  # until C1 has exited: orphaned
                    time.sleep(0.01)
                os.write(w, json.dumps({"copy": os.getpid(), "copy_parent": os.getppid(),
                                        "copy_fork": fork_once()}).encode())
                os._exit(0)
            os._exit(0)
        os.waitpid(c1, 0)
        out["main"] = "forked"
        out.update(json.loads(os.read(r, 4096)))
        out["again"] = fork_once()
        os.write(1, (json.dumps(out) + "\n").encode())
    finally:
        os._exit(0)
theirs.close()
_, fds, _, _ = socket.recv_fds(ours, 1, 1)
steward = Steward(fds[0], [], os.getuid(), os.getgid())
deadline = time.monotonic() + 30
while time.monotonic() < deadline:
    ready = select.select([steward.listener, ours], [], [], 0.5)[0]
    if ours in ready:
        asked = ours.recv(1)
        if not asked:
            break
        steward.forks = ForkWindow(p, 0.0 if asked == b"e" else 10.0)
        if asked == b"e":
            time.sleep(0.01)
        ours.sendall(b"k")
    if steward.listener in ready and not steward.answer():
        break
os.waitpid(p, 0)
reaped = []
deadline = time.monotonic() + 10
while not reaped and time.monotonic() < deadline:
    try:
        pid, status = os.waitpid(-1, os.WNOHANG)
    except ChildProcessError:
        break
    if pid:
        reaped.append(pid)
    else:
        time.sleep(0.01)
print(json.dumps({"s": S, "reaped": reaped, "through": steward.forks.through if steward.forks else None}))
steward.close()
"""


def test_only_the_armed_double_fork_goes_through(tmp_path: Path) -> None:
    script = tmp_path / "gate.py"
    script.write_text(_SCRIPT)
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=50, check=False)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.strip().splitlines()
    assert len(lines) == 2, run
    p, s = json.loads(lines[0]), json.loads(lines[1])
    assert p["unarmed"] == EPERM  # the job's own fork, as before: refused
    assert p["expired"] == EPERM
    assert p["thread"] == EPERM  # armed, but not the session's main thread
    assert p["other_flags"] == EPERM  # armed, but not glibc's fork
    assert p["main"] == "forked" and "c1_fork" not in p  # the double fork went through
    assert p["copy_fork"] == EPERM  # the copy keeps the filter, and the window is closed
    assert p["again"] == EPERM  # one fork per window
    assert p["copy_parent"] == s["s"]  # orphaned to the subreaper
    assert s["reaped"] == [p["copy"]]
    assert s["through"] == 2
