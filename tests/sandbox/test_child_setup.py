"""The child's fail-closed setup is one ordered list, whichever way the child came to its job.

A job runs either in a child forked for it or in a child the template confined ahead, for the job
before, and handed this one by the server. Both go through the same steps (pynox/job/setup.py); these
tests prove from outside that the job cannot tell which: it finds the same descriptors, opened the same
way, and a setup failure is the same setup error with the same exit status.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.pool.pool_driver import PoolProcess, descendants, leftover_guard, pool_process, proc_table

pytestmark = pytest.mark.timeout(120)

_subreaper = pytest.fixture(scope="module", autouse=True, name="_subreaper")(leftover_guard)

_PREPARED = "pynox-ready"

# Each descriptor the job finds open: its access mode and what it is (the listing's own is left out).
_DESCRIPTORS = """
import fcntl, json, os
modes = {os.O_RDONLY: 'r', os.O_WRONLY: 'w', os.O_RDWR: 'rw'}
found = {}
for name in os.listdir('/proc/self/fd'):
    fd = int(name)
    try:
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
        target = os.readlink(f'/proc/self/fd/{fd}')
    except OSError:
        continue  # the listing's own descriptor, closed by now
    found[fd] = [modes[flags & os.O_ACCMODE], target.split(':')[0]]
print(json.dumps(found, sort_keys=True))
"""


def _prepared(pool: PoolProcess) -> bool:
    table = proc_table()
    return any(table[pid][3] == _PREPARED for pid in descendants(pool.pid, table))


def _wait_prepared(pool: PoolProcess, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while not _prepared(pool):
        assert time.monotonic() < end, "the template prepared no child ahead of the next job"
        time.sleep(0.01)


@pytest.fixture
def pool(tmp_path: Path) -> Iterator[PoolProcess]:
    with pool_process("--workers=1", cwd=tmp_path) as running:
        yield running


def _descriptors(result: dict[str, object]) -> dict[str, list[str]]:
    assert result["exit"] == 0, result
    found: dict[str, list[str]] = json.loads(str(result["stdout"]))
    return found


@pytest.mark.parametrize("functions", [[], ["echo"]], ids=["plain", "host-functions"])
def test_a_job_finds_the_same_descriptors_in_a_fresh_and_in_a_prepared_child(
        pool: PoolProcess, tmp_path: Path, functions: list[str]) -> None:
    assert not _prepared(pool)  # a template prepares a child only after a job: the first job's is its own
    fresh = _descriptors(pool.run(_DESCRIPTORS, allow_write=[str(tmp_path)], functions=functions))
    _wait_prepared(pool)
    prepared = _descriptors(pool.run(_DESCRIPTORS, allow_write=[str(tmp_path)], functions=functions))
    assert prepared == fresh
    # Standard input reads nothing and writes nowhere; the outputs, the report (and the child's copy of it, which
    # its report is written on) and the display channel are pipes. The payload, the claim, the ruleset and the
    # metadata socket are closed before the code runs; the host channel is there only where functions are declared.
    assert fresh["0"] == ["r", "/dev/null"], fresh
    assert {fresh[fd][1] for fd in ("1", "2", "3", "10", "16")} == {"pipe"}, fresh
    assert set(fresh) == {"0", "1", "2", "3", "10", "16", *(["4"] if functions else [])}, fresh


def test_a_setup_failure_in_a_prepared_child_is_the_same_setup_error(pool: PoolProcess) -> None:
    job = {"code": "print('ran')", "memory": 4096}  # below what the runtime itself uses: confining fails
    fresh = pool.run(**job)
    _wait_prepared(pool)  # prepared from the job that failed, with its confinement: it fails the same way
    prepared = pool.run(**job)
    for result in (fresh, prepared):
        assert result["exit"] == 125, result
        assert result["error"]["type"] == "SandboxSetupError", result
        assert "memory limit" in result["error"]["message"], result
        assert result["stdout"] == "", result  # the code never ran
    assert pool.stats()["setup_errors"] == 2
    # Control: the same code with room to run does run, so the failure above is the setup's.
    assert pool.run("print('ran')")["stdout"] == "ran\n"
