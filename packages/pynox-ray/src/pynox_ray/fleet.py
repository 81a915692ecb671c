"""``RayFleet``: the transport under a ``RayPool``, one ``pynox pool`` per node of a Ray cluster.

``pynox.Pool`` writes the protocol's lines and reads its answers; the fleet routes each line to a node's pool
(``placement.py``) through that node's actor (``node.py``) and hands each answer back as the pool wrote it,
with three changes only a fleet needs: a host call's ``call_id`` is made unique across the nodes (and its
reply goes back to the node that asked), a stats request is asked of every node and answered with their
sum, and the runs of a node that is lost are answered here.

Membership follows the cluster. Every ``watch`` seconds the fleet reads Ray's node table: a node that
joined (and passes the node filter) gets a pool, which takes work once it is ready; a node that left, or
whose actor died, is lost. Each run it had in flight ends with one result, ``PoolWorkerError`` (exit 70),
as a local pool reports a worker that died under a job; it is not retried (it may have run). A session
that lived there is gone: its next step is refused here as a pool refuses a step for a session it no
longer holds, so ``pynox.Session`` opens it again on another node and says so (``session_reopened``), as
for a local session whose process died. A node whose pool died while the node lives is not given another
(it may be sick); a node that joins under a new ID is.

One fleet, one contract: every node's pool reports its Landlock ABI, backend and the bounds not in force
(its ready event). ``contract="refuse"`` refuses to start a fleet whose nodes differ, and takes no work on
a node that joins with another contract; ``contract="lowest"`` starts every node's pool at the lowest ABI
of the fleet (the operator's cap, ``PYNOX_LANDLOCK_ABI``), and a node that joins at that cap.

A named fleet outlives its caller: its actors are named and detached, in a namespace of Ray's, and each keeps
the fleet's plan. A caller that attaches (``attach=True``) finds them by name, takes each node's pipe over
(:meth:`NodePool.attach`) and goes on as the creator would have: it follows the cluster, and its host functions
answer its runs. Closing lets go of the pipes and leaves the pools serving; :func:`remove_fleet` ends them.
"""

from __future__ import annotations

import collections
import concurrent.futures
import itertools
import logging
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import msgspec
import ray
import ray.exceptions
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from pynox import PoolError
from pynox.transport import (
    Answer,
    CallEvent,
    Closed,
    ErrorInfo,
    ReadyEvent,
    Reply,
    Request,
    SessionResult,
    StartErrorEvent,
    StatsEvent,
    decode_answer,
    encode,
    first_line_decoder,
    lost_wire,
)

from .node import LET_GO, NodePool, PoolOptions
from .placement import Node, Nodes
from .stats import summed

__all__ = ["Contract", "FleetPlan", "RayFleet", "describe_node"]

Contract = Literal["refuse", "lowest"]
_Id = str | int | float  # a request id, as the protocol allows it
_log = logging.getLogger(__name__)
_START_TIMEOUT = 300.0  # preloading large libraries on a cold node
_CLOSE_MARGIN = 30.0  # seconds past a close's own timeout before a node's actor is killed unanswered
_ACTOR_PREFIX = "pynox-"
_CONNECT_TIMEOUT = 30.0  # seconds to open the connection to a node's actor


@dataclass(frozen=True)
class FleetPlan:
    """What a RayPool asked for: its nodes' pool options, and which nodes may have one."""

    options: PoolOptions
    cwd: str
    workers: int
    prefix: str
    nodes: int | tuple[str, ...] | None  # a count, the very nodes, or every node (following the cluster)
    resources: Mapping[str, float]  # a node qualifies if it has at least these of Ray's resources
    labels: Mapping[str, str]  # ... and these labels
    contract: Contract
    watch: float  # seconds between reads of the cluster's node table
    on_size: Callable[[int], None]  # told the fleet's workers when nodes join or leave
    name: str | None = None  # a named fleet's actors are detached, named "pynox-<name>-..." in ``namespace``
    namespace: str | None = None
    record: dict[str, Any] | None = None  # a named fleet's plan, kept by each of its actors
    attach: bool = False  # take over the named fleet's actors rather than place new ones


