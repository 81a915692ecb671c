"""A pool killed with SIGKILL and restarted at once (systemd's ``Restart=always``) leaves no cgroups for the
replacement's life: the replacement's start removes them although they are seconds old, because the dead pool's
pid and start time name no live process. A live pool's cgroups are never touched (the control)."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from pynox.policy import cgroups
from tests.harness import procfs
from tests.pool.pool_driver import PoolProcess, leftover_guard, pool_process

pytestmark = pytest.mark.timeout(120)

_guard = pytest.fixture(autouse=True, name="_guard")(leftover_guard)


def _pools(base: str, pid: int) -> list[str]:
    return [entry.name for entry in os.scandir(base) if entry.name.startswith(f"pynox-{pid}-")]


@pytest.fixture
def bases() -> Iterator[list[str]]:
    found = [hierarchy.base for hierarchy in cgroups.available(fresh=True).hierarchies()]
    if not found:
        pytest.skip("no cgroup can be made here")
    yield found


@pytest.mark.needs_root("an ordinary user cannot make cgroups without delegation")
def test_a_killed_pools_young_cgroups_are_swept_by_the_next_start(tmp_path: Path, bases: list[str]) -> None:
    with pool_process("--workers=1", cwd=tmp_path) as live:  # the control: a live pool beside both
        assert live.run("print(1)")["exit"] == 0
        killed = PoolProcess("--workers=1", cwd=tmp_path)
        assert killed.run("print(1)")["exit"] == 0
        left = {base: _pools(base, killed.pid) for base in bases}
        assert all(left.values()), left
        killed.kill()  # SIGKILL: its atexit cleanup never runs; its templates die with it
        assert killed.proc.returncode == -signal.SIGKILL
        for base, names in left.items():
            assert all(os.path.isdir(os.path.join(base, name)) for name in names)  # left behind, seconds old
        with pool_process("--workers=1", cwd=tmp_path) as replacement:
            assert replacement.run("print(1)")["exit"] == 0
            for base, names in left.items():
                assert not any(os.path.exists(os.path.join(base, name)) for name in names), (base, names)
                assert _pools(base, live.pid), "the live pool's cgroups were swept"
        assert live.run("print(2)")["stdout"] == "2\n"  # and it still confines its jobs in them


def _start_ticks(pid: int) -> int:
    return procfs.stat(pid).start


@pytest.mark.needs_root("an ordinary user cannot make cgroups without delegation")
def test_a_dead_pools_cgroups_under_another_parent_are_swept(tmp_path: Path, bases: list[str]) -> None:
    """A pool started from another cgroup (another service's, another user's) left its cgroups there when it
    died: the next pool's start removes them, wherever they are. A pool there that is alive (this test's own
    pid and start time in the name) is left alone: the control."""
    me, ticks = os.getpid(), _start_ticks(os.getpid())
    made: list[str] = []
    try:
        for base in bases:
            other = os.path.join(base, f"other-parent-{os.urandom(4).hex()}")
            os.mkdir(other)
            made.append(other)
            for name in (f"pynox-{me}-{ticks + 1}-deadbeef", f"pynox-{me}-{ticks}-cafef00d"):
                os.mkdir(os.path.join(other, name))
                os.mkdir(os.path.join(other, name, "w0"))
                # A tenant's cgroup with a template's beneath it: a level deeper (see cgroups.TenantGroup).
                os.mkdir(os.path.join(other, name, "tenant-0-ci"))
                os.mkdir(os.path.join(other, name, "tenant-0-ci", "template-1"))
                made[:0] = [os.path.join(other, name, "tenant-0-ci", "template-1"),
                            os.path.join(other, name, "tenant-0-ci"), os.path.join(other, name, "w0"),
                            os.path.join(other, name)]
        with pool_process("--workers=1", cwd=tmp_path) as pool:
            assert pool.run("print(1)")["exit"] == 0
            for other in [path for path in made if os.path.basename(path).startswith("other-parent-")]:
                left = sorted(entry.name for entry in os.scandir(other) if entry.is_dir())
                assert left == [f"pynox-{me}-{ticks}-cafef00d"], (other, left)  # the dead one's gone, the live kept
    finally:
        for path in made:
            cgroups.remove(path)
