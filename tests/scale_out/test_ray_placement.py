"""Placement, as logic: slots per node, arrival order, a lost node's waiting runs sent elsewhere.

No cluster: ``Nodes`` holds only counts and handles, so these run in milliseconds.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest

from pynox import PoolError
from pynox_ray.placement import Node, Nodes

pytestmark = pytest.mark.pure


def _nodes(*capacities: int) -> Nodes:
    return Nodes([Node(node_id=f"node-{i}", actor=None, actor_name=f"actor-{i}", capacity=capacity)
                  for i, capacity in enumerate(capacities)])


def test_runs_spread_and_never_exceed_a_nodes_queue() -> None:
    nodes = _nodes(3, 3)
    taken = [nodes.acquire() for _ in range(6)]
    assert sorted(node.node_id for node in taken) == ["node-0"] * 3 + ["node-1"] * 3
    waiting: list[Node] = []
    waiter = threading.Thread(target=lambda: waiting.append(nodes.acquire()))
    waiter.start()
    time.sleep(0.1)
    assert not waiting, "a seventh run was let onto a full node"
    nodes.release(taken[-1])
    waiter.join(timeout=5)
    assert waiting == [taken[-1]]
    assert max(node.in_flight for node in nodes.all) == 3


def test_waiting_runs_are_served_in_arrival_order() -> None:
    nodes = _nodes(1)
    first = nodes.acquire()
    order: list[int] = []
    threads = []
    for i in range(4):
        thread = threading.Thread(target=lambda i=i: (nodes.acquire(), order.append(i)))
        thread.start()
        threads.append(thread)
        time.sleep(0.05)  # each queues before the next
    for _ in range(4):
        nodes.release(first)
        time.sleep(0.05)
    for thread in threads:
        thread.join(timeout=5)
    assert order == [0, 1, 2, 3]


def test_a_lost_node_sends_its_waiting_runs_to_the_nodes_left() -> None:
    nodes = _nodes(1, 1)
    a, b = nodes.acquire(), nodes.acquire()
    got: list[Node] = []
    waiter = threading.Thread(target=lambda: got.append(nodes.acquire()))
    waiter.start()
    time.sleep(0.05)
    assert nodes.lose(a, "killed") and not nodes.lose(a, "again")
    nodes.release(a)  # its run ended (with the loss): the slot is not handed out
    time.sleep(0.05)
    assert not got
    nodes.release(b)
    waiter.join(timeout=5)
    assert got == [b]


def test_no_node_left_is_an_error_for_every_waiting_run() -> None:
    nodes = _nodes(1)
    only = nodes.acquire()
    errors: list[BaseException] = []

    def wait() -> None:
        try:
            nodes.acquire()
        except PoolError as exc:
            errors.append(exc)

    waiter = threading.Thread(target=wait)
    waiter.start()
    time.sleep(0.05)
    nodes.lose(only, "ActorDiedError: killed")
    waiter.join(timeout=5)
    assert len(errors) == 1 and "no node of this pool is left" in str(errors[0]) and "killed" in str(errors[0])
    with pytest.raises(PoolError, match="no node of this pool is left"):
        nodes.acquire()
    with pytest.raises(PoolError, match="no node of this pool is left"):
        nodes.pin()


def test_an_async_waiter_cancelled_gives_its_slot_back() -> None:
    async def scenario() -> None:
        nodes = _nodes(1)
        held = await nodes.acquire_async()
        waiting = asyncio.ensure_future(nodes.acquire_async())
        await asyncio.sleep(0.01)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        nodes.release(held)
        assert nodes.all[0].in_flight == 0
        assert await asyncio.wait_for(nodes.acquire_async(), 1) is held

    asyncio.run(scenario())


def test_sessions_are_pinned_to_the_node_with_fewest() -> None:
    nodes = _nodes(3, 3)
    first, second = nodes.pin(), nodes.pin()
    assert first is not second
    nodes.unpin(first)
    assert nodes.pin() is first


def test_an_operators_pynox_config_on_a_node_cannot_be_swapped_by_the_caller(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The node actor's rule, without a cluster: PYNOX_CONFIG in the node's environment is its config."""
    from pynox import ConfigError
    from pynox_ray.node import NodePool

    operator = tmp_path / "operator.toml"
    monkeypatch.setenv("PYNOX_CONFIG", str(operator))
    with pytest.raises(ConfigError, match="fixed by its operator"):
        NodePool({"config": str(tmp_path / "mine.toml")}, str(tmp_path))
    assert NodePool({"config": None}, str(tmp_path))._options["config"] == str(operator)
    assert NodePool({"config": str(operator)}, str(tmp_path))._options["config"] == str(operator)
    monkeypatch.delenv("PYNOX_CONFIG")
    assert NodePool({"config": str(tmp_path / "mine.toml")}, str(tmp_path))._options["config"] == \
        str(tmp_path / "mine.toml")  # the control: with no operator's file, the caller's is used