def fleet_actors(name: str, namespace: str) -> list[str]:
    """The names of the live actors of the fleet ``name`` in ``namespace``."""
    prefix = f"{_ACTOR_PREFIX}{name}-"
    return sorted(entry["name"] for entry in ray.util.list_named_actors(all_namespaces=True)
                  if entry["namespace"] == namespace and entry["name"].startswith(prefix))


def fleet_record(name: str, namespace: str) -> dict[str, Any] | None:
    """The plan a named fleet's creator made, as its first live actor keeps it; None when none is left."""
    for actor_name in fleet_actors(name, namespace):
        try:
            record: Any = ray.get(ray.get_actor(actor_name, namespace=namespace).record.remote(),
                                             timeout=_START_TIMEOUT)
        except (ray.exceptions.RayError, ValueError):
            continue  # died meanwhile: ask the next
        return dict(record)
    return None


def remove_fleet(name: str, namespace: str, timeout: float) -> None:
    """End every node pool of the named fleet (each drains what it accepted) and its actor."""
    actors = []
    for actor_name in fleet_actors(name, namespace):
        try:
            actors.append(ray.get_actor(actor_name, namespace=namespace))
        except ValueError:
            continue  # gone meanwhile
    end_actors(actors, timeout)


def end_actors(actors: list[Any], timeout: float) -> None:
    """Stop each actor's pool (it drains what it accepted), all at once, then the actor."""
    closing: list[tuple[Any, Any]] = [(actor, actor.close.remote(timeout)) for actor in actors]
    for actor, done in closing:
        try:
            ray.get(done, timeout=timeout + _CLOSE_MARGIN)
        except ray.exceptions.RayError:
            pass  # lost meanwhile, or stuck: killed below either way
        try:
            ray.kill(actor, no_restart=True)
        except Exception:
            pass  # already gone


def alive_nodes(plan: FleetPlan) -> list[dict[str, Any]]:
    """Ray's alive nodes that pass the plan's node filter, in Ray's order."""
    alive = [node for node in ray.nodes() if node.get("Alive")]  # type: ignore[no-untyped-call]  # Ray leaves it unannotated
    return [node for node in alive
            if all(float(node.get("Resources", {}).get(name, 0)) >= amount for name, amount in plan.resources.items())
            and all(node.get("Labels", {}).get(name) == value for name, value in plan.labels.items())]


class _StatsAsk:
    """A stats request asked of every serving node: answered when each has answered or is lost."""

    def __init__(self, request_id: _Id | None, nodes: list[Node]) -> None:
        self.request_id = request_id
        self.waiting = {id(node): node for node in nodes}
        self.got: list[dict[str, Any]] = []


