"""``RayPool`` and ``RaySession``: ``pynox.Pool`` and ``pynox.Session`` across the nodes of a Ray cluster.

A ``RayPool`` is a ``pynox.Pool`` over another transport, :class:`~pynox_ray.fleet.RayFleet`: validation, the
typed grants, host functions, the session rules (open, reopen, ``session_reopened``), patience, cancel and
the lifecycle are the core's, once. What is Ray's own is here and in the fleet: which nodes have a pool (a
count, the very nodes, or every node that passes a resource and label filter, following the cluster as
nodes join and leave), the fleet's one contract, the network rule, and the per-node stats.

Each node runs one ``pynox pool``, owned by a :class:`~pynox_ray.node.NodePool` actor placed on that node
(hard node affinity, no CPU of Ray's reserved: the pool's workers are what the operator sets), started when
the pool is first used. Host calls cross to the caller once each way and run in the caller's process.

A named pool (``name=``) outlives its caller: its actors are detached, and ``RayPool.attach(name)`` in another
process takes the fleet over; ``remove()`` ends it.
"""

from __future__ import annotations

import inspect
import logging
import os
import re
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Unpack

import ray

import pynox
from pynox import ConfigError, Grants, PoolError, RequestError, Session
from pynox.transport import Answer, HostErrors, Transport

from .fleet import Contract, FleetPlan, RayFleet, describe_node, fleet_actors, fleet_record, remove_fleet
from .stats import summed as _summed  # noqa: F401  # the tests of the sum read it here, where it always was

__all__ = ["RayPool", "RaySession"]

PathLike = str | os.PathLike[str]
Units = str | int | float
HostFunction = Callable[..., Any]
_log = logging.getLogger(__name__)
# pynox.Pool's own default, read from its signature rather than repeated here.
_DEFAULT_WORKERS: int = inspect.signature(pynox.Pool).parameters["workers"].default
_WATCH = 1.0  # seconds between reads of the cluster's node table: a joined node takes work within this and its start
NAMESPACE = "pynox"  # the Ray namespace of a named pool's actors, unless the caller names another
_NAME = re.compile(r"[A-Za-z0-9_.]{1,64}")  # no "-": a name is the prefix of its actors' names ("pynox-<name>-...")


def _names(value: object, what: str) -> list[str]:
    if isinstance(value, str | os.PathLike):
        raise TypeError(f"{what} must be a list, e.g. {what}=['pandas'], not a single string")
    if not isinstance(value, list | tuple) or not all(isinstance(item, str | os.PathLike) for item in value):
        raise ConfigError(f"{what} must be a list of names or paths, got {value!r}")
    return [os.fspath(item) for item in value]


def _chosen_nodes(nodes: int | Sequence[str] | None) -> int | tuple[str, ...] | None:
    alive = [str(node["NodeID"]) for node in ray.nodes() if node.get("Alive")]  # type: ignore[no-untyped-call]  # Ray leaves it unannotated
    if not alive:
        raise PoolError("the Ray cluster has no alive node")
    if nodes is None:
        return None
    if isinstance(nodes, bool) or not isinstance(nodes, int | list | tuple):
        raise ConfigError(f"nodes must be a count or a list of Ray node IDs, got {nodes!r}")
    if isinstance(nodes, int):
        if not 1 <= nodes <= len(alive):
            raise ConfigError(f"nodes must be between 1 and the {len(alive)} alive nodes, got {nodes}")
        return nodes
    chosen = list(nodes)
    unknown = [node for node in chosen if node not in alive]
    if unknown or not chosen or len(set(chosen)) != len(chosen):
        raise ConfigError(f"nodes must name alive Ray nodes, each once; not alive or repeated: "
                          f"{', '.join(map(str, unknown)) or 'none given'} (alive: {', '.join(alive)})")
    return tuple(chosen)


