"""A named RayPool outlives its caller: a process makes it and dies, another attaches and runs on the same node
pools with its own host functions, and ``remove()`` ends it with nothing left behind.

The control is the default pool made by the same dying process: its node pools end with it. The creator is a
separate Python process connected to the suite's cluster (``RAY_ADDRESS``); it ends with ``os._exit``, so
nothing of its own lets go of the fleet (no close, no atexit): the fleet must outlive a caller that crashed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from typing import Any

import pytest
import ray

from pynox import ConfigError, PoolError
from pynox_ray import RayPool
from tests.harness import procfs

_NAMESPACE = "pynox_test"
_CREATOR_DEADLINE = 90.0  # seconds for the creator to connect, start two fleets, run on them and die
_GONE_DEADLINE = 30.0  # seconds for an ended node pool's process to exit

# Makes a named pool and an unnamed one, says their node pools' pids, and dies without closing either.
_CREATOR = textwrap.dedent("""
    import json, os, ray, pynox_ray
    ray.init(address=os.environ["RAY_ADDRESS"], log_to_driver=False)
    named = pynox_ray.RayPool(workers=1, nodes=1, name="outlives", namespace=%r)
    unnamed = pynox_ray.RayPool(workers=1, nodes=1)
    assert named.run("print(1)").ok and unnamed.run("print(1)").ok
    pids = {"named": [node["pool"]["pid"] for node in named.stats()["nodes"]],
            "unnamed": [node["pool"]["pid"] for node in unnamed.stats()["nodes"]]}
    print(json.dumps(pids), flush=True)
    os._exit(0)
""") % _NAMESPACE


def _alive(pid: int) -> bool:
    try:
        return procfs.stat(pid).state != "Z"
    except OSError:
        return False


def _wait_gone(pids: list[int]) -> list[int]:
    deadline = time.monotonic() + _GONE_DEADLINE
    while (left := [pid for pid in pids if _alive(pid)]) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def _actors(name: str) -> list[str]:
    return [entry["name"] for entry in ray.util.list_named_actors(all_namespaces=True)
            if entry["namespace"] == _NAMESPACE and entry["name"].startswith(f"pynox-{name}-")]


def lookup(query: str) -> str:
    """A host function of the attaching process: it says which process ran it."""
    return f"{query} from {os.getpid()}"


def test_a_named_pool_outlives_its_caller_and_is_removed_when_asked(cluster: Any) -> None:
    env = {**os.environ, "RAY_ADDRESS": cluster.address}
    creator = subprocess.run([sys.executable, "-c", _CREATOR], env=env, capture_output=True, text=True,
                             timeout=_CREATOR_DEADLINE)
    assert creator.returncode == 0, creator.stderr[-2000:]
    pids: dict[str, list[int]] = json.loads(creator.stdout.strip().splitlines()[-1])
    # The control: the default pool's node pool ended with the process that made it.
    assert not _wait_gone(pids["unnamed"]), "a pool without a name outlived its caller"
    assert all(_alive(pid) for pid in pids["named"]), "the named pool's node pool ended with its caller"
    try:
        with pytest.raises(ConfigError, match="already runs"):
            RayPool(workers=1, name="outlives", namespace=_NAMESPACE)
        first = RayPool.attach("outlives", namespace=_NAMESPACE)
        result = first.run("from pynox_host import lookup\nprint(lookup('q'))", functions={"lookup": lookup})
        assert result.stdout == f"q from {os.getpid()}\n", result.text
        assert [node["pool"]["pid"] for node in first.stats()["nodes"]] == pids["named"], "not the same pools"
        # A second caller takes it over; the first is told, not left waiting.
        second = RayPool.attach("outlives", namespace=_NAMESPACE)
        assert second.run("print(2)").stdout == "2\n"
        with pytest.raises(PoolError, match="another caller attached"):
            first.run("print(3)")
        first.close()
        assert second.run("print(4)").stdout == "4\n", "a caller that let go ended the pool"
        second.remove()
    finally:
        for name in _actors("outlives"):  # whatever failed above, the suite's cluster is left clean
            ray.kill(ray.get_actor(name, namespace=_NAMESPACE), no_restart=True)
    assert not _wait_gone(pids["named"]), "a removed pool's node pool is still running"
    deadline = time.monotonic() + _GONE_DEADLINE
    while _actors("outlives") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _actors("outlives"), "a removed pool's actors are still registered"
    with pytest.raises(PoolError, match="no RayPool named 'outlives'"):
        RayPool.attach("outlives", namespace=_NAMESPACE)


def test_names_are_checked(cluster: Any) -> None:
    with pytest.raises(ConfigError, match="name must be 1 to 64 letters"):
        RayPool(name="a-b")
    with pytest.raises(ConfigError, match="namespace must be"):
        RayPool.attach("a", namespace="")
