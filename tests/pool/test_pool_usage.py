"""``usage``: what each job's process used, from the kernel, on every result and log line.

Each figure is checked against a job that should move it and one that should not, so a field
that stayed zero, or counted the wrong process, fails.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .pool_driver import PoolProcess, pool_process

pytestmark = pytest.mark.timeout(120)

USAGE_FIELDS = {"cpu_ms", "max_rss_kb", "memory_peak_kb", "host_calls", "stdout_bytes", "stderr_bytes"}
# Burns CPU in the job's own process: process_time counts this process only.
_BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < {seconds}: pass\n"


def test_cpu_time_is_the_jobs_own(pool: PoolProcess) -> None:
    idle = pool.run("import time; time.sleep(0.3)")["usage"]
    busy = pool.run(_BURN.format(seconds=0.3))["usage"]
    assert set(busy) == USAGE_FIELDS
    assert busy["cpu_ms"] >= 280, busy
    # Sleeping costs no CPU: what is left is the process's own start (its confinement), a few ms.
    assert idle["cpu_ms"] < 100, idle


def test_cpu_time_of_threads_counts(pool: PoolProcess) -> None:
    code = ("import threading\n" + "def burn():\n    " + _BURN.replace("process_time()", "thread_time()")
            .format(seconds=0.15).replace("\n", "\n    ") +
            "\nthreads = [threading.Thread(target=burn) for _ in range(2)]\n"
            "[t.start() for t in threads]\n[t.join() for t in threads]")
    assert pool.run(code)["usage"]["cpu_ms"] >= 280


def test_peak_memory_is_the_jobs(pool: PoolProcess) -> None:
    small = pool.run("print(1)")["usage"]
    big = pool.run("b = bytearray(200 * 1024 * 1024)\nb[::4096] = b'x' * len(b[::4096])\nprint(len(b))",
                   memory="1g")["usage"]
    assert big["max_rss_kb"] - small["max_rss_kb"] >= 190 * 1024, (small, big)
    assert 0 < small["max_rss_kb"] < 100 * 1024, small


def test_a_job_that_exits_at_once_is_measured_too(pool: PoolProcess) -> None:
    # Answered as its process exits: its memory is measured by wait4, never reported as zero.
    for _ in range(5):
        usage = pool.run("raise SystemExit(3)")["usage"]
        assert usage["max_rss_kb"] > 0 and usage["cpu_ms"] > 0, usage


def test_output_bytes_count_what_was_written_not_what_was_kept(pool: PoolProcess) -> None:
    result = pool.run("import sys\nprint('x' * 4999)\nsys.stderr.write('é' * 10)", max_output=100)
    assert len(result["stdout"]) == 100 and result["stdout_truncated"]
    assert result["usage"]["stdout_bytes"] == 5000
    assert result["usage"]["stderr_bytes"] == 20  # bytes, not characters


def test_host_calls_count_the_calls_that_reached_the_host(pool: PoolProcess) -> None:
    code = "from pynox_host import f\nfor _ in range(3):\n    f()"
    result = pool.run(code, host={"f": lambda: 1})
    assert result["exit"] == 0, result
    assert result["usage"]["host_calls"] == 3
    assert pool.run("print(1)")["usage"]["host_calls"] == 0


def test_a_session_step_reports_its_own_cpu(pool: PoolProcess) -> None:
    first = pool.run(_BURN.format(seconds=0.3), session="usage-steps")
    second = pool.run("x = 1", session="usage-steps")
    third = pool.run(_BURN.format(seconds=0.2) + "raise SystemExit(0)", session="usage-steps")
    assert first["usage"]["cpu_ms"] >= 280
    assert second["usage"]["cpu_ms"] < 50, second["usage"]
    assert third["usage"]["cpu_ms"] >= 180 and third["session_ended"], third
    assert third["usage"]["cpu_ms"] < 280, "the step counted the steps before it"


def test_a_refused_request_has_no_usage(pool: PoolProcess) -> None:
    assert pool.run("print(1)", nonsense=True)["usage"] is None


def test_the_log_line_carries_usage(tmp_path: Path) -> None:
    with pool_process("--workers=1", "--log=json", cwd=tmp_path) as pool:
        result = pool.run("print('abc')")
    [line] = [json.loads(raw) for raw in pool.stderr.decode().splitlines() if '"event":"job"' in raw]
    assert line["usage"] == result["usage"] and line["usage"]["stdout_bytes"] == 4


def test_a_session_steps_peak_memory_is_read_anew_each_step(pool: PoolProcess) -> None:
    # The pool keeps the session's process's status file open between steps (server/usage.py): each step's
    # figure must be the kernel's at that step's end, never the first step's read again.
    small = pool.run("x = 1", session="usage-peak", memory="1g")["usage"]
    big = pool.run("b = bytearray(200 * 1024 * 1024)\nb[::4096] = b'x' * len(b[::4096])", session="usage-peak")["usage"]
    assert 0 < small["max_rss_kb"] < 100 * 1024, small
    assert big["max_rss_kb"] - small["max_rss_kb"] >= 190 * 1024, (small, big)


# In a pid namespace of its own (and a user namespace, for the right to set the next pid): a session's process
# measured, reaped, and another given its number, as a pid space that wrapped around does.
_PID_REUSED = """
import os, sys, time
from pynox.server.usage import StatusKept
kept = StatusKept()
def sleeper() -> int:
    pid = os.fork()
    if pid == 0:
        time.sleep(60)
        os._exit(0)
    return pid
first = sleeper()
assert kept.usage(first) is not None
os.kill(first, 9)
os.waitpid(first, 0)
with open("/proc/sys/kernel/ns_last_pid", "w") as last:
    last.write(str(first - 1))
second = sleeper()
try:
    assert second == first, (first, second)
    print(StatusKept().usage(second) is not None, kept.usage(second) is not None)
finally:
    os.kill(second, 9)
"""


def test_a_session_process_given_the_number_of_one_measured_before_is_measured() -> None:
    """Review of StatusKept (a session's /proc/<pid>/status kept open between steps): kept by the pid's number,
    the descriptor of a process reaped since was read for another process given the same number: it never read
    the other's status (it names the process, not the number), but every measure failed, and each step of that
    session waited for an end that did not come (``_await_end``) and left its usage unmeasured. The control: a
    status file opened afresh measures the second process."""
    unshare = shutil.which("unshare")
    if unshare is None or subprocess.run([unshare, "--user", "--map-root-user", "--pid", "--fork", "--mount-proc",
                                          "true"], capture_output=True).returncode != 0:
        pytest.skip("no user and pid namespace here (unshare fails)")
    done = subprocess.run([unshare, "--user", "--map-root-user", "--pid", "--fork", "--mount-proc",
                           sys.executable, "-c", _PID_REUSED], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "True"], done.stdout