class RayFleet:
    """A :class:`pynox.transport.Transport` over the nodes of a Ray cluster."""

    def __init__(self, plan: FleetPlan, on_line: Callable[[Answer], None], on_bad_line: Callable[[bytes, str], None],
                 on_exit: Callable[[Any], None]) -> None:
        self.plan = plan
        self.ready: concurrent.futures.Future[bytes] = concurrent.futures.Future()
        self.dead = False
        self.taken = False  # another caller attached to this named fleet: this caller's hold is over for good
        self.hung: str | None = None
        self.last_heard = time.monotonic()
        self._on_line = on_line
        self._on_bad_line = on_bad_line
        self._on_exit = on_exit
        self._lock = threading.RLock()
        self.nodes = Nodes()
        self._owner: dict[_Id, tuple[Node, Request]] = {}  # a request sent to a node, until answered
        self._pins: dict[str, Node] = {}  # a session's node, while its process lives there
        self._gone: dict[str, str] = {}  # a session whose node was lost: why its process is gone
        self._reopening: dict[_Id, str] = {}  # the request that reopens one: the reason it will say
        self._calls: dict[int, tuple[Node, int]] = {}  # a host call, by the id the client sees
        self._call_ids = itertools.count(1)
        self._waiting: collections.deque[tuple[Request, bytes]] = collections.deque()
        self._asks: dict[str, _StatsAsk] = {}
        self._abi_cap: int | None = None
        self._contract: tuple[int, str, tuple[str, ...]] | None = None
        self._placed = itertools.count(1)
        self._stop = threading.Event()
        threading.Thread(target=self._start, name="pynox-ray-fleet", daemon=True).start()

    # -- membership ------------------------------------------------------------------------------------
    def _chosen(self) -> list[str]:
        plan = self.plan
        alive = [str(node["NodeID"]) for node in alive_nodes(plan)]
        if isinstance(plan.nodes, tuple):
            return [node for node in plan.nodes if node in alive]
        return alive if plan.nodes is None else alive[:plan.nodes]

    def _place(self, node_id: str) -> Node:
        plan = self.plan
        # A named fleet's callers each place with a prefix of their own, so two never pick the same name.
        name = (f"{_ACTOR_PREFIX}{plan.name}-{node_id[:12]}-{plan.prefix}{next(self._placed)}" if plan.name
                else f"{_ACTOR_PREFIX}{plan.prefix}-{node_id[:12]}-{next(self._placed)}")
        # A named fleet's actors outlive this process (detached), in its namespace; others end with it.
        lifetime: dict[str, Any] = {"lifetime": "detached", "namespace": plan.namespace} if plan.name else {}
        # Hard affinity: this node's pool, or none (a soft one would put two pools on one node). No CPU
        # reserved: the actor idles; the pool's workers are the operator's to size.
        actor = ray.remote(NodePool).options(
            name=name, num_cpus=0, max_restarts=0, **lifetime,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
        ).remote(plan.options, plan.cwd, plan.record)
        return self._add_node(node_id, actor, name)

    def _add_node(self, node_id: str, actor: Any, name: str) -> Node:
        node = Node(node_id=node_id, actor=actor, actor_name=name, capacity=3 * self.plan.workers,
                    joined=time.monotonic())
        with self._lock:
            self.nodes.all.append(node)
        return node

    def _link(self, node: Node, attached: tuple[Any, ...] | None = None) -> bool:
        """Take ``node``'s pipe (its actor's ``attach``, unless ``attached`` is what it returned) and open its
        connection; False, the node lost, if either fails."""
        try:
            if attached is None:
                attached = tuple(ray.get(node.actor.attach.remote(), timeout=_START_TIMEOUT))
            node.epoch, address, token = attached[0], attached[4], attached[5]
            node.pipe = socket.create_connection(tuple(address), timeout=_CONNECT_TIMEOUT)
            node.pipe.settimeout(None)
            node.pipe.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # a line is a message: send it now
            node.pipe.sendall(bytes(token) + b"\n")
        except (ray.exceptions.RayError, PoolError, OSError) as exc:
            self._lose(node, exc)  # and closes the connection, if it was opened
            return False
        threading.Thread(target=self._watch_actor, args=(node, node.epoch), name="pynox-ray-actor",
                         daemon=True).start()
        return True

    def _watch_actor(self, node: Node, epoch: int) -> None:
        """The node is lost when its actor dies, even if its connection cannot tell (a node cut off sends no
        end of file): one call per node, which the actor answers only when its pool ends or is taken over."""
        try:
            ray.get(node.actor.until_ended.remote(epoch))
        except ray.exceptions.RayError as exc:
            if not self._stop.is_set():
                self._lose(node, exc)

    def _take_over(self) -> tuple[list[Node], dict[int, bytes]]:
        """A named fleet's live node pools, each pipe taken over from the caller before: the nodes and their
        pools' ready events. An actor whose node is gone is passed over (the watch places a new pool there)."""
        plan = self.plan
        assert plan.name is not None and plan.namespace is not None
        placed: list[Node] = []
        firsts: dict[int, bytes] = {}
        for actor_name in fleet_actors(plan.name, plan.namespace):
            try:
                actor = ray.get_actor(actor_name, namespace=plan.namespace)
                node_id = str(ray.get(actor.node_id.remote(), timeout=_START_TIMEOUT))
                attached = tuple(ray.get(actor.attach.remote(), timeout=_START_TIMEOUT))
            except (ray.exceptions.RayError, ValueError, PoolError) as exc:
                _log.warning("pynox-ray: passed over %s of the fleet %r: %s", actor_name, plan.name, exc)
                continue
            node = self._add_node(node_id, actor, actor_name)
            if not self._link(node, attached):
                continue
            cap = attached[2]
            self._abi_cap = cap if cap is not None else self._abi_cap
            placed.append(node)
            firsts[id(node)] = bytes(attached[1])
        return placed, firsts

    def _boot(self, node: Node, cap: int | None) -> bytes | None:
        """Start ``node``'s pool; its first line, or None if the node was lost meanwhile."""
        try:
            return bytes(ray.get(node.actor.start.remote(cap), timeout=_START_TIMEOUT))
        except (ray.exceptions.RayError, PoolError) as exc:
            self._lose(node, exc)
            return None

    def _start(self) -> None:
        """The fleet's first pools, all ready, their contract checked: then the fleet's ready event."""
        try:
            if self.plan.attach:
                placed, firsts = self._take_over()
            else:
                chosen = self._chosen()
                if not chosen:
                    self._start_error("PoolError", "the Ray cluster has no alive node this pool may use")
                    return
                placed = [self._place(node_id) for node_id in chosen]
                firsts = {id(node): line for node in placed if (line := self._boot(node, None)) is not None}
            ready: dict[int, ReadyEvent] = {}
            for node in placed:
                line = firsts.get(id(node))
                if line is None:
                    continue
                event = first_line_decoder.decode(line)
                if isinstance(event, StartErrorEvent):  # as a local pool fails to start: the same error
                    self._fail_start(line)
                    return
                ready[id(node)] = event
            if not ready:
                self._start_error("PoolError", self.nodes.none_left())
                return
            if not self._agree(placed, firsts, ready):
                return
        except Exception as exc:  # Ray itself failed: the caller hears it as a pool that could not start
            self._start_error("PoolError", f"the fleet could not start: {type(exc).__name__}: {exc}")
            return
        self.ready.set_result(encode_ready(self.fleet_ready()))
        self._announce()
        if self.plan.watch > 0 and not isinstance(self.plan.nodes, tuple):
            threading.Thread(target=self._follow, name="pynox-ray-members", daemon=True).start()

    def _agree(self, placed: list[Node], firsts: dict[int, bytes], ready: dict[int, ReadyEvent]) -> bool:
        """Hold the fleet to one contract (see the module doc): True when its nodes serve under it."""
        contracts = {key: _contract_of(event) for key, event in ready.items()}
        if len(set(contracts.values())) > 1 and self.plan.contract == "lowest":
            cap = min(contract[0] for contract in contracts.values())
            self._abi_cap = cap
            for node in placed:
                if id(node) in ready and ready[id(node)].landlock_abi != cap:
                    self._stop_pool(node, restart=True)
                    line = self._boot(node, cap)
                    if line is None:
                        ready.pop(id(node))
                        continue
                    firsts[id(node)] = line
                    event = first_line_decoder.decode(line)
                    if isinstance(event, StartErrorEvent):
                        self._fail_start(line)
                        return False
                    ready[id(node)] = event
                    contracts[id(node)] = _contract_of(event)
        if len(set(contracts.values())) > 1:
            described = "; ".join(f"{node.describe()}: {_say(contracts[id(node)])}" for node in placed
                                  if id(node) in contracts)
            self._start_error("ConfigError", "the nodes of this RayPool confine jobs differently (" + described
                              + "); make them alike, or pass contract='lowest' to cap every node at the lowest "
                              "Landlock ABI")
            return False
        self._contract = next(iter(contracts.values()))
        linked = [node for node in placed if id(node) in ready and (node.pipe is not None or self._link(node))]
        with self._lock:
            for node in linked:
                self._serve_node(node, firsts[id(node)])
        return True

    def _serve_node(self, node: Node, line: bytes) -> None:
        """``node``'s pool is ready and under the fleet's contract: it takes work. Under the lock."""
        node.ready = msgspec.json.decode(line)
        node.started = time.monotonic()
        threading.Thread(target=self._read, args=(node,), name="pynox-ray-node", daemon=True).start()
        self._serve()

    def _follow(self) -> None:
        """Every ``watch`` seconds: a node that joined gets a pool; one that left is lost."""
        while not self._stop.wait(self.plan.watch):
            try:
                alive = {str(node["NodeID"]) for node in alive_nodes(self.plan)}
            except Exception as exc:  # the GCS is briefly unreachable: read it again next time
                _log.debug("pynox-ray: cannot read the node table: %s", exc)
                continue
            with self._lock:
                known = {node.node_id for node in self.nodes.all}
                gone = [node for node in self.nodes.all if node.lost is None and node.node_id not in alive]
            for node in gone:
                self._lose(node, PoolError("its node left the cluster"))
            for node_id in sorted(alive - known):
                if isinstance(self.plan.nodes, int) and len(self.nodes.serving()) >= self.plan.nodes:
                    break  # a count of nodes: a lost one is replaced, no more
                if self._stop.is_set():
                    return
                self._join(self._place(node_id))

    def _join(self, node: Node) -> None:
        line = self._boot(node, self._abi_cap)
        if line is None:
            return
        event = first_line_decoder.decode(line)
        refused = (f"its pool could not start: {event.error.message}" if isinstance(event, StartErrorEvent)
                   else None if _contract_of(event) == self._contract
                   else f"it confines jobs otherwise ({_say(_contract_of(event))}) than the fleet "
                        f"({_say(self._contract)})")
        if refused is None and not self._link(node):
            return
        with self._lock:
            if refused is not None:
                node.refused = refused
                node.ready = msgspec.json.decode(line)
            else:
                self._serve_node(node, line)
        if refused is not None:
            _log.warning("pynox-ray: %s takes no work: %s", node.describe(), refused)
            self._stop_pool(node)
        self._announce()

    def _announce(self) -> None:
        self.plan.on_size(sum(int((node.ready or {}).get("workers", 0)) for node in self.nodes.serving()))

    # -- lines down ------------------------------------------------------------------------------------
    def write(self, message: Request | Reply) -> None:
        if isinstance(message, Reply):
            with self._lock:
                found = self._calls.pop(message.reply.call_id, None)
            if found is not None:  # a call of a lost node has nobody to answer
                node, call_id = found
                self._send(node, encode(msgspec.structs.replace(
                    message, reply=msgspec.structs.replace(message.reply, call_id=call_id))))
            return
        self._route(message, encode(message))

    def write_line(self, line: bytes) -> None:
        self._route(msgspec.json.decode(line, type=Request), line)

    def _send(self, node: Node, line: bytes) -> None:
        pipe = node.pipe
        if pipe is None:
            return
        try:
            with node.writing:  # a line whole, never interleaved with another thread's
                pipe.sendall(line)
        except OSError:
            pass  # the connection is gone: its reader answers for the node's runs

    def _route(self, message: Request, line: bytes) -> None:
        if not self.ready.done():
            # A caller that did not open the fleet (another thread's first run did) waits for its start, as
            # it would wait on a starting pool's pipe; Pool raises the start's error in the thread that opened it.
            try:
                self.ready.result(timeout=_START_TIMEOUT)
            except concurrent.futures.TimeoutError:
                raise PoolError(f"the fleet did not start within {_START_TIMEOUT:.0f}s") from None
        if self.dead:
            raise PoolError(f"the fleet is gone: {self.describe_exit()}")
        if message.stats:
            self._ask_stats(message)
            return
        with self._lock:
            if message.cancel is not None:
                owner = self._owner.get(message.cancel)
                if owner is not None:
                    self._send(owner[0], line)
                    return
                queued = next((entry for entry in self._waiting if entry[0].id == message.cancel), None)
                if queued is not None:  # not yet on a node: it never runs
                    self._waiting.remove(queued)
                    self._answer(_refusal(queued[0], "cancelled while it waited for a node; nothing ran"))
                return
            if not self.nodes.serving() and not self._starting():
                raise PoolError(self.nodes.none_left())
            if message.session is not None:
                node = self._session_node(message)
                if node is None:
                    return  # answered here
            else:
                self._waiting.append((message, line))
                self._serve()
                return
            self._owner[_key(message)] = (node, message)
        self._send(node, line)

    def _session_node(self, message: Request) -> Node | None:
        """The node a session's line goes to, or None when the fleet answered it itself. Under the lock."""
        assert message.session is not None
        name = message.session
        node = self._pins.get(name)
        if node is not None and node.lost is None:
            return node
        gone = self._gone.get(name)
        if message.close:
            self._gone.pop(name, None)
            self._answer(Closed(id=_key(message), session=name))
            return None
        if message.open is False or (message.open is None and gone is not None):
            # As a pool answers a step for a session it does not hold: refused, so the client opens it again.
            text = f"session {name!r} is not open here: {gone or 'its node was lost'}"
            self._answer(_refusal(message, text, session_ended=True))
            return None
        node = self.nodes.pin()
        if node is None:
            self._answer(_refusal(message, self.nodes.none_left()))
            return None
        self._pins[name] = node
        if gone is not None:
            self._reopening[_key(message)] = gone
            del self._gone[name]
        return node

    def _serve(self) -> None:
        """Send waiting runs to free slots, first come first served. Under the lock."""
        while self._waiting:
            node = self.nodes.free()
            if node is None:
                if not self.nodes.serving() and not self._starting():
                    message, _ = self._waiting.popleft()
                    self._answer(_refusal(message, self.nodes.none_left(), worker_error=True))
                    continue
                return
            message, line = self._waiting.popleft()
            self._owner[_key(message)] = (node, message)
            self._send(node, line)

    def _starting(self) -> bool:
        return any(node.lost is None and node.refused is None and node.ready is None for node in self.nodes.all)

    def _ask_stats(self, message: Request) -> None:
        with self._lock:
            nodes = self.nodes.serving()
            ask = _StatsAsk(message.id, nodes)
            key = str(_key(message))
            self._asks[key] = ask
        for index, node in enumerate(nodes):
            self._send(node, encode(Request(id=f"{key}~{index}", stats=True)))
        self._finish_ask(key)

    def _finish_ask(self, key: str) -> None:
        with self._lock:
            ask = self._asks.get(key)
            if ask is None or ask.waiting:
                return
            del self._asks[key]
        self._answer(msgspec.convert({**summed(ask.got), "id": ask.request_id}, StatsEvent))

    # -- lines up --------------------------------------------------------------------------------------
    def _read(self, node: Node) -> None:
        """The node's answers, for the pool's life (or this caller's hold on it); then the node is lost."""
        error: BaseException = PoolError("its pool exited")
        assert node.pipe is not None
        try:
            with node.pipe.makefile("rb") as lines:
                for raw in lines:
                    if raw == LET_GO:  # another caller took the pipe over
                        if not self._stop.is_set():
                            self._taken_over()
                        return
                    self.last_heard = time.monotonic()
                    self._arrived(node, raw)
        except OSError as exc:
            error = exc
        finally:
            _hang_up(node)
        if self._stop.is_set():
            return
        try:  # why the connection ended: the actor's death says more than its end of file
            ray.get(node.actor.node_id.remote(), timeout=_CLOSE_MARGIN)
        except ray.exceptions.RayError as exc:
            error = exc
        self._lose(node, error)

    def _arrived(self, node: Node, raw: bytes) -> None:
        try:
            message = decode_answer(raw)
        except (msgspec.DecodeError, msgspec.ValidationError, RecursionError) as exc:
            self._on_bad_line(raw, str(exc))
            return
        if isinstance(message, CallEvent):
            with self._lock:
                call_id = next(self._call_ids)
                self._calls[call_id] = (node, message.call_id)
            self._on_line(msgspec.structs.replace(message, call_id=call_id))
            return
        if isinstance(message, StatsEvent) and isinstance(message.id, str) and "~" in message.id:
            key = message.id.rsplit("~", 1)[0]
            node.stats = msgspec.to_builtins(message)
            with self._lock:
                ask = self._asks.get(key)
                if ask is not None and ask.waiting.pop(id(node), None) is not None:
                    ask.got.append(node.stats)
            self._finish_ask(key)
            return
        request_id = getattr(message, "id", None)
        if request_id is not None and not isinstance(message, CallEvent):
            with self._lock:
                finished = isinstance(message, SessionResult | Closed | StatsEvent) or type(message).__name__ in (
                    "CancelAnswer", "FilesListed", "Uploaded", "Downloaded")
                owner = self._owner.pop(request_id, None) if finished else None
                if owner is not None:
                    self._settled(owner[0], owner[1], message)
                reason = self._reopening.pop(request_id, None) if finished else None
            if reason is not None and isinstance(message, SessionResult) and not isinstance(
                    message.session_reopened, str):
                message = msgspec.structs.replace(message, session_reopened=reason)
        self._on_line(message)

    def _settled(self, node: Node, request: Request, message: Answer) -> None:
        """A request's answer came: its slot is free, a session it ended leaves its node. Under the lock."""
        if request.session is None:
            node.in_flight -= 1
            self._serve()
            return
        ended = isinstance(message, Closed) or (isinstance(message, SessionResult) and message.session_ended)
        if ended and self._pins.get(request.session) is node:
            del self._pins[request.session]
            node.sessions -= 1

    def _answer(self, message: Answer) -> None:
        self._on_line(message)

    # -- loss and the end ------------------------------------------------------------------------------
    def _lose(self, node: Node, exc: BaseException) -> None:
        """``node`` is gone: each request it had is answered once, here; its sessions' state is gone."""
        text = str(exc).strip()
        reason = f"{type(exc).__name__}: {text.splitlines()[-1] if text else type(exc).__name__}"
        with self._lock:
            if node.lost is not None:
                return
            node.lost = reason
            stranded = [(key, request) for key, (owner, request) in self._owner.items() if owner is node]
            for key, _ in stranded:
                del self._owner[key]
            for name in [name for name, owner in self._pins.items() if owner is node]:
                del self._pins[name]
                self._gone[name] = f"its node was lost ({node.describe()}: {reason})"
            node.sessions = 0
            node.in_flight = 0
            node.lost_runs += sum(1 for _, request in stranded if request.close is None)
            for key in [key for key, call in self._calls.items() if call[0] is node]:
                del self._calls[key]
            asks = [key for key, ask in self._asks.items() if ask.waiting.pop(id(node), None) is not None]
        _hang_up(node)
        if not self._stop.is_set():
            _log.warning("pynox-ray: gave up %s: %s", node.describe(), reason)
        try:
            ray.kill(node.actor, no_restart=True)  # unreachable is not dead: nothing may run on unobserved
        except Exception:
            pass  # already gone
        message = (f"the pool on {node.describe()} was lost while this job was in flight ({reason}); "
                   "the job may have run, and was not retried")
        for key, request in stranded:
            if request.close:
                self._answer(Closed(id=key, session=request.session or ""))
            else:
                self._answer(lost_wire(message, id=key, session=request.session,
                                       session_ended=request.session is not None))
        for key in asks:
            self._finish_ask(key)
        with self._lock:
            self._serve()
        self._announce()

    def _taken_over(self) -> None:
        """Another caller attached to this named fleet: it is theirs now, and this caller's runs end here."""
        with self._lock:
            if self.dead:
                return
            self.dead = self.taken = True
            self.hung = (f"another caller attached to the RayPool {self.plan.name!r}: its runs in flight here "
                         "have nobody to answer them")
        self._stop.set()
        self._on_exit(self)

    def _stop_pool(self, node: Node, restart: bool = False) -> None:
        try:
            ray.get(node.actor.close.remote(5.0, restart), timeout=5.0 + _CLOSE_MARGIN)
        except ray.exceptions.RayError:
            pass  # lost meanwhile: nothing of it serves either way

    def _start_error(self, error_type: str, message: str) -> None:
        self._fail_start(msgspec.json.encode({"event": "error", "error": {"type": error_type, "message": message}}))

    def _fail_start(self, line: bytes) -> None:
        """The fleet cannot start: its pools are stopped, and the client raises what ``line`` says."""
        self._stop.set()
        for node in list(self.nodes.all):
            self._stop_pool(node)
            try:
                ray.kill(node.actor, no_restart=True)
            except Exception:
                pass  # already gone
        self.dead = True
        if not self.ready.done():
            self.ready.set_result(line)

    def fleet_ready(self) -> dict[str, Any]:
        """The fleet's ready event: a serving node's, with every serving node's workers, and ``nodes``: each
        node's ABI, backend and bounds not in force, and whether it serves."""
        with self._lock:
            serving = self.nodes.serving()
            first = dict(serving[0].ready or {}) if serving else {}
            first["workers"] = sum(int((node.ready or {}).get("workers", 0)) for node in serving)
            first["contract"] = self.plan.contract
            first["nodes"] = [describe_node(node) for node in self.nodes.all if node.ready is not None]
        return first

    def node_of(self, session: str) -> str | None:
        with self._lock:
            node = self._pins.get(session)
        return node.node_id if node is not None else None

    def stop_hung(self, why: str) -> None:
        self.hung = why

    def forget_after_fork(self) -> None:
        self.dead = True
        self.hung = "this fleet belongs to the process that forked"

    def describe_exit(self) -> str:
        return self.hung or self.nodes.none_left()

    def close(self, timeout: float) -> None:
        """Stop every node's pool (each drains what it accepted) and its actor; a named fleet's serve on."""
        self._stop.set()
        self.dead = True
        if self.plan.name is not None:  # this caller lets go: its connections end, the pools serve on
            for node in self.nodes.all:
                _hang_up(node)
            self._on_exit(self)
            return
        if ray.is_initialized():
            serving = [node for node in self.nodes.all if node.lost is None]
            end_actors([node.actor for node in serving], timeout)
            with self._lock:
                for node in serving:
                    node.lost = node.lost or "closed"
        for node in self.nodes.all:
            _hang_up(node)
        self._on_exit(self)


