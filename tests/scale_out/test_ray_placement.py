"""Placement, as logic: slots per node, ties in turn, sessions to the node with fewest, lost nodes left out.

No cluster: ``Nodes`` holds only counts and handles, so these run in milliseconds.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pynox_ray.placement import Node, Nodes

pytestmark = pytest.mark.pure


def _nodes(*capacities: int) -> Nodes:
    nodes = Nodes()
    nodes.all = [Node(node_id=f"node-{i}", actor=None, actor_name=f"actor-{i}", capacity=capacity, ready={})
                 for i, capacity in enumerate(capacities)]
    return nodes


def test_runs_spread_and_never_exceed_a_nodes_queue() -> None:
    nodes = _nodes(3, 3)
    taken = [nodes.free() for _ in range(6)]
    assert sorted(node.node_id for node in taken if node is not None) == ["node-0"] * 3 + ["node-1"] * 3
    assert taken[:2] != [taken[0]] * 2, "ties were not taken in turn"
    assert nodes.free() is None, "a seventh run was let onto a full node"
    assert max(node.in_flight for node in nodes.all) == 3


def test_a_lost_node_or_one_that_does_not_serve_takes_nothing() -> None:
    nodes = _nodes(3, 3, 3)
    nodes.all[0].lost = "ActorDiedError: gone"
    nodes.all[1].refused = "it confines jobs otherwise"
    nodes.all[2].ready = None  # still starting
    assert nodes.free() is None and nodes.pin() is None
    assert nodes.none_left() == ("no node of this pool is left (node node-0 (actor-0): ActorDiedError: gone; "
                                 "node node-1 (actor-1): it confines jobs otherwise; "
                                 "node node-2 (actor-2): its pool is starting)")
    nodes.all[2].ready = {}
    assert nodes.free() is nodes.all[2] and nodes.pin() is nodes.all[2]


def test_sessions_are_pinned_to_the_node_with_fewest() -> None:
    nodes = _nodes(3, 3)
    first, second = nodes.pin(), nodes.pin()
    assert first is not None and first is not second
    first.sessions -= 1
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
