"""pynox-strands as strands' own tools behave: per-agent sessions, failures with status "error", images.

Real strands agents with a scripted model, against a real pool. The cross-agent test is the one
the review found: one ``python_tool(session=True)`` at module level, two agents.
"""

from __future__ import annotations

from typing import Any

import pytest
from strands import Agent
from strands.hooks import AfterToolCallEvent

from pynox import Pool
from pynox_strands import python_tool
from tests.harness.fixtures import shared_pool

from .scripted import ScriptedStrandsModel, Transcript, code_calls

pytestmark = pytest.mark.timeout(90)


pool = shared_pool(workers=2)


def _agent(tools: list[Any], calls: list[Any], transcript: Transcript) -> Agent:
    return Agent(model=ScriptedStrandsModel(calls, transcript), callback_handler=None, tools=tools)


def test_one_session_tool_never_shares_state_across_agents(pool: Pool) -> None:
    shared = python_tool(pool, session=True)  # defined once, as strands users do at module level
    alice, bob = Transcript(), Transcript()
    _agent([shared], code_calls("secret = 'alice-token'", "print(secret)"), alice)("go")
    _agent([shared], code_calls("print(secret)"), bob)("go")
    assert alice.results[-1] == "alice-token"  # a session: kept between one agent's calls
    assert bob.results[0].startswith("NameError: name 'secret' is not defined"), bob.results


def test_a_failed_run_has_status_error_for_the_hooks(pool: Pool) -> None:
    statuses: list[str] = []
    transcript = Transcript()
    agent = _agent([python_tool(pool)], code_calls("raise KeyError('k')", "print('ok')"), transcript)
    agent.hooks.add_callback(AfterToolCallEvent, lambda event: statuses.append(event.result["status"]))
    agent("go")
    assert statuses == ["error", "success"]
    assert transcript.results[0].startswith("KeyError: 'k' (agent.py:1)")


def test_a_refusal_by_pynox_is_an_error_result() -> None:
    with Pool(workers=1) as closed:
        tool = python_tool(closed)
    statuses: list[str] = []
    transcript = Transcript()
    agent = _agent([tool], code_calls("print(1)"), transcript)
    agent.hooks.add_callback(AfterToolCallEvent, lambda event: statuses.append(event.result["status"]))
    agent("go")
    assert statuses == ["error"] and transcript.results == ["PoolError: this pool is closed"]


def test_figures_are_image_blocks(pool: Pool) -> None:
    pytest.importorskip("matplotlib")
    blocks: list[dict[str, Any]] = []
    agent = _agent([python_tool(pool, timeout="60s")],
                   code_calls("import matplotlib.pyplot as plt\nplt.plot([1, 2])\nprint('drawn')"), Transcript())
    agent.hooks.add_callback(AfterToolCallEvent, lambda event: blocks.extend(event.result["content"]))
    agent("go")
    text, image = blocks
    assert text == {"text": "drawn\n[1 image]"}
    assert image["image"]["format"] == "png" and image["image"]["source"]["bytes"].startswith(b"\x89PNG")
