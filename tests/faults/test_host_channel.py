"""A job that abuses its host-call channel harms only itself: it cannot outlive its deadline or stall the pool.

The job's end of the channel is descriptor 4; these jobs write frames on it
directly, as a compromised or buggy job could, instead of going through
``pynox_host``.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.pool.pool_driver import pool_process

pytestmark = pytest.mark.timeout(120)


def test_a_job_that_breaks_the_protocol_at_once_is_killed_at_once(tmp_path: Path) -> None:
    """Finding 6: garbage on the channel seen before the template's Started frame (a prepared child runs at
    once) meant a kill with no pidfd to send it to: the job lived until its deadline. Repeated, since it is a race.
    """
    code = "import os\nos.write(4, b'\\x00\\x00\\x00\\x05hello')\nimport time\ntime.sleep(60)"
    with pool_process("--workers=2", cwd=tmp_path) as pool:
        ids = [pool.submit(code=code, functions=["search"], timeout="60s") for _ in range(200)]
        started = time.monotonic()
        for request_id in ids:
            result = pool.result(request_id, timeout=60)
            assert result["error"]["type"] == "PoolWorkerError" and "killed" in result["error"]["message"], result
        assert time.monotonic() - started < 30, "a job that broke the protocol lived on"
        assert pool.run("print('next')")["stdout"] == "next\n"
