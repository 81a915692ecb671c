"""A deadline is absolute: after it, nothing the pool does waits on the job, and the job runs no more.

Each attack is checked from the host: the result's timing, a file the job keeps writing in its
write grant (its size is read after the result), and the job's process in ``/proc``.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.harness import procfs
from tests.harness.job_code import CLOSE_OUTPUTS
from tests.pool.pool_driver import pool_process, proc_table, refused, wait_gone

pytestmark = pytest.mark.timeout(120)

# The job declares a host function, then writes 20,000 calls of an undeclared name on its channel (4):
# each is answered by the pool. It reads the answers back as a trickle, writes a report of its own and
# closes its outputs (1-3), and keeps reading and writing into its grant. Bounded at 20 s, so that a pool
# that waits on it still answers within the test's time.
_SLOW_READER = """
import json, os, socket, struct, time
channel = socket.socket(fileno=4)
payload = json.dumps({'function': 'undeclared', 'args': [], 'kwargs': {}}).encode()
channel.sendall((struct.pack('!I', len(payload)) + payload) * 20_000)
log = open('grant/trace', 'a', buffering=1)
log.write(f'pid {os.getpid()}\\n')
os.write(3, b'{"exit": 0}')
""" + CLOSE_OUTPUTS + """end = time.monotonic() + 20
while time.monotonic() < end:
    channel.recv(512)
    log.write(f'{time.monotonic()}\\n')
    time.sleep(0.02)
"""


def _pid_in(trace: Path) -> int:
    first = trace.read_text().splitlines()[0]
    assert first.startswith("pid "), first
    return int(first.split()[1])


def test_a_job_that_reads_its_answers_slowly_ends_at_its_deadline(tmp_path: Path) -> None:
    """Finding 1 of issue 30: the pool's teardown of the host channel waited for the job to read every
    answer queued for it (5 s per frame, 20,000 frames) before the job was killed, past its deadline."""
    (tmp_path / "grant").mkdir()
    trace = tmp_path / "grant" / "trace"
    with pool_process("--workers=1", cwd=tmp_path) as pool:
        started = time.monotonic()
        result = pool.run(_SLOW_READER, wait=60, functions=["search"], allow_write=["grant"], timeout="1s")
        took = time.monotonic() - started
        size_at_result = trace.stat().st_size
        pid = _pid_in(trace)
        time.sleep(1.5)
        grew = trace.stat().st_size - size_at_result
        assert took < 3, f"a job with a 1 s deadline was answered after {took:.1f} s: {result}"
        assert wait_gone([pid], 1.0) == [], f"the job's process {pid} still runs after its result"
        assert grew == 0, f"the job wrote {grew} bytes into its grant after its result"
        # The worker is free at once.
        begun = time.monotonic()
        assert pool.run("print('next')", wait=5)["stdout"] == "next\n"
        assert time.monotonic() - begun < 2
    assert pid not in proc_table() or proc_table()[pid][1] == "Z"


# A session step that leaves a thread behind: it burns CPU and writes into the grant every 50 ms.
_LEFT_BEHIND = """
import os, threading, time
def work():
    with open('grant/beat', 'a', buffering=1) as beat:
        while True:
            end = time.monotonic() + 0.05
            while time.monotonic() < end:
                pass
            beat.write('.\\n')
