"""A job's threads share a CPU quota: they cannot keep every core busy for the job's whole timeout.

Native code releases the GIL (hashlib here), so a job's threads can run on every core at once. Where a cpu
cgroup controller can be had, each template's cgroup has a quota of ``[pool] job_cpu`` CPUs, one by default
(policy/cgroups.py). Proven from outside: the quota in the host's cgroup tree, the kernel's count of the
periods its quota applied to the job, and the CPU time the job was given against the time it ran. Control: with
``job_cpu = 0`` the cgroup has no quota.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pynox.policy import cgroups
from tests.harness import procfs
from tests.pool.pool_driver import leftover_guard, pool_process

pytestmark = pytest.mark.timeout(120)

_subreaper = pytest.fixture(scope="module", autouse=True, name="_subreaper")(leftover_guard)

# Four threads hashing for 2 s: up to 8 CPU-seconds where four cores are free.
_SPIN = """
import hashlib, threading, time
data = b"x" * (1 << 20)
def spin():
    end = time.monotonic() + 2
    while time.monotonic() < end:
        hashlib.sha256(data).digest()
threads = [threading.Thread(target=spin) for _ in range(4)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
print("spun")
"""


def _cpu_group(pid: int) -> Path:
    """The cgroup directory of the cpu controller holding ``pid``, read from its /proc entry and the mounts."""
    bounds = cgroups.available()
    if bounds.cpu is None:
        if os.environ.get("CI") and os.geteuid() == 0:
            pytest.fail(f"CI must prove the CPU quota: {bounds.cpu_reason}", pytrace=False)
        pytest.skip(bounds.cpu_reason)
    for line in procfs.read(pid, "cgroup").splitlines():
        _, controllers, path = line.rstrip("\n").split(":", 2)
        if (bounds.cpu.version == 1 and "cpu" in controllers.split(",")) or \
                (bounds.cpu.version == 2 and controllers == ""):
            for mount in procfs.read("self", "mountinfo").splitlines():
                left, _, right = mount.partition(" - ")
                kind, options = right.split()[0], right.split()[2]
                if (bounds.cpu.version == 1 and kind == "cgroup" and "cpu" in options.split(",")) or \
                        (bounds.cpu.version == 2 and kind == "cgroup2"):
                    return Path(left.split()[4], path.lstrip("/"))
    raise AssertionError(f"no cpu cgroup for {pid}")


def _quota(group: Path) -> str:
    if (group / "cpu.max").exists():
        return (group / "cpu.max").read_text().split()[0]
    return (group / "cpu.cfs_quota_us").read_text().strip()


def _stat(group: Path, field: str) -> int:
    for line in (group / "cpu.stat").read_text().splitlines():
        name, value = line.split()
        if name == field:
            return int(value)
    return 0


@pytest.mark.needs_root("an ordinary user's pool makes no cgroups")
def test_a_jobs_threads_get_one_cpu_by_default(tmp_path: Path) -> None:
    with pool_process("--workers=1", cwd=tmp_path) as pool:
        group = _cpu_group(pool.templates()[0])
        assert _quota(group) == "100000", group  # one CPU: 100 ms of every 100 ms period
        periods = _stat(group, "nr_periods")
        result = pool.run(_SPIN, timeout="30s", wait=60)
        assert result["stdout"] == "spun\n", result
        # At most one CPU's time while it ran (give or take a period, and its setup). A loaded machine may
        # give it less than one CPU, and then the kernel need not throttle it: the periods show the quota
        # was applied to it all the same.
        assert result["usage"]["cpu_ms"] <= result["duration_ms"] * 1.1 + 100, result
        assert _stat(group, "nr_periods") > periods, "the quota never applied to the job's threads"


@pytest.mark.needs_root("an ordinary user's pool makes no cgroups")
def test_the_control_job_cpu_0_sets_no_quota(tmp_path: Path) -> None:
    config = tmp_path / "pynox.toml"
    config.write_text("[pool]\njob_cpu = 0\n")
    with pool_process("--workers=1", f"--config={config}", cwd=tmp_path) as pool:
        group = _cpu_group(pool.templates()[0])
        assert _quota(group) in ("-1", "max"), group
        result = pool.run(_SPIN, timeout="30s", wait=60)
        assert result["stdout"] == "spun\n", result
        assert _stat(group, "nr_throttled") == 0
