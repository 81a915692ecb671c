"""No write grant may overlap a mount of the kernel's own settings: cgroups, /proc, /sys.

A job of a root pool is uid 0 without capabilities, and uid 0 owns root's 0644 files there. An
adversarial review showed the harm on the code before this rule: with ``allow_write`` naming the memory
cgroup's mount and ``memory="64m"``, a job found its own cgroup, raised its limit to 1 GiB, moved itself to
the parent cgroup and held 200 MiB. The rule is the pool's (``grants.refuse_write_grant``), so a tool is
refused when it is made, and a run before anything runs; the control shows the same code runs, and writes,
with a write grant elsewhere.
"""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

import pytest

import pynox
from pynox import Pool, RequestError
from tests.harness import procfs
from tests.harness.fixtures import shared_pool

pytestmark = pytest.mark.timeout(120)


def _cgroup_mounts() -> list[str]:
    """The machine's cgroup mounts, read here independently of the product's own list."""
    found = []
    for line in procfs.read("self", "mountinfo").splitlines():
        mount, _, filesystem = line.partition(" - ")
        if filesystem.split()[0] in ("cgroup", "cgroup2"):
            found.append(mount.split()[4])
    return found


CGROUPS = _cgroup_mounts()
# What the attack writes: its own cgroup's limits, then a marker that says it ran.
ATTACK = """\
import os, pathlib
raised = []
for root in {mounts!r}:
    for directory, _, files in os.walk(root):
        if "cgroup.procs" in files and str(os.getpid()) in open(os.path.join(directory, "cgroup.procs")).read().split():
            for name in ("memory.memsw.limit_in_bytes", "memory.limit_in_bytes", "memory.max", "pids.max"):
                try:
                    pathlib.Path(directory, name).write_text("max" if name.endswith("max") else str(1 << 30))
                    raised.append(name)
                except OSError:
                    pass
pathlib.Path({marker!r}).write_text(",".join(raised) or "none")
"""


pool = shared_pool(workers=1)


@pytest.mark.parametrize("grant", ["/proc", "/sys", "/sys/fs/cgroup", *CGROUPS])
def test_a_write_grant_over_the_kernels_settings_is_refused_before_anything_runs(pool: Pool, grant: str,
                                                                                   tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    # /sys also holds runtime paths (the CPU topology a job reads), whose own rule may answer first.
    with pytest.raises(RequestError, match=r"where the kernel keeps its own settings|overlaps the runtime path"):
        pool.run(ATTACK.format(mounts=CGROUPS, marker=str(marker)), allow_write=[grant, str(tmp_path)],
                 memory="64m")
    assert not marker.exists()  # seen from the host: the code never ran, no limit was touched


@pytest.mark.skipif(not CGROUPS, reason="this machine mounts no cgroup filesystem")
def test_a_tool_with_such_a_grant_is_refused_when_it_is_made(pool: Pool) -> None:
    with pytest.raises(RequestError, match="where the kernel keeps its own settings"):
        pynox.CodeTool(pool, allow_write=[CGROUPS[0]])


def test_the_control_the_same_code_runs_and_writes_with_a_grant_elsewhere(pool: Pool, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    result = pool.run(ATTACK.format(mounts=CGROUPS, marker=str(marker)), allow_write=[str(tmp_path)],
                      memory="64m")
    assert result.ok, result
    # The code ran (the marker), and without a grant there Landlock shows it no cgroup file: no limit changed.
    assert marker.read_text() == "none"


# A job that finds a cgroup filesystem in its grant and moves itself to that hierarchy's root, out of the
# template's memory cgroup (with an ordinary directory there, it writes an ordinary file).
_LEAVE = """\
import os, pathlib
procs = pathlib.Path({mount!r}, "cgroup.procs")
try:
    procs.write_text(str(os.getpid()))
    print("moved")
except OSError as exc:
    print("refused", exc.errno)
"""


@pytest.mark.needs_root("mounting a cgroup filesystem")
def test_a_kernel_filesystem_mounted_in_a_write_grant_after_acceptance_is_refused_at_the_start(
        pool: Pool, tmp_path: Path) -> None:
    """The request is accepted while its grant is an ordinary directory, and waits for the one worker; a
    memory cgroup filesystem is then mounted beneath the grant. The job must not start with it: at its
    start the grant is checked as it is then. Control: the same job, the mount gone, runs."""
    mount = tmp_path / "grant" / "cgroup"
    mount.mkdir(parents=True)
    results: dict[str, object] = {}

    def run(name: str, code: str, **grants: object) -> None:
        try:
            results[name] = pool.run(code, **grants)  # type: ignore[arg-type]
        except RequestError as exc:
            results[name] = exc

    busy = threading.Thread(target=run, args=("busy", "import time; time.sleep(1.5)"))
    busy.start()
    time.sleep(0.3)
    leave = threading.Thread(target=run, args=("leave", _LEAVE.format(mount=str(mount))),
                             kwargs={"allow_write": [str(tmp_path / "grant")], "memory": "64m"})
    leave.start()
    time.sleep(0.3)  # accepted, and waiting for the worker
    mounted = subprocess.run(["mount", "-t", "cgroup", "-o", "memory", "pynox-test", str(mount)],
                             capture_output=True, text=True)
    try:
        if mounted.returncode != 0:
            pytest.skip(f"cannot mount a memory cgroup filesystem here: {mounted.stderr.strip()}")
        leave.join(30)
        busy.join(30)
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)
    outcome = results["leave"]
    assert isinstance(outcome, RequestError), outcome
    assert "cgroup" in str(outcome), outcome
    assert not (mount / "cgroup.procs").exists()  # nothing ran
    # Control: the mount gone, the same job with the same grant runs, and writes an ordinary file there.
    again = pool.run(_LEAVE.format(mount=str(mount)), allow_write=[str(tmp_path / "grant")], memory="64m")
    assert again.ok and again.stdout == "moved\n", again
    assert (mount / "cgroup.procs").is_file()
