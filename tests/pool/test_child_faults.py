"""How many page faults a child prepared ahead takes before its job comes, counted from outside.

A child shares its template's memory copy-on-write: the first write to each page is a fault that allocates and
copies a page (~1-2 µs on this VM), and in CPython 3.11 every object a child touches is written (its reference
count), so Python run cold in a child (code the template never ran) costs about a fault per object it touches.
docs/performance.md ("The child's page faults, attributed") says where a `print(1)` child's ~490 land. A child
prepared ahead has taken most of them once it waits for its job: fork, CPython's after-fork work, the setup, the
warm-up. Each path has its bound, generous: a child confined by the native call takes ~400 on 3.11 today, one
confined by the Python steps ($PYNOX_NATIVE=0) ~605 (433 and 565 before the warm-up took the job's own first
faults: making __main__, reading a payload, arranging descriptors). Either fails if a source of ~40 faults comes
back, such as an after-fork hook. The control shows one: a template that preloads logging (which imports
threading, whose hook rebuilds its locks in every child) gives its children ~60-80 faults more. Faults are counts,
not times: the machine's load does not move them.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from tests.harness import procfs

from .pool_driver import READY_CHILD, descendants, pool_process, proc_table

pytestmark = [pytest.mark.timeout(120),
              pytest.mark.skipif(sys.version_info[:2] != (3, 11),
                                 reason="the bound is 3.11's (3.12 on writes no reference count of an immortal "
                                        "object: fewer faults)")]

# By $PYNOX_NATIVE: measured 411-413 natively (422 before this bound was set) and 480-492 with threading's hook;
# 575-579 through the Python steps, 635-654 with the hook (after the kernel-setup and template-trim merges: 640
# was inside the hook's range). Since the warm-up also reads its payload from a pipe, makes __main__ and arranges
# its descriptors as the job then does (faults taken before the job, not in it: docs/performance.md, "The
# prepared child's path after the hand-over"): 466 natively, 539 with the hook; 598-600 through the Python steps,
# 673-674 with the hook. Since the template sets up once what every job's interpreter has beside its __main__
# (display, IPython's finder, pip's stop: execute.prepare_jobs), which each child's new_main wrote, and the
# warm-up takes its package directories back out of sys.path rather than copying it whole: 451-459 natively (one
# pool differs from the next by a few), 519-525 with the hook; 585-588 through the Python steps, 653-658 with the
# hook. Since a child confined natively takes its job natively too (policy/_confine.c, take_job: its warm-up no
# longer rehearses the Python hand-over) and the warm-up runs the job's own READ step (the claim, the environment):
# 398 natively, 439-440 with the hook; 605-607 through the Python steps (the READ step's ~20 taken before the job
# now), 652 with the hook. Bounds, not targets: each about midway between the two.
BOUNDS = {"1": 419, "0": 629}
PATHS = pytest.mark.parametrize("native", ["1", "0"], ids=["native call", "Python steps"])


def _waiting_children_faults(*pool_args: str, native: str, cwd: Path) -> dict[int, int]:
    """The minor faults of each child prepared ahead, once they no longer change (its warm-up done)."""
    with pool_process("--workers=1", *pool_args, cwd=cwd, env={**os.environ, "PYNOX_NATIVE": native}) as pool:
        for _ in range(4):  # the first job's child forked for it, then children prepared ahead
            result = pool.run("print(1)")
            assert result["exit"] == 0, result
        deadline = time.monotonic() + 20
        before: dict[int, int] = {}
        while time.monotonic() < deadline:
            table = proc_table()
            now = {pid: procfs.stat(pid).minor_faults for pid in descendants(pool.pid, table)
                   if table[pid][3] == READY_CHILD}
            if now and now == before:
                return now
            before = now
            time.sleep(0.3)
    raise AssertionError(f"no prepared child settled: {before}")


@PATHS
def test_a_prepared_child_waits_for_its_job_after_a_bounded_number_of_faults(tmp_path: Path, native: str) -> None:
    faults = _waiting_children_faults(native=native, cwd=tmp_path)
    assert max(faults.values()) < BOUNDS[native], faults


@PATHS
def test_control_an_after_fork_hook_takes_a_child_past_the_bound(tmp_path: Path, native: str) -> None:
    faults = _waiting_children_faults("--preload=logging", native=native, cwd=tmp_path)
    assert min(faults.values()) > BOUNDS[native], faults
