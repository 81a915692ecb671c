"""Pynox on a Ray cluster: :class:`RayPool` has ``pynox.Pool``'s API, with one ``pynox pool`` per node.

    import ray, pynox_ray

    ray.init()
    with pynox_ray.RayPool(workers=2) as pool:
        pool.run("print(6 * 7)").stdout          # '42\\n', from whichever node was freest

``RayPool`` is ``pynox.Pool`` over a transport of its own (``fleet.py``): runs spread over the nodes within
each node pool's queue, a session stays on one node, nodes that join take work, and host functions run in
this process, whichever node the job is on. Results are the node pool's own ``pynox.Result``. Nothing
starts at import; the nodes' pools start when the pool is first used.
"""

from __future__ import annotations

from .pool import RayPool, RaySession

__all__ = ["RayPool", "RaySession"]
