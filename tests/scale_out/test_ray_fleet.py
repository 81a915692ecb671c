"""A RayPool follows the cluster: nodes that join take work, a lost node's runs and sessions are answered as a
local pool answers for a worker or session process that died, and the fleet keeps one confinement contract.

Nodes are added to (and removed from) the suite's own cluster here, each with a resource of its own, so that a
pool made with ``resources=`` uses only them; the cluster is left as it was found (head plus one node).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

import pynox
from pynox import ConfigError
from pynox_ray import RayPool, RaySession

_JOIN_DEADLINE = 30.0  # seconds for a node that joined to take work: the watch (1 s) plus its pool's start
_LOSS_DEADLINE = 60.0  # seconds for Ray to declare a removed node dead and the pool to answer for it


@pytest.fixture
def added(cluster: Any) -> Iterator[list[Any]]:
    """Nodes a test adds (``added.append(cluster.add_node(...))``): removed after it, whatever happened."""
    import ray

    nodes: list[Any] = []
    yield nodes
    for node in nodes:
        if node in cluster.list_all_nodes():
            cluster.remove_node(node, allow_graceful=True)
    # Until Ray's node table says they are gone, a pool made by a later test would place pools on them.
    removed = {str(node.node_id) for node in nodes}
    deadline = time.monotonic() + _LOSS_DEADLINE
    while any(node["Alive"] and node["NodeID"] in removed for node in ray.nodes()) and time.monotonic() < deadline:
        time.sleep(0.2)


def _add(cluster: Any, added: list[Any], resource: str, **env: str) -> str:
    node = cluster.add_node(num_cpus=1, resources={resource: 1}, env_vars=env or None)
    added.append(node)
    cluster.wait_for_nodes()
    return str(node.node_id)


def _sent(pool: RayPool) -> dict[str, int]:
    """Runs sent to each node whose pool serves."""
    return {node["node_id"]: node["runs_sent"] for node in pool.stats()["nodes"] if node["serving"]}


def _spread(pool: RayPool, runs: int) -> None:
    threads = [threading.Thread(target=pool.run, args=("import time\ntime.sleep(0.2)",)) for _ in range(runs)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)


def test_a_node_that_joins_takes_work_within_the_stated_time(cluster: Any, added: list[Any]) -> None:
    first = _add(cluster, added, "joins")
    with RayPool(workers=1, resources={"joins": 1}) as pool:
        assert pool.run("print(1)").stdout == "1\n"
        assert list(_sent(pool)) == [first], "the pool used a node without the resource it was filtered by"
        joined_at = time.monotonic()
        second = _add(cluster, added, "joins")
        while second not in _sent(pool) and time.monotonic() - joined_at < _JOIN_DEADLINE:
            time.sleep(0.2)
        assert second in _sent(pool), f"the node that joined got no pool within {_JOIN_DEADLINE:.0f}s"
        took = time.monotonic() - joined_at
        _spread(pool, 4)
        sent = _sent(pool)
        assert sent[second] >= 1, f"the node that joined took none of four runs: {sent}"
        assert pool.ready["workers"] == 2 and {node["node_id"] for node in pool.ready["nodes"]} == {first, second}
    print(f"a joined node took work {took:.1f}s after it joined")


def test_a_lost_node_answers_its_runs_once_its_sessions_say_so_and_a_new_node_takes_over(
        cluster: Any, added: list[Any]) -> None:
    # The control: a local session whose process died between steps, and the line its model reads.
    with pynox.Pool(workers=1) as local, local.session() as control:
        control.run("x = 41")
        control.run("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)")
        gone = control.run("print(x)")
    assert gone.session_reopened is not None and gone.error is not None
    doomed = _add(cluster, added, "lost")
    results: list[pynox.Result] = []
    with RayPool(workers=1, resources={"lost": 1}) as pool, pool.session() as notebook:
        assert isinstance(notebook, RaySession)
        assert notebook.run("x = 41").ok and notebook.node_id == doomed
        running = threading.Thread(target=lambda: results.append(pool.run("import time\ntime.sleep(20)",
                                                                          timeout="30s")))
        running.start()
        deadline = time.monotonic() + 30
        while pool.stats()["busy_workers"] < 1 and time.monotonic() < deadline:
            time.sleep(0.1)
        cluster.remove_node(added.pop(), allow_graceful=False)
        running.join(timeout=_LOSS_DEADLINE)
        # Exactly one answer for the run in flight: the node's loss, as a local pool reports a dead worker.
        assert len(results) == 1 and results[0].error is not None, results
        assert results[0].error["type"] == "PoolWorkerError" and results[0].exit == 70
        replacement = _add(cluster, added, "lost")
        deadline = time.monotonic() + _JOIN_DEADLINE
        while replacement not in _sent(pool) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert pool.run("print('on the new node')").stdout == "on the new node\n"
        assert _sent(pool)[replacement] >= 1
        # The idle session's state went with its node: its next step says so, as a local one whose process died.
        step = notebook.run("print(x)")
        assert step.session_reopened is not None and "its node was lost" in step.session_reopened
        assert step.error is not None and step.error["type"] == "NameError"
        assert step.text.startswith("[The session's earlier process was gone ("), step.text
        assert step.text.split("(", 1)[0] == gone.text.split("(", 1)[0] and step.error["type"] == gone.error["type"]
        assert notebook.node_id == replacement and notebook.run("x = 1\nprint(x)").stdout == "1\n"
        stats = pool.stats()
        assert stats["nodes_lost"] == 1 and stats["runs_lost"] == 1


def _kernel_abi() -> int:
    with pynox.Pool(workers=1) as local:
        return int(local.ready["landlock_abi"])


def test_a_mixed_fleet_is_refused_or_capped_at_the_lowest_abi(cluster: Any, added: list[Any]) -> None:
    if _kernel_abi() <= 3:
        pytest.skip("this kernel's Landlock ABI is 3 or lower: there is no lower ABI to mix in")
    full = _add(cluster, added, "mixed")
    capped = _add(cluster, added, "mixed", PYNOX_LANDLOCK_ABI="3")
    with RayPool(workers=1, resources={"mixed": 1}) as pool, \
            pytest.raises(ConfigError, match=r"confine jobs differently .*Landlock ABI 3.*contract='lowest'"):
        pool.run("print(1)")
    with RayPool(workers=1, resources={"mixed": 1}, contract="lowest") as pool:
        _spread(pool, 4)
        abis = {pool.run("print(1)").policy["landlock_abi"] for _ in range(6)}
        assert abis == {3}
        assert pool.ready["landlock_abi"] == 3
        assert {(node["node_id"], node["landlock_abi"]) for node in pool.ready["nodes"]} == {(full, 3), (capped, 3)}
        per_node = {node["node_id"]: node for node in pool.stats()["nodes"]}
        assert set(per_node) == {full, capped} and all(node["backend"] for node in per_node.values())
        assert all(isinstance(node["bounds_not_in_force"], list) for node in per_node.values())


def test_fleet_options_are_checked(cluster: Any) -> None:
    with pytest.raises(ConfigError, match="contract must be 'refuse' or 'lowest'"):
        RayPool(contract="mixed")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="resources must map names to values"):
        RayPool(resources={"gpu": "one"})  # type: ignore[dict-item]
    with pytest.raises(ConfigError, match="watch must be a number of seconds"):
        RayPool(watch=-1)
