"""The kernel facts the design of a session fork rests on (docs/architecture.md, "Forking a session").

Not a test of the product: a check that this kernel behaves as the design needs, so that a kernel where it does
not is found before the design is built on it. One script plays every part in processes of its own:

* S, a child subreaper holding the listener of P's filter, as the session's template and the pool's steward
  would: it lets through exactly two forks (P's, then that of P's child C1) and refuses the third;
* P, under a filter that sends ``fork`` and ``clone`` without ``CLONE_THREAD`` to the listener (installed as
  a session's child installs its filter, ``policy.seccomp.install``), with a parent-death signal armed;
* C1, which forks the copy and exits at once, so the copy is orphaned.

The facts: the notification carries the caller's tid and glibc's fork flags (registers, copied by the kernel),
``SECCOMP_USER_NOTIF_FLAG_CONTINUE`` lets a fork through, the copy inherits the filter and its listener (its own
fork reaches S, which refuses it), the copy's parent-death signal is cleared by the fork, and the orphaned copy
becomes the subreaper's child, which reaps it with its exit status.
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

_GLIBC_FORK = 0x1200011  # CLONE_CHILD_SETTID | CLONE_CHILD_CLEARTID | SIGCHLD

_SCRIPT = r"""
import ctypes, json, os, select, signal, socket, struct, time
import pyseccomp
from pynox.policy.seccomp import CompiledFilter, install

libc = ctypes.CDLL(None, use_errno=True)
libc.ioctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p]
NOTIF, RESPONSE = struct.Struct("=QII iIQ 6Q"), struct.Struct("=QqiI")
RECV, SEND, CONTINUE = 0xC0502100, 0xC0182101, 1
PR_SET_PDEATHSIG, PR_GET_PDEATHSIG, PR_SET_NO_NEW_PRIVS, PR_SET_CHILD_SUBREAPER = 1, 2, 38, 36

libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
ours, theirs = socket.socketpair()
p = os.fork()
if p == 0:  # P, the session's process
    try:
        ours.close()
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
        f = pyseccomp.SyscallFilter(pyseccomp.ALLOW)
        f.add_rule(pyseccomp.NOTIFY, "clone", pyseccomp.Arg(0, pyseccomp.MASKED_EQ, 0x10000, 0))
        f.add_rule(pyseccomp.NOTIFY, "fork")
        with os.fdopen(os.memfd_create("bpf"), "w+b") as out:
            f.export_bpf(out)
            out.seek(0)
            bpf = out.read()
        listener = install(CompiledFilter(network="none", bpf=bpf, unknown=()))
        socket.send_fds(theirs, [b"L"], [listener])
        os.close(listener)
        r, w = os.pipe()
        c1 = os.fork()
        if c1 == 0:
            if os.fork() == 0:  # the copy
                while os.getppid() != int(os.environ["S"]):
                    time.sleep(0.01)
                armed = ctypes.c_int(-1)
                libc.prctl(PR_GET_PDEATHSIG, ctypes.byref(armed), 0, 0, 0)
                try:
                    os._exit(0) if os.fork() == 0 else None
                    third = "forked"
                except OSError as exc:
                    third = exc.errno
                os.write(w, json.dumps({"copy": os.getpid(), "parent": os.getppid(), "pdeathsig": armed.value,
                                        "its_own_fork": third}).encode())
                os._exit(7)
            os._exit(0)
        os.waitpid(c1, 0)
        os.write(1, os.read(r, 4096) + b"\n")
    finally:
        os._exit(0)
theirs.close()
_, fds, _, _ = socket.recv_fds(ours, 1, 1)
listener = fds[0]
calls = []
deadline = time.monotonic() + 20
while len(calls) < 3 and time.monotonic() < deadline:
    if not select.select([listener], [], [], 0.2)[0]:
        continue
    raw = ctypes.create_string_buffer(NOTIF.size)
    if libc.ioctl(listener, RECV, raw) != 0:
        continue
    notif_id, tid, _, _, _, _, *args = NOTIF.unpack(raw.raw)
    calls.append({"tid": tid, "flags": args[0]})
    answer = RESPONSE.pack(notif_id, 0, 0, CONTINUE) if len(calls) <= 2 else RESPONSE.pack(notif_id, 0, -1, 0)
    libc.ioctl(listener, SEND, ctypes.create_string_buffer(answer, RESPONSE.size))
os.waitpid(p, 0)
reaped = {}
deadline = time.monotonic() + 10
while not reaped and time.monotonic() < deadline:
    try:
        pid, status = os.waitpid(-1, os.WNOHANG)
    except ChildProcessError:
        time.sleep(0.01)
        continue
    if pid:
        reaped = {"pid": pid, "exit": os.waitstatus_to_exitcode(status)}
    else:
        time.sleep(0.01)
print(json.dumps({"s": os.getpid(), "p": p, "calls": calls, "reaped": reaped}))
"""


def test_a_fork_let_through_by_the_listener_is_orphaned_to_the_subreaper_and_keeps_the_filter(tmp_path: Path) -> None:
    script = tmp_path / "facts.py"
    script.write_text(_SCRIPT)
    # S's pid is the script's: the copy waits until it is its parent (the orphaning is asynchronous).
    run = subprocess.run([sys.executable, "-c", f"import os, runpy; os.environ['S'] = str(os.getpid()); "
                                                f"runpy.run_path({str(script)!r}, run_name='__main__')"],
                         capture_output=True, text=True, timeout=40, check=False)
    assert run.returncode == 0, run.stderr
    copy_line, s_line = run.stdout.strip().splitlines()
    copy, s = json.loads(copy_line), json.loads(s_line)
    first, second, third = s["calls"]
    assert first == {"tid": s["p"], "flags": _GLIBC_FORK}  # P's fork: its tid, glibc's flags
    assert second["flags"] == _GLIBC_FORK and second["tid"] not in (s["p"], copy["copy"])  # C1's
    assert third == {"tid": copy["copy"], "flags": _GLIBC_FORK}  # the copy's own: the same listener
    assert copy["its_own_fork"] == 1  # EPERM, as S answered
    assert copy["pdeathsig"] == 0  # cleared by the fork: the copy must arm its own
    assert copy["parent"] == s["s"]  # orphaned to the subreaper
    assert s["reaped"] == {"pid": copy["copy"], "exit": 7}  # which reaps it, with its status
