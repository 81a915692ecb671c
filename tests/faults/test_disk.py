"""A full disk under a granted directory fails the job that writes there, with the kernel's own error, and nothing else.

The directory is a 1 MiB tmpfs mounted for the test (the suite runs as root).
Where mounting is not allowed, the test falls back to ``max_file_size``
(RLIMIT_FSIZE), which ends the same writes with EFBIG instead of ENOSPC; the
test id says which of the two ran.
"""

from __future__ import annotations

import errno
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.pool.pool_driver import pool_process

pytestmark = pytest.mark.timeout(120)

FILL = "with open('small/fill', 'wb') as out:\n    while True:\n        out.write(b'x' * 65536)"


def _mount_small_tmpfs(target: Path) -> bool:
    try:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0755", "pynox-faults", str(target)],
                       check=True, capture_output=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return False
    return True


def _unmount(target: Path) -> None:
    for options in ([], ["-l"]):  # lazily if something still holds it
        if subprocess.run(["umount", *options, str(target)], capture_output=True, timeout=10).returncode == 0:
            return
    raise AssertionError(f"could not unmount {target}")


@pytest.fixture
def small_disk(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, dict[str, str]]]:
    """(how the disk is made small, the request fields that make it so), recorded in the test's report."""
    target = tmp_path / "small"
    target.mkdir()
    if not _mount_small_tmpfs(target):
        request.node.user_properties.append(("small_disk", "max_file_size (mount refused)"))
        yield "max_file_size", {"max_file_size": "1m"}
        return
    request.node.user_properties.append(("small_disk", "tmpfs of 1 MiB"))
    try:
        yield "tmpfs", {}
    finally:
        _unmount(target)


def test_a_full_disk_in_a_granted_directory_fails_only_the_job_that_fills_it(
        tmp_path: Path, small_disk: tuple[str, dict[str, str]]) -> None:
    how, limit = small_disk
    expected = errno.ENOSPC if how == "tmpfs" else errno.EFBIG
    with pool_process("--workers=2", cwd=tmp_path) as pool:
        beside = [pool.submit(code=f"import time\ntime.sleep(0.2)\nprint({i})") for i in range(4)]
        fill = pool.run(FILL, allow_write=["small"], **limit)
        assert (fill["exit"], fill["error"]["type"]) == (1, "OSError"), fill
        assert fill["error"]["message"].startswith(f"[Errno {expected}]"), fill["error"]
        assert (tmp_path / "small" / "fill").stat().st_size == 1 << 20  # it got exactly what there was
        assert [pool.result(i)["stdout"] for i in beside] == ["0\n", "1\n", "2\n", "3\n"]
        if how == "tmpfs":
            # Still full for the next job: the same clear error for a small write, and the pool unaffected.
            more = pool.run("open('small/more', 'wb').write(b'y' * 8192)", allow_write=["small"])
            assert more["error"]["message"].startswith(f"[Errno {errno.ENOSPC}]"), more
        freed = pool.run("import os\nos.remove('small/fill')\nopen('small/more', 'wb').write(b'y' * 8192)\n"
                         "print('written')", allow_write=["small"], **limit)
        assert freed["stdout"] == "written\n", freed
        assert pool.run("print('served')")["stdout"] == "served\n"
        stats = pool.stats()
        assert stats["worker_errors"] == 0 and stats["errors"]["OSError"] == (2 if how == "tmpfs" else 1)
