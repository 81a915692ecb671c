"""Isolation from the host and from other jobs, proven from outside through a real ``pynox pool``.

The single-job cases (sockets, probing pids, ``/proc``, per-uid budgets) are data in ``cases.py``;
these need more than one process at a time: a host that sends while the job listens, a job that
attacks another job running beside it or the child prepared for the next one, a job that tries to use
up the machine's pid space.
"""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from pynox.policy import cgroups
from pynox.policy.limits import MAX_QUEUED_SIGNALS
from tests.pool.pool_driver import PoolProcess, descendants, leftover_guard, pool_process, proc_table

from .harness import World

pytestmark = pytest.mark.timeout(120)

_subreaper = pytest.fixture(scope="module", autouse=True, name="_subreaper")(leftover_guard)


def _unconfined(code: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout,
                          check=False)


# -- a job reaches no socket outside its own process ------------------------------------------------------

_LISTEN_ABSTRACT = r"""
import ctypes, socket, time
a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
# Detach from the pair (connect to AF_UNSPEC), then take a name anyone on the host can send to.
libc = ctypes.CDLL(None, use_errno=True)
if libc.connect(a.fileno(), (ctypes.c_ushort * 8)(0), 16) != 0:
    raise OSError(ctypes.get_errno(), 'connect(AF_UNSPEC)')
a.bind('\0NAME')
a.settimeout(5)
print('received', a.recv(100))
"""


def _send_until_answered(name: str, stop: threading.Event, sent: list[bytes]) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sender:
        while not stop.is_set():
            try:
                sender.sendto(b"from the host", "\0" + name)
                sent.append(b"from the host")
                return
            except (ConnectionRefusedError, FileNotFoundError):
                time.sleep(0.01)


def _listen_while_the_host_sends(run: object, name: str) -> tuple[str, list[bytes]]:
    stop, sent = threading.Event(), []
    sender = threading.Thread(target=_send_until_answered, args=(name, stop, sent))
    sender.start()
    try:
        output = run(_LISTEN_ABSTRACT.replace("NAME", name))  # type: ignore[operator]
    finally:
        stop.set()
        sender.join()
    return output, sent


def test_a_job_cannot_receive_on_an_abstract_name(tmp_path: Path) -> None:
    name = "pynox-test-listen-" + secrets.token_hex(6)
    with pool_process("--workers=1", cwd=tmp_path) as pool:
        result, sent = _listen_while_the_host_sends(lambda code: pool.run(code, wait=30), name)
    assert result["error"]["type"] == "PermissionError", result
    assert sent == [], "a host process reached a socket of the job"
    # Control: unconfined, the same code takes the name and receives what the host sends.
    control, sent = _listen_while_the_host_sends(lambda code: _unconfined(code).stdout, name + "-control")
    assert control == "received b'from the host'\n" and sent, control


# -- a job cannot disturb another process -----------------------------------------------------------------

_DISTURB = """
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
pid = int(sys.argv[1])
done = []
for name, call in [
    ("nice", lambda: os.setpriority(os.PRIO_PROCESS, pid, 19)),
    ("idle", lambda: os.sched_setscheduler(pid, os.SCHED_IDLE, os.sched_param(0))),
    ("affinity", lambda: os.sched_setaffinity(pid, {0})),
    ("ioprio", lambda: libc.syscall(NR_IOPRIO_SET, 1, pid, 3 << 13) == 0 or 1 / 0),
]:
    try:
        call()
        done.append(name)
    except (OSError, ZeroDivisionError):
        pass
print(done)
"""


def _disturb() -> str:
    return _DISTURB.replace("NR_IOPRIO_SET", _ioprio_number())


def _prepared_child(pool: PoolProcess, timeout: float = 10.0) -> int:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        table = proc_table()
        found = [pid for pid in descendants(pool.pid, table) if table[pid][3] == "pynox-ready"]
        if found:
            return found[0]
        time.sleep(0.01)
    raise AssertionError("no prepared child")


def test_a_job_cannot_degrade_a_job_running_beside_it(tmp_path: Path) -> None:
    with pool_process("--workers=2", cwd=tmp_path) as pool:
        victim = pool.submit(code="import os, time\nprint(os.getpid(), flush=True)\n"
                                  "open('pid', 'w').write(str(os.getpid()))\ntime.sleep(1.5)",
                             allow_write=[str(tmp_path)])
        end = time.monotonic() + 10
        while not (tmp_path / "pid").exists() or not (tmp_path / "pid").read_text():
            assert time.monotonic() < end, "the victim never started"
            time.sleep(0.01)
        pid = int((tmp_path / "pid").read_text())
        before = World.scheduling(pid)
        attack = pool.run(_disturb(), args=[str(pid)])
        during = World.scheduling(pid)  # the victim still runs: seen from the host, unchanged
        assert pool.result(victim)["exit"] == 0
    assert attack["stdout"] == "[]\n", attack
    assert during == before, (before, during)


