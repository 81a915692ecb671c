"""What the Pynox Jupyter kernel adds to a session step: a cell through ``jupyter_client``, beside the step.

* ``session``: ``Session.run("x = 1; x")`` on a pool of this process, the floor the kernel stands on;
* ``kernel``: the same cell as an ``execute_request`` to the ``pynox`` kernel through ``jupyter_client``,
  waited for until its ``execute_reply`` and its ``idle`` status (the message loop, IPython's ``run_cell``
  inside the session, and the cell's outputs decoded and published);
* ``ipykernel``: the same cell on ipykernel's own ``python3`` kernel, unconfined: what Jupyter costs anyway.

Rounds interleave the three, so all see the same machine load. Reports p50 and p99 in milliseconds.

    python bench/jupyter_kernel.py [--runs 200] [--json FILE]
"""

from __future__ import annotations

import os
import time
from typing import Any

from jupyter_client.manager import start_new_kernel
from timed_calls import main, summary  # type: ignore[import-not-found]  # run from bench/

import pynox

CELL = "x = 1\nx"


def measure(runs: int) -> dict[str, Any]:
    times: dict[str, list[float]] = {"session": [], "kernel": [], "ipykernel": []}
    kernels = {name: start_new_kernel(kernel_name=name, startup_timeout=120) for name in ("pynox", "python3")}
    try:
        with pynox.Pool(workers=1) as pool, pool.session() as session:
            for _ in range(5):  # warm the session, the kernels' sessions and IPython in both
                session.run(CELL)
                for _, client in kernels.values():
                    client.execute_interactive(CELL, timeout=120, output_hook=lambda _: None)
            for _ in range(runs):
                started = time.perf_counter()
                assert session.run(CELL).return_value == "1"
                times["session"].append(time.perf_counter() - started)
                for label, name in (("kernel", "pynox"), ("ipykernel", "python3")):
                    client = kernels[name][1]
                    started = time.perf_counter()
                    reply = client.execute_interactive(CELL, timeout=120, output_hook=lambda _: None)
                    times[label].append(time.perf_counter() - started)
                    assert reply["content"]["status"] == "ok"
    finally:
        for manager, client in kernels.values():
            client.stop_channels()
            manager.shutdown_kernel(now=True)
    return {"runs": runs, "cpus": os.cpu_count(), "load": os.getloadavg()[0],
            **{name: summary(values) for name, values in times.items()}}


if __name__ == "__main__":
    main(__doc__, measure)
