"""A deadline is absolute: after it, nothing the pool does waits on the job, and the job runs no more.

Each attack is checked from the host: the result's timing, a file the job keeps writing in its
write grant (its size is read after the result), and the job's process in ``/proc``.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.pool.pool_driver import pool_process, proc_table, wait_gone

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
for fd in (1, 2, 3):
    os.close(fd)
end = time.monotonic() + 20
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
