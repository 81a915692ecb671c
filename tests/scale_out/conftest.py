"""A real multi-node Ray cluster on this machine for the RayPool suite, started and ended here.

``ray.cluster_utils.Cluster`` runs a head and a second node, each a raylet of its own with one CPU. Every
process the cluster starts (GCS, raylets, workers, and the ``pynox pool`` each node actor starts) inherits
this process's environment, so a marker variable set before the start finds them all in ``/proc``: after
the suite, none may be left (templates and jobs are children of those pools and end with them).
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Iterator

import pytest

from tests.harness import procfs
from tests.pool.pool_driver import descendants, reap_adopted_zombies

MARK = "PYNOX_RAY_TEST_RUN"
_LEFTOVER_DEADLINE = 30.0  # seconds for a killed node's pool to drain its accepted jobs and exit


def marked_processes(mark: str) -> dict[int, str]:
    """Processes whose environment carries ``MARK=mark``, with their command lines."""
    found = {}
    needle = f"{MARK}={mark}".encode()
    for pid in procfs.pids():
        if pid == os.getpid():
            continue
        try:
            environ = procfs.read_bytes(pid, "environ")
            cmdline = procfs.read_bytes(pid, "cmdline").replace(b"\0", b" ").decode(errors="replace")
            state = procfs.stat(pid).state
        except OSError:
            continue  # gone meanwhile
        if state != "Z" and needle in environ.split(b"\0"):
            found[pid] = cmdline[:200]
    return found


@pytest.fixture(scope="package")
def cluster() -> Iterator[object]:
    mark = uuid.uuid4().hex
    os.environ[MARK] = mark
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"  # no report leaves this machine
    import ray
    from ray.cluster_utils import Cluster

    # The test process is the subreaper of all it starts: Ray's daemons (GCS, raylets, their agents) are
    # re-parented to it, and must be gone before the next suite counts its own processes.
    before = set(descendants(os.getpid()))
    # Ray reports what workers record to each node's metrics agent every second (10 s by default), so
    # test_ray_metrics waits little; no dashboard, which no test reads.
    started = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "include_dashboard": False, "_system_config": {"metrics_report_interval_ms": 1000}})
    try:
        started.add_node(num_cpus=1)
        ray.init(address=started.address, log_to_driver=False)
        started.wait_for_nodes()
        yield started
    finally:
        ray.shutdown()
        started.shutdown()
        del os.environ[MARK]
    deadline = time.monotonic() + _LEFTOVER_DEADLINE
    while ((left := marked_processes(mark)) or _started_since(before)) and time.monotonic() < deadline:
        reap_adopted_zombies()
        time.sleep(0.2)
    stragglers = _started_since(before)
    for pid in stragglers:  # not to disturb the suites after this one, whatever the assertion below says
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    time.sleep(0.2)
    reap_adopted_zombies()
    assert not left and not stragglers, f"processes of the test cluster outlived it: {left or stragglers}"


def _started_since(before: set[int]) -> list[int]:
    return sorted(set(descendants(os.getpid())) - before)


@pytest.fixture(scope="package")
def node_ids(cluster: object) -> list[str]:
    """The head's ID first, then the added node's."""
    import ray

    nodes = [node for node in ray.nodes() if node["Alive"]]
    head = [node["NodeID"] for node in nodes if "node:__internal_head__" in node["Resources"]]
    return head + [node["NodeID"] for node in nodes if node["NodeID"] not in head]
