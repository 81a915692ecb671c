"""Limits a pool inherits from whoever started it never reach its jobs as powers.

A login session's limits.conf may grant a user ``RLIMIT_RTPRIO`` and ``RLIMIT_NICE`` (audio groups do), and a
pool started there passes them to every process it starts. A job must still never take a real-time
scheduling class (a ``SCHED_FIFO`` loop starves the machine's other work) nor raise its own priority.
"""

from __future__ import annotations

import contextlib
import os
import resource
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness import procfs

from .pool_driver import pool_process

pytestmark = pytest.mark.timeout(60)

_GENEROUS = {resource.RLIMIT_RTPRIO: (99, 99), resource.RLIMIT_NICE: (40, 40)}
_TRY = """
import os
outcome = []
try:
    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
    outcome.append("realtime")
except PermissionError:
    outcome.append("no realtime")
try:
    os.setpriority(os.PRIO_PROCESS, 0, -10)
    outcome.append("raised")
except PermissionError:
    outcome.append("not raised")
print(", ".join(outcome), os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, 0))
"""


@contextlib.contextmanager
def _generous_limits() -> Iterator[None]:
    """This process's limits raised while a pool starts, as a login session's limits.conf would raise them."""
    before = {which: resource.getrlimit(which) for which in _GENEROUS}
    try:
        for which, value in _GENEROUS.items():
            resource.setrlimit(which, value)
        yield
    finally:
        for which, value in before.items():
            resource.setrlimit(which, value)


def _limits_of(pid: int) -> str:
    return procfs.read(pid, "limits")


@pytest.mark.needs_root("raising the hard limits a pool inherits, and the control's switch to another uid")
def test_a_job_never_gets_the_real_time_and_priority_limits_the_pool_inherited(tmp_path: Path) -> None:
    try:
        with _generous_limits():
            pass
    except ValueError:  # raising a hard limit needs CAP_SYS_RESOURCE, which some machines' root lacks
        pytest.skip("this process cannot raise hard limits (no CAP_SYS_RESOURCE), so no pool can inherit them")
    with contextlib.ExitStack() as stack:
        with _generous_limits():
            pool = stack.enter_context(pool_process(cwd=tmp_path))
        # The precondition, from the host: the pool holds the generous limits.
        limits = _limits_of(pool.pid)
        assert any(line.startswith("Max realtime priority") and line.split()[3] == "99"
                   for line in limits.splitlines()), limits
        result = pool.run(_TRY)
        assert result["exit"] == 0, result
        assert result["stdout"] == "no realtime, not raised 0 0\n", result
    # The control: a process without capabilities, under another uid, with the same limits takes the
    # real-time class and raises its priority, so the refusals above come from the job's own limits.
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("the control needs setpriv (util-linux) to drop capabilities")
    with _generous_limits():
        done = subprocess.run([setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all",
                               sys.executable, "-c", _TRY], capture_output=True, text=True, timeout=30,
                              check=False, cwd="/", env={"PATH": os.defpath})
    assert done.stdout == f"realtime, raised {os.SCHED_FIFO} -10\n", done.stderr
