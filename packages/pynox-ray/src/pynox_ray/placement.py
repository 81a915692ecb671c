"""Which node a line goes to: one pool per node, each taking at most what its queue holds.

A node's pool accepts without blocking its intake as many plain jobs as it runs and queues (three per
worker, as ``pynox.Pool`` keeps in flight itself): a run goes to the live node with the most free slots
(ties in turn) and waits, in arrival order, when every node is full. A session goes to the live node with
the fewest sessions and stays there while that node lives. A lost node takes nothing more.
"""

from __future__ import annotations

import itertools
import socket
import threading
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Node", "Nodes"]


@dataclass(eq=False)
class Node:
    """One node's pool, as the caller keeps count of it."""

    node_id: str
    actor: Any  # the NodePool actor's handle
    actor_name: str
    capacity: int
    in_flight: int = 0  # plain runs sent and not answered
    sessions: int = 0
    sent: int = 0
    lost_runs: int = 0  # runs that ended with this node's loss
    lost: str | None = None  # why the node was given up, once it was
    refused: str | None = None  # why it takes no work although it lives (the fleet's contract)
    ready: dict[str, Any] | None = None  # its pool's ready event, once it is started
    joined: float = 0.0  # time.monotonic() when the caller placed its pool
    started: float | None = None  # ... and when that pool was ready
    stats: dict[str, Any] | None = field(default=None)  # its pool's counters, at the last stats
    epoch: int = 0  # this caller's hold on the actor's pipe (a named fleet's new caller takes it over)
    pipe: socket.socket | None = None  # this caller's connection to the actor, which carries the lines
    writing: threading.Lock = field(default_factory=threading.Lock)

    def describe(self) -> str:
        return f"node {self.node_id[:12]} ({self.actor_name})"

    @property
    def serving(self) -> bool:
        return self.lost is None and self.refused is None and self.ready is not None


class Nodes:
    """The pool's nodes and their slots; the caller holds its own lock around every use."""

    def __init__(self) -> None:
        self.all: list[Node] = []
        self._spread = itertools.count()

    def serving(self) -> list[Node]:
        return [node for node in self.all if node.serving]

    def free(self) -> Node | None:
        """The serving node with the most free slots (ties taken in turn), its slot taken; or None."""
        candidates = [node for node in self.all if node.serving and node.in_flight < node.capacity]
        if not candidates:
            return None
        most = max(node.capacity - node.in_flight for node in candidates)
        best = [node for node in candidates if node.capacity - node.in_flight == most]
        node = best[next(self._spread) % len(best)]
        node.in_flight += 1
        node.sent += 1
        return node

    def pin(self) -> Node | None:
        """A node for a new session: the serving one with the fewest sessions, then the fewest runs."""
        live = self.serving()
        if not live:
            return None
        node = min(live, key=lambda n: (n.sessions, n.in_flight, n.sent))
        node.sessions += 1
        return node

    def none_left(self) -> str:
        reasons = "; ".join(f"{node.describe()}: {node.lost or node.refused or 'its pool is starting'}"
                            for node in self.all)
        return f"no node of this pool is left ({reasons or 'the cluster has no node it may use'})"