def _check_name(name: object, namespace: object) -> None:
    for value, what in ((name, "name"), (namespace, "namespace")):
        if not isinstance(value, str) or not _NAME.fullmatch(value):
            raise ConfigError(f"{what} must be 1 to 64 letters, digits, '_' or '.', got {value!r}")


def _filter(value: object, what: str, kind: tuple[type, ...], example: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping) or not all(isinstance(key, str) and isinstance(item, kind)
                                                 and not isinstance(item, bool) for key, item in value.items()):
        raise ConfigError(f"{what} must map names to values, e.g. {what}={example}, got {value!r}")
    return dict(value)


class RayPool(pynox.Pool):
    """``pynox.Pool``'s API over a Ray cluster: one ``pynox pool`` per node, ``workers`` workers each.

    ``nodes``: the Ray node IDs to put a pool on (those only), or how many nodes (a lost one is replaced
    by another that qualifies), or None for every node that qualifies, now and as nodes join. A node
    qualifies if it has at least ``resources`` of Ray's resources and carries ``labels``. ``contract``:
    ``"refuse"`` (the default) refuses a fleet whose nodes confine jobs differently (Landlock ABI, backend,
    bounds not in force); ``"lowest"`` caps every node at the fleet's lowest Landlock ABI. ``watch``:
    seconds between reads of the cluster's node table (0: the nodes chosen at the start only).

    The other keywords are ``pynox.Pool``'s, applied on each node: ``config``, ``binary``, ``package_dirs``
    and the grants of every run are that node's own paths, relative ones resolved against ``cwd`` there (by
    default the caller's working directory, the same path on every node). This process must be connected
    to Ray (``ray.init()``); if it is not, ``ray.init(log_to_driver=False)`` is called, so the nodes' logs stay
    in Ray's log files rather than this process's stderr.

    ``network_grants``: whether runs may ask ``allow_network=True`` or ``allow_hosts``. Off by default: on a
    Ray node the network reaches the cluster's own services (the GCS, the raylets, the dashboard), which run
    code for anyone who connects unless the operator set up Ray's authentication or a firewall; a job given
    the network could run code there, outside its sandbox. Turn it on only for such a cluster (or for hosts
    that are none of the cluster's).

    ``name``: a pool that outlives this process. Its node pools start now, their actors named and detached
    in Ray's ``namespace``; :meth:`close` lets go of them and leaves them serving, :meth:`attach` (in this
    process or another) takes them over, and :meth:`remove` ends them.
    """

    def __init__(self, workers: int = _DEFAULT_WORKERS, *, nodes: int | Sequence[str] | None = None,
                 preload: Sequence[str] = (), package_dirs: Sequence[PathLike] = (),
                 config: PathLike | None = None, binary: PathLike | None = None, log: str | None = None,
                 max_sessions: int | None = None, session_idle: Units | None = None,
                 host_errors: HostErrors = "safe", cwd: PathLike | None = None,
                 network_grants: bool = False, resources: Mapping[str, float] | None = None,
                 labels: Mapping[str, str] | None = None, contract: Contract = "refuse",
                 watch: float = _WATCH, name: str | None = None, namespace: str = NAMESPACE) -> None:
        if isinstance(workers, bool) or not isinstance(workers, int):
            raise ConfigError(f"workers must be an integer, got {workers!r}")
        if not isinstance(network_grants, bool):
            raise ConfigError(f"network_grants must be True or False, got {network_grants!r}")
        if contract not in ("refuse", "lowest"):
            raise ConfigError(f"contract must be 'refuse' or 'lowest', got {contract!r}")
        if isinstance(watch, bool) or not isinstance(watch, int | float) or watch < 0:
            raise ConfigError(f"watch must be a number of seconds (0: off), got {watch!r}")
        if name is not None:
            _check_name(name, namespace)
        cwd_on_nodes = os.path.abspath(os.fspath(cwd)) if cwd is not None else os.getcwd()
        config_path = os.path.join(cwd_on_nodes, os.fspath(config)) if config is not None else None
        options = {"workers": workers, "preload": _names(preload, "preload"),
                   "package_dirs": _names(package_dirs, "package_dirs"), "config": config_path,
                   "binary": os.fspath(binary) if binary is not None else None, "log": log,
                   "max_sessions": max_sessions, "session_idle": session_idle}
        record = {"workers": workers, "options": options, "cwd": cwd_on_nodes, "config_path": config_path,
                  "resources": _filter(resources, "resources", (int, float), "{'pynox': 1}"),
                  "labels": _filter(labels, "labels", (str,), "{'pool': 'pynox'}"), "contract": contract,
                  "watch": float(watch), "network_grants": network_grants}
        if not ray.is_initialized():
            ray.init(log_to_driver=False)
        record["nodes"] = _chosen_nodes(nodes)
        if name is not None and fleet_actors(name, namespace):
            raise ConfigError(f"a RayPool named {name!r} already runs in Ray namespace {namespace!r}: attach to it "
                              "(RayPool.attach) or remove it first")
        self._set_up(record, host_errors, name, namespace, attach=False)

    @classmethod
    def attach(cls, name: str, *, namespace: str = NAMESPACE, host_errors: HostErrors = "safe") -> RayPool:
        """The named pool ``name``, made by this process or another (which may have exited), taken over by this
        process: its runs go to the same node pools, with this process's host functions. Its options are its
        creator's. A caller that still held it is let go: its runs in flight end with ``PoolError``."""
        _check_name(name, namespace)
        if not ray.is_initialized():
            ray.init(log_to_driver=False)
        record = fleet_record(name, namespace)
        if record is None:
            raise PoolError(f"no RayPool named {name!r} runs in Ray namespace {namespace!r}")
        pool = cls.__new__(cls)
        pool._set_up(record, host_errors, name, namespace, attach=True)
        return pool

    def _set_up(self, record: dict[str, Any], host_errors: HostErrors, name: str | None, namespace: str, *,
                attach: bool) -> None:
        self.name, self.namespace = name, namespace
        self.network_grants: bool = record["network_grants"]
        self.cwd_on_nodes: str = record["cwd"]
        workers: int = record["workers"]
        self._fleet: RayFleet | None = None
        self._plan = FleetPlan(options=record["options"], cwd=self.cwd_on_nodes, workers=workers,
                               prefix=uuid.uuid4().hex[:8], nodes=record["nodes"], resources=record["resources"],
                               labels=record["labels"], contract=record["contract"], watch=record["watch"],
                               on_size=self._resize, name=name, namespace=namespace if name else None,
                               record=record if name else None, attach=attach)
        super().__init__(workers, host_errors=host_errors, transport=self._open_fleet)
        self.cwd = self.cwd_on_nodes
        self.config_path = record["config_path"]
        if name is not None:  # its pools exist when this returns: a caller may hand the name on and exit
            try:
                self._ensure_process()
            except BaseException:
                self.close(timeout=5)
                if not attach:
                    remove_fleet(name, namespace, timeout=5)
                raise

    def _open_fleet(self, on_line: Callable[[Answer], None], on_bad_line: Callable[[bytes, str], None],
                    on_exit: Callable[[Any], None]) -> Transport:
        if self._fleet is not None and self._fleet.taken:  # taking it back would take it from the other caller
            raise PoolError(self._fleet.hung or "another caller attached to this RayPool")
        self._fleet = RayFleet(self._plan, on_line, on_bad_line, on_exit)
        return self._fleet

    # -- what only a pool over a cluster checks ----------------------------------------------------------
    def _admit(self, grants: Mapping[str, Any], functions: object) -> None:
        super()._admit(grants, functions)
        if self.network_grants:
            return
        if grants.get("allow_network"):
            raise RequestError("allow_network=True is refused: on a Ray node the network reaches the cluster's "
                               "own services; make the RayPool with network_grants=True to allow it")
        if grants.get("allow_hosts"):
            raise RequestError("allow_hosts: a job on a Ray node could reach the cluster's own services among "
                               "them; make the RayPool with network_grants=True to allow it")

    def tool(self, profile: str | None = None, *, session: bool = False,
             functions: Mapping[str, HostFunction] | None = None, host_errors: HostErrors | None = None,
             **grants: Unpack[Grants]) -> Callable[[str], str]:
        """A ``run_python(code: str) -> str`` function for a model; see :func:`pynox.tool`."""
        run_python = super().tool(profile, session=session, functions=functions, host_errors=host_errors, **grants)
        code_tool = run_python.code_tool  # type: ignore[attr-defined]  # make_tool sets it
        # Asked here or by the profile: refused now, not at the model's first call.
        self._admit({"allow_network": code_tool.grants.network, "allow_hosts": code_tool.grants.hosts}, None)
        return run_python

    def remove(self, timeout: float = 60.0) -> None:
        """End a named pool: this caller lets go (its runs in flight finish), then every node's pool drains what
        it accepted and exits, and the actors end. Whoever attached to it afterwards finds nothing."""
        if self.name is None:
            raise ConfigError("remove() ends a named RayPool; this one has no name, and close() ends it")
        self.close(timeout)
        remove_fleet(self.name, self.namespace, timeout)

    @property
    def _session_type(self) -> type[Session]:
        return RaySession

    # -- the fleet as it is ------------------------------------------------------------------------------
    @property  # Pool keeps its ready event as an attribute; a fleet's changes as nodes join
    def ready(self) -> dict[str, Any]:
        """The fleet's ready event: a node pool's, with ``workers`` of every serving node and ``nodes``, each
        node's Landlock ABI, backend and bounds not in force; ``{}`` until the pool is first used."""
        fleet = self._fleet
        return fleet.fleet_ready() if fleet is not None and fleet.ready.done() and not fleet.dead else {}

    @ready.setter
    def ready(self, value: dict[str, Any]) -> None:
        pass  # Pool sets what the transport's first line said; the fleet's own view is read above

    def stats(self, timeout: float = 30.0) -> dict[str, Any]:
        """The counters of every node's pool, summed (``uptime_ms``: the longest), and ``nodes``: each node's
        own (``pool``: its pool's counters, None before it served), what was sent to it, whether it was lost
        and why, how many runs ended with it, its contract, and how long its pool took to take work."""
        totals = super().stats(timeout)
        fleet = self._fleet
        per_node: list[dict[str, Any]] = []
        for node in fleet.nodes.all if fleet is not None else []:
            took = None if node.started is None else round(node.started - node.joined, 3)
            per_node.append({**describe_node(node), "alive": node.lost is None, "pool": node.stats,
                             "runs_sent": node.sent, "in_flight": node.in_flight, "sessions": node.sessions,
                             "runs_lost": node.lost_runs, "joined_to_ready_s": took})
        totals.pop("id", None)
        return {**totals, "nodes": per_node, "nodes_alive": sum(entry["alive"] for entry in per_node),
                "nodes_lost": sum(not entry["alive"] for entry in per_node),
                "runs_lost": sum(entry["runs_lost"] for entry in per_node)}

    def __repr__(self) -> str:
        fleet = self._fleet
        known = fleet.nodes.all if fleet is not None else []
        return (f"RayPool(workers={self._plan.workers}, nodes={len(known)}, "
                f"alive={sum(node.lost is None for node in known)})")


class RaySession(Session):
    """One process on one node whose ``__main__`` survives between runs; see :class:`pynox.Session`.

    The node is chosen at the first run (the one with the fewest sessions) and kept while the process
    lives. If that node is lost, the step in flight ends with ``PoolWorkerError`` and ``session_ended``, as
    a crash ends a local session, and the next step opens a fresh process on a node that is left, with
    ``session_reopened`` saying the state was lost with the node."""

    pool: RayPool

    @property
    def node_id(self) -> str | None:
        """The Ray node the session's process lives on, while it has one."""
        fleet = self.pool._fleet
        return fleet.node_of(self._name) if fleet is not None else None