def _hang_up(node: Node) -> None:
    """End this caller's connection to ``node`` (its reader sees the end)."""
    pipe = node.pipe
    if pipe is not None:
        try:
            pipe.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # already closed by the other side
        pipe.close()


def describe_node(node: Node) -> dict[str, Any]:
    """A node as the fleet's ready event and stats show it: its pool's contract, and whether it serves."""
    ready = node.ready or {}
    return {"node_id": node.node_id, "actor": node.actor_name, "serving": node.serving,
            "landlock_abi": ready.get("landlock_abi"), "backend": ready.get("backend"),
            "bounds_not_in_force": ready.get("bounds_not_in_force"), "workers": ready.get("workers"),
            "refused": node.refused, "lost": node.lost}


def _key(message: Request) -> _Id:
    return message.id if message.id is not None else ""


def _contract_of(event: ReadyEvent) -> tuple[int, str, tuple[str, ...]]:
    return event.landlock_abi, event.backend, tuple(sorted(event.bounds_not_in_force))


def _say(contract: tuple[int, str, tuple[str, ...]] | None) -> str:
    if contract is None:
        return "none"
    abi, backend, bounds = contract
    return f"Landlock ABI {abi}, {backend}" + (f", not in force: {'; '.join(bounds)}" if bounds else "")


def _refusal(message: Request, text: str, *, session_ended: bool = False,
             worker_error: bool = False) -> SessionResult:
    if worker_error:
        return lost_wire(text, id=_key(message), session=message.session)
    return SessionResult(id=_key(message), exit=2, refused=True, session=message.session, session_ended=session_ended,
                         error=ErrorInfo(type="RequestError", message=text))


def encode_ready(ready: dict[str, Any]) -> bytes:
    return msgspec.json.encode(ready) + b"\n"
