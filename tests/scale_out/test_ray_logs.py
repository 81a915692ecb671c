"""Ray's log output stays out of the caller's stderr by default (issue 49, row 5): a RayPool that connects the
process to Ray itself does so with ``log_to_driver=False``.

Each caller is a separate Python process on the suite's cluster (``RAY_ADDRESS``) that makes a RayPool, runs a
job, then has a Ray worker print a line and waits for Ray to forward it. The control connects with
``log_to_driver=True`` itself first: the worker's line reaches its output, so the test can see it when it comes.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from typing import Any

_CALLER_DEADLINE = 90.0  # seconds for a caller to connect, start its pool, run and wait for Ray's output

_CALLER = textwrap.dedent("""
    import os, sys, time, ray, pynox_ray
    if sys.argv[1] == "control":
        ray.init(address=os.environ["RAY_ADDRESS"], log_to_driver=True)
    with pynox_ray.RayPool(workers=1, nodes=1) as pool:
        assert pool.run("print(1)").ok

    @ray.remote(num_cpus=0)
    def speak():
        print("a line from a Ray worker", flush=True)
        print("a line from a Ray worker", file=sys.stderr, flush=True)

    ray.get(speak.remote())
    time.sleep(3)  # Ray forwards workers' output to the driver a little later
""")


def _caller(cluster: Any, mode: str) -> str:
    done = subprocess.run([sys.executable, "-c", _CALLER, mode], capture_output=True, text=True,
                          timeout=_CALLER_DEADLINE, env={**os.environ, "RAY_ADDRESS": cluster.address}, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout + done.stderr


def test_a_raypool_keeps_rays_log_output_out_of_its_callers_stderr(cluster: Any) -> None:
    assert "a line from a Ray worker" in _caller(cluster, "control"), "the control saw no forwarded line"
    assert "a line from a Ray worker" not in _caller(cluster, "default")
