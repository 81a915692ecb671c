"""``RayPool`` and ``RaySession``: ``pynox.Pool`` and ``pynox.Session`` across the nodes of a Ray cluster.

Each node runs one ``pynox pool``, owned by a :class:`~pynox_ray.node.NodePool` actor placed on that node
(hard node affinity, no CPU of Ray's reserved: the pool's workers are what the operator sets) and started
by the node's first job. A plain run takes a slot on the freest node (``placement.py``); a session stays on
the node of its first step. Each run is one streaming call to the node's actor: host calls come down that
stream and are answered here, in the caller's process (``host_calls.py``); its last item is the node
pool's own ``pynox.Result``, unchanged.

A node whose actor dies (killed, its node removed) is given up: each run it had in flight ends with one
result, ``PoolWorkerError`` (exit 70), as a local pool reports a worker that died under a job, and is not
retried (it may have run); later runs go to the nodes left. :meth:`RayPool.stats` says which node was
lost, why, and how many runs ended with it.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import logging
import os
import pickle
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, Literal, Unpack

import ray
import ray.exceptions
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

import pynox
from pynox import CodeTool, ConfigError, Grants, PoolError, RequestError, Result, RunGrants, SessionGrants, check_grants
from pynox.transport import (
    RUN_GRANT_NAMES,
    SESSION_GRANT_NAMES,
    STATS_FIELDS,
    HostErrors,
    HostLoop,
    lost_result,
    make_tool,
    step_functions,
)

from .host_calls import answer
from .messages import Finished, HostCall, Message, Raised, Work
from .node import NodePool
from .placement import Node, Nodes

__all__ = ["RayPool", "RaySession"]

PathLike = str | os.PathLike[str]
Units = str | int | float
HostFunction = Callable[..., Any]
_log = logging.getLogger(__name__)
# What tells the caller a node's actor is gone, with whatever it was running: it died (killed, out of
# memory, its node removed), it is unreachable, or the object it streamed went with its node.
_NODE_LOST = (ray.exceptions.RayActorError, ray.exceptions.ObjectLostError)
# pynox.Pool's own default, read from its signature rather than repeated here.
_DEFAULT_WORKERS: int = inspect.signature(pynox.Pool).parameters["workers"].default
_CLOSE_MARGIN = 30.0  # seconds past a close's own timeout before a node's actor is killed unanswered


def _check_host_errors(value: object) -> None:
    if value not in ("safe", "full"):
        raise ConfigError(f"host_errors must be 'safe' or 'full', got {value!r}")


def _names(value: object, what: str) -> list[str]:
    if isinstance(value, str | os.PathLike):
        raise TypeError(f"{what} must be a list, e.g. {what}=['pandas'], not a single string")
    if not isinstance(value, list | tuple) or not all(isinstance(item, str | os.PathLike) for item in value):
        raise ConfigError(f"{what} must be a list of names or paths, got {value!r}")
    return [os.fspath(item) for item in value]


def _check_functions(functions: object) -> None:
    if functions is not None and not (isinstance(functions, Mapping)
                                      and all(isinstance(name, str) and callable(function)
                                              for name, function in functions.items())):
        raise RequestError(f"functions must map names to callables, e.g. functions={{'search': search}}; got "
                           f"{functions!r}")


def _outcome(message: Message) -> Result:
    if isinstance(message, Finished):
        return message.result
    if isinstance(message, Raised):
        raise message.error
    raise PoolError(f"a node answered a run with {type(message).__name__}")


class RayPool:
    """``pynox.Pool``'s API over a Ray cluster: one ``pynox pool`` per node, ``workers`` workers each.

    ``nodes``: the Ray node IDs to put a pool on, or how many of the alive nodes, or None for every alive
    node. The other keywords are ``pynox.Pool``'s, applied on each node: ``config``, ``binary``,
    ``package_dirs`` and the grants of every run are that node's own paths, relative ones resolved against
    ``cwd`` there (by default the caller's working directory, the same path on every node). This process
    must be connected to Ray (``ray.init()``); if it is not, ``ray.init()`` is called as Ray's own
    libraries do.

    ``network_grants``: whether runs may ask ``allow_network=True`` or ``allow_hosts``. Off by default: on a
    Ray node the network reaches the cluster's own services (the GCS, the raylets, the dashboard), which run
    code for anyone who connects unless the operator set up Ray's authentication or a firewall; a job given
    the network could run code there, outside its sandbox. Turn it on only for such a cluster (or for hosts
    that are none of the cluster's).
    """

    def __init__(self, workers: int = _DEFAULT_WORKERS, *, nodes: int | Sequence[str] | None = None,
                 preload: Sequence[str] = (), package_dirs: Sequence[PathLike] = (),
                 config: PathLike | None = None, binary: PathLike | None = None, log: str | None = None,
                 max_sessions: int | None = None, session_idle: Units | None = None,
                 host_errors: HostErrors = "safe", cwd: PathLike | None = None,
                 network_grants: bool = False) -> None:
        if isinstance(workers, bool) or not isinstance(workers, int):
            raise ConfigError(f"workers must be an integer, got {workers!r}")
        if workers < 1:
            raise ConfigError(f"workers must be at least 1, got {workers}")
        _check_host_errors(host_errors)
        if not isinstance(network_grants, bool):
            raise ConfigError(f"network_grants must be True or False, got {network_grants!r}")
        self.workers = workers
        self.host_errors: HostErrors = host_errors
        self.network_grants = network_grants
        self.cwd = os.path.abspath(os.fspath(cwd)) if cwd is not None else os.getcwd()
        self.config_path = os.path.join(self.cwd, os.fspath(config)) if config is not None else None
        self._options: dict[str, Any] = {
            "workers": workers, "preload": _names(preload, "preload"),
            "package_dirs": _names(package_dirs, "package_dirs"), "config": self.config_path,
            "binary": os.fspath(binary) if binary is not None else None, "log": log,
            "max_sessions": max_sessions, "session_idle": session_idle, "host_errors": host_errors,
        }
        self._prefix = uuid.uuid4().hex[:8]
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._active = 0
        self._closed = False
        self._host_loop = HostLoop("pynox-ray-host-loop")
        self._ready: dict[str, Any] | None = None
        if not ray.is_initialized():
            ray.init()
        self._nodes = Nodes(self._place(self._chosen_nodes(nodes)))

    # -- placement ---------------------------------------------------------------------------------------
    @staticmethod
    def _chosen_nodes(nodes: int | Sequence[str] | None) -> list[str]:
        alive = [str(node["NodeID"]) for node in ray.nodes() if node.get("Alive")]  # type: ignore[no-untyped-call]  # Ray leaves it unannotated
        if not alive:
            raise PoolError("the Ray cluster has no alive node")
        if nodes is None:
            return alive
        if isinstance(nodes, bool) or not isinstance(nodes, int | list | tuple):
            raise ConfigError(f"nodes must be a count or a list of Ray node IDs, got {nodes!r}")
        if isinstance(nodes, int):
            if not 1 <= nodes <= len(alive):
                raise ConfigError(f"nodes must be between 1 and the {len(alive)} alive nodes, got {nodes}")
            return alive[:nodes]
        chosen = list(nodes)
        unknown = [node for node in chosen if node not in alive]
        if unknown or not chosen or len(set(chosen)) != len(chosen):
            raise ConfigError(f"nodes must name alive Ray nodes, each once; not alive or repeated: "
                              f"{', '.join(map(str, unknown)) or 'none given'} (alive: {', '.join(alive)})")
        return chosen

    def _place(self, node_ids: list[str]) -> list[Node]:
        actor_class = ray.remote(NodePool)
        placed = []
        for node_id in node_ids:
            name = f"pynox-{self._prefix}-{node_id[:12]}"
            # Hard affinity: this node's pool, or none (a soft one would put two pools on one node). No CPU
            # reserved: the actor idles; the pool's workers are the operator's to size.
            actor = actor_class.options(
                name=name, num_cpus=0, max_restarts=0,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
            ).remote(self._options, self.cwd)
            placed.append(Node(node_id=node_id, actor=actor, actor_name=name, capacity=3 * self.workers))
        return placed

    def _lost(self, node: Node, work: Work, exc: BaseException, session_name: str | None) -> Result:
        """The one result of a run whose node was lost under it; the node takes no more runs."""
        reason = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        if self._nodes.lose(node, f"{type(exc).__name__}: {reason}"):
            _log.warning("pynox-ray: gave up %s: %s", node.describe(), reason)
            try:
                ray.kill(node.actor, no_restart=True)  # unreachable is not dead: nothing may run on unobserved
            except Exception:
                pass  # already gone
        self._nodes.count_lost(node)
        message = (f"the pool on {node.describe()} was lost while this job was in flight ({node.lost}); "
                   "the job may have run, and was not retried")
        return lost_result(message, id=work.key, session=session_name, session_ended=work.session is not None)

    # -- driving one run ---------------------------------------------------------------------------------
    @contextmanager
    def _running(self) -> Iterator[None]:
        with self._lock:
            if self._closed:
                raise PoolError("this pool is closed")
            self._active += 1
        try:
            yield
        finally:
            with self._lock:
                self._active -= 1
                self._idle.notify_all()

    def _key(self) -> str:
        return f"{self._prefix}-{next(self._ids)}"

    def _stream(self, node: Node, work: Work) -> Any:
        try:
            return node.actor.job.options(num_returns="streaming").remote(work)
        except (TypeError, pickle.PicklingError) as exc:  # a grant's value Ray cannot carry to the node
            raise RequestError(f"the request cannot be sent to a node: {exc}") from None

    def _replier(self, node: Node, work: Work, call: HostCall) -> Callable[[dict[str, Any]], None]:
        def send(reply: dict[str, Any]) -> None:
            node.actor.reply.remote(work.key, call.seq, reply)  # a dead actor drops it, as a dead pool would

        return send

    def _drive(self, node: Node, work: Work, functions: Mapping[str, HostFunction] | None,
               host_errors: HostErrors, session_name: str | None = None) -> Result:
        try:
            for ref in self._stream(node, work):
                message = ray.get(ref)
                if isinstance(message, HostCall):
                    answer(message, functions, host_errors, self._host_loop.get, self._replier(node, work, message))
                    continue
                return _outcome(message)
        except _NODE_LOST as exc:
            return self._lost(node, work, exc, session_name)
        except ray.exceptions.RayError as exc:
            raise PoolError(f"{node.describe()} failed the run: {exc}") from None
        raise PoolError(f"{node.describe()} ended the run without its result")

    async def _adrive(self, node: Node, work: Work, functions: Mapping[str, HostFunction] | None,
                      host_errors: HostErrors, session_name: str | None = None) -> Result:
        loop = asyncio.get_running_loop()
        try:
            async for ref in self._stream(node, work):
                message = await ref
                if isinstance(message, HostCall):
                    answer(message, functions, host_errors, loop, self._replier(node, work, message))
                    continue
                return _outcome(message)
        except asyncio.CancelledError:
            # The caller gave up on it: so does the node's pool, which kills the job now.
            node.actor.cancel.remote(work.key)
            raise
        except _NODE_LOST as exc:
            return self._lost(node, work, exc, session_name)
        except ray.exceptions.RayError as exc:
            raise PoolError(f"{node.describe()} failed the run: {exc}") from None
        raise PoolError(f"{node.describe()} ended the run without its result")

    def _check_network(self, grants: Mapping[str, Any]) -> None:
        for name in ("allow_network", "allow_hosts"):
            if grants.get(name) and not self.network_grants:
                raise RequestError(f"{name}: this RayPool does not grant the network (RayPool(network_grants="
                                   "True) does): on a Ray node it reaches the cluster's own services, which run "
                                   "code for anyone who connects unless Ray's authentication or a firewall stops "
                                   "them")

    def _work(self, code: str | None, functions: Mapping[str, HostFunction] | None, host_errors: HostErrors | None,
              return_value: bool, grants: dict[str, Any]) -> Work:
        self._check_network(grants)
        _check_functions(functions)
        if host_errors is not None:
            _check_host_errors(host_errors)
        return Work(key=self._key(), code=code, functions=tuple(functions or ()), host_errors=host_errors,
                    return_value=return_value, grants=grants)

    # -- public API --------------------------------------------------------------------------------------
    def run(self, code: str | None = None, *, functions: Mapping[str, HostFunction] | None = None,
            host_errors: HostErrors | None = None, return_value: bool = True,
            host_globals: Literal["call", "await"] | None = None, **grants: Unpack[RunGrants]) -> Result:
        """Run code on the freest node and wait for its :class:`pynox.Result`; see :meth:`pynox.Pool.run`."""
        check_grants("RayPool.run()", grants, RUN_GRANT_NAMES)
        work = self._work(code, functions, host_errors, return_value, _with_host_globals(grants, host_globals))
        with self._running():
            node = self._nodes.acquire()
            try:
                return self._drive(node, work, functions, host_errors or self.host_errors)
            finally:
                self._nodes.release(node)

    async def arun(self, code: str | None = None, *, functions: Mapping[str, HostFunction] | None = None,
                   host_errors: HostErrors | None = None, return_value: bool = True,
                   host_globals: Literal["call", "await"] | None = None, **grants: Unpack[RunGrants]) -> Result:
        """``run`` for asyncio: no thread is held while the job runs or waits for a node."""
        check_grants("RayPool.arun()", grants, RUN_GRANT_NAMES)
        work = self._work(code, functions, host_errors, return_value, _with_host_globals(grants, host_globals))
        with self._running():
            node = await self._nodes.acquire_async()
            try:
                return await self._adrive(node, work, functions, host_errors or self.host_errors)
            finally:
                self._nodes.release(node)

    def session(self, *, functions: Mapping[str, HostFunction] | None = None,
                host_errors: HostErrors | None = None, host_globals: Literal["call", "await"] | None = None,
                **grants: Unpack[SessionGrants]) -> RaySession:
        """A stateful process on one node: variables survive between ``run`` calls; see :meth:`pynox.Pool.session`."""
        check_grants("RayPool.session()", grants, SESSION_GRANT_NAMES)
        return RaySession(self, functions, _with_host_globals(grants, host_globals), host_errors=host_errors)

    def tool(self, profile: str | None = None, *, session: bool = False,
             functions: Mapping[str, HostFunction] | None = None, host_errors: HostErrors | None = None,
             **grants: Unpack[Grants]) -> Callable[[str], str]:
        """A ``run_python(code: str) -> str`` function for a model; see :func:`pynox.tool`."""
        # A RayPool is a pynox.Runner: run, arun, session, config_path, cwd, ready, as a Pool has them.
        run_python = make_tool(self, profile=profile, session=session, functions=functions,
                               grants=grants, host_errors=host_errors)
        code_tool: CodeTool = run_python.code_tool  # type: ignore[attr-defined]  # make_tool sets it
        if code_tool.grants.network or code_tool.grants.hosts:  # asked here or by the profile: refused now, not
            self._check_network({"allow_network": code_tool.grants.network,  # at the model's first call
                                 "allow_hosts": code_tool.grants.hosts})
        return run_python

    @property
    def ready(self) -> dict[str, Any]:
        """The ready event of a node's pool, as it wrote it; ``{}`` until a job has started one."""
        if self._ready is None:
            for node in self._nodes.live():
                try:
                    found = ray.get(node.actor.ready.remote(), timeout=_CLOSE_MARGIN)
                except ray.exceptions.RayError:
                    continue
                if found is not None:
                    self._ready = found
                    break
        return dict(self._ready or {})

    def stats(self) -> dict[str, Any]:
        """The counters of every node's pool, summed (``uptime_ms``: the longest), and ``nodes``: each node's
        own (``pool``: its pool's counters, None before its first job), what the caller sent it, whether it
        was lost and why, and how many runs ended with it."""
        asked = {node.node_id: node.actor.stats.remote() for node in self._nodes.live()}
        per_node: list[dict[str, Any]] = []
        for node in self._nodes.all:
            counters = None
            if node.node_id in asked:
                try:
                    counters = ray.get(asked[node.node_id], timeout=_CLOSE_MARGIN)
                except ray.exceptions.RayError as exc:
                    counters = None
                    _log.warning("pynox-ray: no stats from %s: %s", node.describe(), exc)
            per_node.append({"node_id": node.node_id, "actor": node.actor_name, "alive": node.lost is None,
                             "lost": node.lost, "pool": counters, "runs_sent": node.sent,
                             "in_flight": node.in_flight, "sessions": node.sessions, "runs_lost": node.lost_runs})
        totals = _summed([entry["pool"] for entry in per_node if entry["pool"] is not None])
        return {**totals, "nodes": per_node, "nodes_alive": sum(entry["alive"] for entry in per_node),
                "nodes_lost": sum(not entry["alive"] for entry in per_node),
                "runs_lost": sum(entry["runs_lost"] for entry in per_node)}

    def close(self, timeout: float = 60.0) -> None:
        """Let runs in flight finish (their host functions still answered), then stop every node's pool and
        its actor. Safe to call twice."""
        with self._lock:
            if self._closed and self._active == 0 and not self._nodes.live():
                return
            self._closed = True
            self._idle.wait_for(lambda: self._active == 0, timeout=timeout)
        if ray.is_initialized():
            closing = [(node, node.actor.close.remote(timeout)) for node in self._nodes.live()]
            for node, done in closing:
                try:
                    ray.get(done, timeout=timeout + _CLOSE_MARGIN)
                except ray.exceptions.RayError:
                    pass  # lost meanwhile, or stuck: killed below either way
                try:
                    ray.kill(node.actor, no_restart=True)
                except Exception:
                    pass  # already gone
                self._nodes.lose(node, "closed")
        self._host_loop.close()

    def __enter__(self) -> RayPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"RayPool(workers={self.workers}, nodes={len(self._nodes.all)}, alive={len(self._nodes.live())})"


# A node pool's own, not added up: each is in its node's entry.
_PER_NODE = ("id", "event", "pid", "version")


def _summed(counters: list[dict[str, Any]]) -> dict[str, Any]:
    """Node pools' stats events as one: every count and gauge added, errors by type merged, histograms added
    bucket by bucket, the longest uptime, draining if any node drains."""
    totals: dict[str, Any] = {name: 0 for name in STATS_FIELDS if name not in _PER_NODE}
    totals["errors"] = {}
    totals["draining"] = False
    for name in ("duration_seconds", "queue_seconds"):
        totals[name] = {"le": [], "counts": [], "count": 0, "sum": 0.0}
    for one in counters:
        for name, value in one.items():
            if name in _PER_NODE:
                continue
            if name == "errors":
                for error, count in value.items():
                    totals["errors"][error] = totals["errors"].get(error, 0) + count
            elif name == "uptime_ms":
                totals[name] = max(totals[name], value)
            elif isinstance(value, bool):
                totals[name] = bool(totals[name]) or value
            elif isinstance(value, dict) and "le" in value:
                _add_histogram(totals[name], value)
            elif isinstance(value, int):
                totals[name] = totals.get(name, 0) + value
    return {"event": "stats", **totals}


def _add_histogram(total: dict[str, Any], one: dict[str, Any]) -> None:
    if not total["le"]:
        total["le"], total["counts"] = list(one["le"]), [0] * len(one["le"])
    if total["le"] != one["le"]:  # a node of another version counts in other buckets: it cannot be added
        return
    total["counts"] = [a + b for a, b in zip(total["counts"], one["counts"], strict=True)]
    total["count"] += one["count"]
    total["sum"] += one["sum"]


def _step(**fields: Any) -> dict[str, Any]:
    """A session step's own fields, those that were given."""
    return {key: value for key, value in fields.items() if value is not None}


class RaySession:
    """One process on one node whose ``__main__`` survives between runs; see :class:`pynox.Session`.

    The node is chosen at the first run (the one with the fewest sessions) and kept while the process
    lives. If that node is lost, the step in flight ends with ``PoolWorkerError`` and ``session_ended``, as
    a crash ends a local session, and the next run starts a fresh process on a node that is left."""

    def __init__(self, pool: RayPool, functions: Mapping[str, HostFunction] | None, grants: dict[str, Any], *,
                 host_errors: HostErrors | None = None) -> None:
        pool._check_network(grants)
        _check_functions(functions)
        if host_errors is not None:
            _check_host_errors(host_errors)
        self.pool = pool
        self.functions = dict(functions or {})
        self.host_errors = host_errors
        self.grants = grants
        self.steps = 0
        self._key = f"{pool._key()}-session"
        self._node: Node | None = None
        self._alive = False
        self._name: str | None = None  # the node pool's name for the process, from its results
        self._lock = threading.Lock()

    @property
    def alive(self) -> bool:
        """Whether a process holds this session's state (false before the first run and after an end)."""
        return self._alive

    @property
    def node_id(self) -> str | None:
        """The Ray node the session's process lives on, once it has one."""
        node = self._node
        return node.node_id if node is not None else None

    def _step_functions(self, code: object, functions: Mapping[str, HostFunction] | None
                        ) -> Mapping[str, HostFunction]:
        if code is None:  # as a local session's request is refused
            raise RequestError("exactly one of code and script is required")
        _check_functions(functions)
        return step_functions(self.functions, functions)

    def _prepare(self, code: str, step: dict[str, Any], return_value: bool) -> tuple[Node, Work]:
        with self._lock:
            if self._node is None or self._node.lost is not None:
                if self._node is not None:
                    self.pool._nodes.unpin(self._node)
                self._node = self.pool._nodes.pin()
            node = self._node
        work = Work(key=self.pool._key(), code=code, functions=tuple(self.functions), host_errors=self.host_errors,
                    return_value=return_value, grants=self.grants, session=self._key, step=step)
        return node, work

    def _after(self, result: Result) -> Result:
        with self._lock:
            self.steps += 1
            self._alive = not result.session_ended
            self._name = result.session or self._name
        return result

    @contextmanager
    def _stepping(self, code: str, functions: Mapping[str, HostFunction] | None, step: dict[str, Any],
                  return_value: bool) -> Iterator[tuple[Node, Work, Mapping[str, HostFunction]]]:
        """One step, while it runs: its node, its work, its host functions (the pool counts it active)."""
        callables = self._step_functions(code, functions)
        with self.pool._running():
            node, work = self._prepare(code, step, return_value)
            yield node, work, callables

    def run(self, code: str, *, name: str | None = None, args: Sequence[str] | None = None,
            timeout: Units | None = None, max_output: Units | None = None, return_value: bool = True,
            functions: Mapping[str, HostFunction] | None = None) -> Result:
        step = _step(name=name, args=args, timeout=timeout, max_output=max_output)
        with self._stepping(code, functions, step, return_value) as (node, work, callables):
            result = self.pool._drive(node, work, callables, self.host_errors or self.pool.host_errors, self._name)
        return self._after(result)

    async def arun(self, code: str, *, name: str | None = None, args: Sequence[str] | None = None,
                   timeout: Units | None = None, max_output: Units | None = None, return_value: bool = True,
                   functions: Mapping[str, HostFunction] | None = None) -> Result:
        step = _step(name=name, args=args, timeout=timeout, max_output=max_output)
        with self._stepping(code, functions, step, return_value) as (node, work, callables):
            try:
                result = await self.pool._adrive(node, work, callables, self.host_errors or self.pool.host_errors,
                                                 self._name)
            except asyncio.CancelledError:
                with self._lock:  # a cancelled step ends its session, as locally
                    self._alive = False
                raise
        return self._after(result)

    def close(self) -> None:
        """End the process. The session object stays usable: a later ``run`` starts a fresh one."""
        with self._lock:
            node, self._node = self._node, None
            self._alive = False
        if node is None:
            return
        self.pool._nodes.unpin(node)
        if node.lost is None:
            try:
                ray.get(node.actor.close_session.remote(self._key), timeout=_CLOSE_MARGIN)
            except ray.exceptions.RayError:
                pass  # the node is gone, and the process with it

    async def aclose(self) -> None:
        await asyncio.to_thread(self.close)

    def __enter__(self) -> RaySession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _with_host_globals(grants: Mapping[str, Any], host_globals: str | None) -> dict[str, Any]:
    """The request's fields as a node's pool takes them: ``host_globals`` travels with the grants, as
    :meth:`pynox.Pool.session` keeps it."""
    return {**grants, **({"host_globals": host_globals} if host_globals else {})}
