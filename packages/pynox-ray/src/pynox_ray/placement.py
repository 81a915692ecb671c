"""Which node a run goes to: one pool per node, each taking at most what its queue holds.

A node's pool accepts without blocking its intake as many plain jobs as it runs and queues (three per
worker, as ``pynox.Pool`` keeps in flight itself): a run takes a slot on the live node with the most free
ones and waits, in arrival order, when every node is full. A lost node takes no more runs; the runs it had
each end once, with the node's loss (see ``pool.py``); once no node is left, runs raise ``PoolError``.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import threading
from dataclasses import dataclass
from typing import Any

from pynox import PoolError

__all__ = ["Node", "Nodes"]


@dataclass
class Node:
    """One node's pool, as the caller keeps count of it."""

    node_id: str
    actor: Any  # the NodePool actor's handle
    actor_name: str
    capacity: int
    in_flight: int = 0
    sessions: int = 0
    sent: int = 0
    lost_runs: int = 0  # runs that ended with this node's loss
    lost: str | None = None  # why the node was given up, once it was

    def describe(self) -> str:
        return f"node {self.node_id[:12]} ({self.actor_name})"


class _Turn:
    """A run waiting for a slot: it gets a node, or the error that says none is left."""

    def __init__(self, loop: asyncio.AbstractEventLoop | None) -> None:
        self.loop = loop
        self.event = threading.Event()
        self.future: asyncio.Future[Node] | None = loop.create_future() if loop is not None else None
        self.node: Node | None = None
        self.error: PoolError | None = None


class Nodes:
    """The pool's nodes and their slots; thread-safe, for threads and event loops alike."""

    def __init__(self, nodes: list[Node]) -> None:
        self.all = nodes
        self._lock = threading.Lock()
        self._turns: collections.deque[_Turn] = collections.deque()
        self._spread = itertools.count()

    def live(self) -> list[Node]:
        with self._lock:
            return [node for node in self.all if node.lost is None]

    def _none_left(self) -> PoolError:
        reasons = "; ".join(f"{node.describe()}: {node.lost}" for node in self.all)
        return PoolError(f"no node of this pool is left ({reasons})")

    def _free(self) -> Node | None:
        """The live node with the most free slots (ties taken in turn), or None; under the lock."""
        candidates = [node for node in self.all if node.lost is None and node.in_flight < node.capacity]
        if not candidates:
            return None
        most = max(node.capacity - node.in_flight for node in candidates)
        best = [node for node in candidates if node.capacity - node.in_flight == most]
        node = best[next(self._spread) % len(best)]
        node.in_flight += 1
        node.sent += 1
        return node

    def _take_or_queue(self, loop: asyncio.AbstractEventLoop | None) -> Node | _Turn:
        with self._lock:
            if not any(node.lost is None for node in self.all):
                raise self._none_left()
            if not self._turns:
                node = self._free()
                if node is not None:
                    return node
            turn = _Turn(loop)
            self._turns.append(turn)
            return turn

    def acquire(self) -> Node:
        """A slot on a node, waiting for one in arrival order."""
        taken = self._take_or_queue(None)
        if isinstance(taken, Node):
            return taken
        taken.event.wait()
        if taken.error is not None:
            raise taken.error
        assert taken.node is not None
        return taken.node

    async def acquire_async(self) -> Node:
        """:meth:`acquire` for a coroutine: the loop is not blocked while it waits."""
        taken = self._take_or_queue(asyncio.get_running_loop())
        if isinstance(taken, Node):
            return taken
        assert taken.future is not None
        try:
            return await taken.future
        except asyncio.CancelledError:
            with self._lock:
                if taken in self._turns:
                    self._turns.remove(taken)
                    raise
            # It was handed a node as it was cancelled: give the slot back.
            if taken.node is not None:
                self.release(taken.node)
            raise

    def release(self, node: Node) -> None:
        """A run on ``node`` ended: its slot goes to the first waiting run, on whichever node is freest."""
        with self._lock:
            node.in_flight -= 1
            self._serve()

    def _serve(self) -> None:
        """Hand free slots to waiting runs, first come first served; under the lock."""
        while self._turns:
            if not any(n.lost is None for n in self.all):
                error = self._none_left()
                while self._turns:
                    self._deliver(self._turns.popleft(), None, error)
                return
            node = self._free()
            if node is None:
                return
            self._deliver(self._turns.popleft(), node, None)

    def _deliver(self, turn: _Turn, node: Node | None, error: PoolError | None) -> None:
        turn.node, turn.error = node, error
        turn.event.set()
        if turn.loop is not None and turn.future is not None:
            future = turn.future

            def settle() -> None:
                if future.cancelled():
                    return  # acquire_async gives the slot back
                if error is not None:
                    future.set_exception(error)
                else:
                    assert node is not None
                    future.set_result(node)

            try:
                turn.loop.call_soon_threadsafe(settle)
            except RuntimeError:  # that loop is closed: nobody waits there any more
                if node is not None:
                    node.in_flight -= 1

    def pin(self) -> Node:
        """A node for a new session: the live one with the fewest sessions, then the fewest runs."""
        with self._lock:
            live = [node for node in self.all if node.lost is None]
            if not live:
                raise self._none_left()
            node = min(live, key=lambda n: (n.sessions, n.in_flight, n.sent))
            node.sessions += 1
            return node

    def unpin(self, node: Node) -> None:
        with self._lock:
            node.sessions -= 1

    def count_lost(self, node: Node) -> None:
        with self._lock:
            node.lost_runs += 1

    def lose(self, node: Node, reason: str) -> bool:
        """Give ``node`` up (its actor died, its node left): True the first time. Waiting runs go elsewhere."""
        with self._lock:
            if node.lost is not None:
                return False
            node.lost = reason
            self._serve()
            return True
