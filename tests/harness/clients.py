"""A client process a test starts beside a pool (a program that owns a pool, then is killed): ended and
unmarked in one place, however its test ended."""

from __future__ import annotations

import subprocess

from tests.pool.pool_driver import unmark_live


def end_client(client: subprocess.Popen[bytes]) -> None:
    """Kill ``client`` if it still runs, close its stdout and take its pid off the live pools' marks."""
    if client.poll() is None:
        client.kill()
        client.wait(10)
    if client.stdout is not None:
        client.stdout.close()
    unmark_live(client.pid)