threading.Thread(target=work, daemon=True).start()
print(os.getpid())
"""


def _cpu_ticks(pid: int) -> int:
    """utime + stime of the whole process, in clock ticks, read from the host."""
    fields = procfs.stat(pid).fields
    return int(fields[11]) + int(fields[12])


def _state(pid: int) -> str:
    return procfs.stat(pid).state


def test_a_session_runs_nothing_between_its_steps(tmp_path: Path) -> None:
    """Finding 6 of issue 30: a step's background thread ran on after the step's result (and its 2 s
    deadline), writing and burning CPU until the session was closed."""
    import os

    (tmp_path / "grant").mkdir()
    beat = tmp_path / "grant" / "beat"
    ticks = os.sysconf("SC_CLK_TCK")
    with pool_process("--workers=1", cwd=tmp_path) as pool:
        first = pool.run(_LEFT_BEHIND, session="busy", allow_write=["grant"], timeout="2s")
        assert first["exit"] == 0, first
        pid = int(first["stdout"])
        size, cpu = beat.stat().st_size, _cpu_ticks(pid)
        time.sleep(3)  # past the step's deadline too
        grew, used = beat.stat().st_size - size, (_cpu_ticks(pid) - cpu) / ticks
        assert grew == 0, f"the session wrote {grew} bytes into its grant between steps"
        assert used < 0.05, f"the session used {used:.2f} s of CPU between steps"
        assert _state(pid) == "T", "the session's process is not stopped between steps"
        # The next step continues it, under the next step's own deadline: the thread runs while it does.
        second = pool.run("import time\ntime.sleep(0.5)", session="busy", timeout="2s")
        assert second["exit"] == 0 and second["session_ended"] is False, second
        assert beat.stat().st_size > size, "the step's thread did not run on during the next step"
        size = beat.stat().st_size
        time.sleep(1)
        assert beat.stat().st_size == size and _state(pid) == "T"
        # A stopped session is closed, killed and reaped like any other (no leftover: pool_process checks).
        assert pool.run(session="busy", close=True)["closed"] is True
        assert wait_gone([pid], 5) == []


def test_a_stopped_session_is_closed_when_idle(tmp_path: Path) -> None:
    with pool_process("--workers=1", "--session-idle=1s", cwd=tmp_path) as pool:
        pid = int(pool.run("import os\nprint(os.getpid())", session="idle")["stdout"])
        assert wait_gone([pid], 10) == [], "an idle stopped session was not closed"
        # Closed, so its next step (a later step, "open": false) is refused; a session opened again under the
        # name starts at step 1, and says why the state is gone.
        refused(pool.run("print(1)", session="idle", open=False), "no open session", "session_idle")
        reopened = pool.run("print(1)", session="idle", open=True)
        assert reopened["step"] == 1 and "session_idle" in reopened["session_reopened"], reopened


def test_a_cancelled_slow_reader_ends_at_the_cancel(tmp_path: Path) -> None:
    """The same reader, without a report of its own and with a long timeout: a cancel ends it at once."""
    (tmp_path / "grant").mkdir()
    trace = tmp_path / "grant" / "trace"
    code = _SLOW_READER.replace("os.write(3, b'{\"exit\": 0}')\n" + CLOSE_OUTPUTS, "")
    assert code != _SLOW_READER
    with pool_process("--workers=1", cwd=tmp_path) as pool:
        job = pool.submit(code=code, functions=["search"], allow_write=["grant"], timeout="60s")
        # Cancelled once it reads its answers slowly (its trace has a line of that loop). A second's sleep instead
        # came before it had sent its calls under load, its trace not yet written (2 of 7 loops of this file).
        end = time.monotonic() + 30
        while not (trace.exists() and len(trace.read_text().splitlines()) >= 2):
            assert time.monotonic() < end and not pool.responses(job), pool.responses(job)
            time.sleep(0.02)
        asked = time.monotonic()
        assert pool.result(pool.submit(cancel=job))["cancelled"] == job
        result = pool.result(job, timeout=30)
        took = time.monotonic() - asked
        assert result["error"]["type"] == "CancelledError", result
        assert took < 2, f"the cancelled job was answered {took:.1f} s after the cancel"
        size = trace.stat().st_size
        time.sleep(1)
        assert trace.stat().st_size == size, "the cancelled job wrote on into its grant"
        assert wait_gone([_pid_in(trace)], 1.0) == []


# The job opens a read end of its own stdout pipe through /proc/self/fd/1 (a pipe opened so is either end).
# "steal": it writes a byte and reads it back at once, over and over: the pool, woken by the byte, may find the
# pipe emptied. "reopen": it fills the pipe, closes its only write end (the pool sees the hang-up) and opens a
# new one through its read end before the pool has read what the pipe held ("flood": and writes through it
# without end, so that the pipe is never empty when the pool reads to its end). Either way a blocking read of the
# pool's waited on a pipe that a live writer held and nobody wrote to again.
_OWN_PIPE = """
import fcntl, os, sys, time
mine = os.open('/proc/self/fd/1', os.O_RDONLY)
stolen = 0
if {how!r} == 'steal':
    end = time.monotonic() + 1.5
    while time.monotonic() < end:
        os.write(1, b'x')
        os.set_blocking(mine, False)
        try:
            stolen += len(os.read(mine, 1))
        except BlockingIOError:
            pass
else:
    fcntl.fcntl(1, 1031, 1 << 20)  # F_SETPIPE_SZ: 1 MiB for the pool to read after the hang-up
    os.set_blocking(1, False)
    try:
        while True:
            os.write(1, b'x' * 65536)
    except BlockingIOError:
        pass
    os.close(1)
    writer = os.open(f'/proc/self/fd/{{mine}}', os.O_WRONLY)
    while {how!r} == 'flood':  # and writes on: the pool's read to the end must still end
        os.write(writer, b'y' * 65536)
os.write(2, f'stolen {{stolen}}\\n'.encode())
time.sleep(30)
"""


@pytest.mark.parametrize("how", ["steal", "reopen", "flood"])
def test_a_job_holding_a_read_end_of_its_own_output_ends_at_its_deadline(tmp_path: Path, how: str) -> None:
    """Review of the job's pipes: the pool's ends were blocking, so a job that holds a read end of its own
    output (its /proc/self/fd grants it) could leave the pool's read waiting with the pipe empty and a writer
    alive: the worker's loop, which also keeps the deadline, stopped, and the job ran on with no result, the
    worker lost for good. Each job must end at its 2 s deadline and the worker serve the next. The control:
    the job does read its own output back (stderr)."""
    with pool_process("--workers=1", cwd=tmp_path) as pool:
        for _ in range(3 if how == "steal" else 6):
            started = time.monotonic()
            result = pool.result(pool.submit(code=_OWN_PIPE.format(how=how), timeout=2), timeout=20)
            assert time.monotonic() - started < 10, result
            assert result["error"] is not None and result["error"]["type"] == "TimeoutError", result
            if how == "steal":
                assert int(result["stderr"].split()[-1]) > 0, result["stderr"]  # the control
            assert pool.run("print(5)")["stdout"] == "5\n"


def test_a_session_step_holding_a_read_end_of_its_own_output_ends_at_its_deadline(tmp_path: Path) -> None:
    """As a job's (above), for a session's step, whose pipes the pool makes for each step: each step that steals
    from its own stdout ends at its 2 s deadline, and the pool serves on. The control: the step does read its own
    output back (stderr)."""
    with pool_process("--workers=1", cwd=tmp_path) as pool:
        for i in range(3):
            assert pool.run("x = 1", session=f"s{i}")["error"] is None  # the steal is a later step's
            started = time.monotonic()
            result = pool.result(pool.submit(code=_OWN_PIPE.format(how="steal"), session=f"s{i}", timeout=2),
                                 timeout=20)
            assert time.monotonic() - started < 10, result
            assert result["error"] is not None and result["error"]["type"] == "TimeoutError", result
            assert int(result["stderr"].split()[-1]) > 0, result["stderr"]  # the control
            assert pool.run("print(5)")["stdout"] == "5\n"