def test_a_job_cannot_degrade_the_child_prepared_for_the_next_job(tmp_path: Path) -> None:
    attacker_dir, tenant = tmp_path / "attacker", tmp_path / "tenant"
    attacker_dir.mkdir()
    tenant.mkdir()
    target = attacker_dir / "target"
    # The attacker waits for a pid, then goes for it; it runs on one worker while the other prepares.
    wait_then_disturb = (f"import os, sys, time\nend = time.monotonic() + 10\n"
                         f"while not os.path.exists({str(target)!r}) and time.monotonic() < end:\n"
                         f"    time.sleep(0.01)\nsys.argv[1:] = [open({str(target)!r}).read()]\n") + _DISTURB
    with pool_process("--workers=2", cwd=tmp_path) as pool:
        attack = pool.submit(code=wait_then_disturb.replace("NR_IOPRIO_SET", _ioprio_number()),
                             allow_write=[str(attacker_dir)])
        assert pool.run("print('first')", allow_write=[str(tenant)])["exit"] == 0  # on the other worker
        prepared = _prepared_child(pool)  # confined for this tenant's next job
        before = World.scheduling(prepared)
        target.write_text(str(prepared))
        result = pool.result(attack)
        assert result["stdout"] == "[]\n", result
        assert World.scheduling(prepared) == before  # seen from the host, before it serves anyone
        # The tenant's next job runs at full speed, wherever it lands.
        mine = pool.run("import os; print(os.getpriority(os.PRIO_PROCESS, 0), os.sched_getscheduler(0))",
                        allow_write=[str(tenant)])
        # The pool runs at this test's own niceness (a CI runner may itself be niced).
        assert mine["stdout"] == f"{os.getpriority(os.PRIO_PROCESS, 0)} {os.SCHED_OTHER}\n", mine


def _ioprio_number() -> str:
    import pyseccomp

    return str(pyseccomp.resolve_syscall(pyseccomp.Arch.NATIVE, "ioprio_set"))


def test_the_disturbance_is_real_unconfined(tmp_path: Path) -> None:
    world = World(tmp_path / "world")
    try:
        before = world.scheduling(world.capless.pid)
        done = _unconfined(_disturb().replace("int(sys.argv[1])", str(world.capless.pid)))
        assert done.stdout == "['nice', 'idle', 'affinity', 'ioprio']\n", done.stderr
        assert world.scheduling(world.capless.pid) != before
    finally:
        world.close()


# -- a job cannot exhaust a kernel budget the machine shares ---------------------------------------------

_THREADS = """
import threading
threading.stack_size(32768)
release = threading.Event()
started = 0
try:
    for _ in range(COUNT):
        threading.Thread(target=release.wait, daemon=True).start()
        started += 1
finally:
    print('started', started, flush=True)
    release.set()
"""


@pytest.mark.needs_root("an ordinary user cannot make the pids cgroup without delegation; there only its "
                        "RLIMIT_NPROC bounds threads, for all its processes together (the contract says so)")
def test_threads_of_a_job_are_bounded(tmp_path: Path) -> None:
    bounds = cgroups.available()
    limit, reason = bounds.pids, bounds.pids_reason
    if limit is None:
        if os.environ.get("CI"):
            pytest.fail(f"CI must prove the thread bound: {reason}", pytrace=False)
        pytest.skip(reason)
    with pool_process("--workers=1", cwd=tmp_path) as pool:
        # Memory alone would allow thousands of threads with small stacks.
        flood = pool.run(_THREADS.replace("COUNT", "5000"), memory="512m", timeout="20s", wait=40)
        assert flood["stdout"] == f"started {cgroups.MAX_JOB_TASKS - 1}\n", flood
        assert flood["error"]["type"] == "RuntimeError" and "threads" in flood["error"]["hint"], flood
        # Control: below the bound threads work, so the bound is what stopped the flood.
        fine = pool.run(_THREADS.replace("COUNT", str(cgroups.MAX_JOB_TASKS - 10)), memory="512m")
        assert fine["exit"] == 0 and fine["stdout"] == f"started {cgroups.MAX_JOB_TASKS - 10}\n", fine
        # From outside: the template's own cgroup holds the bound.
        (template,) = pool.templates()
        (bound_file,) = Path(limit.base).glob(f"pynox-{pool.pid}-*/template-{template}/pids.max")
        bound = bound_file.read_text()
        assert bound == f"{cgroups.MAX_JOB_TASKS + 1}\n"


_QUEUE_SIGNALS = """
import ctypes, signal
libc = ctypes.CDLL(None, use_errno=True)
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGRTMIN})
class Value(ctypes.Union):
    _fields_ = [("number", ctypes.c_int), ("pointer", ctypes.c_void_p)]
queued = 0
for _ in range(2000):
    if libc.sigqueue(libc.getpid(), signal.SIGRTMIN, Value(number=1)) != 0:
        break
    queued += 1
print('queued', queued)
"""


def test_queued_signals_of_a_job_are_bounded(tmp_path: Path) -> None:
    with pool_process("--workers=1", cwd=tmp_path) as pool:
        result = pool.run(_QUEUE_SIGNALS)
    assert result["exit"] == 0, result
    assert int(result["stdout"].split()[1]) <= MAX_QUEUED_SIGNALS, result
    # Control: unconfined, the same process queues all 2000 (the uid's budget is far larger).
    assert _unconfined(_QUEUE_SIGNALS).stdout == "queued 2000\n"
