"""pynox-pydantic-ai as pydantic-ai's own code tools behave (issue 32, rows 1 to 5): cancelling a run stops its
code, a continued conversation is told its state is gone, a host function's ``ModelRetry`` reaches the model
with its words, and ``PynoxCodeMode`` tells the model the facts and keeps its state through the run.

Every agent runs on pydantic-ai's ``FunctionModel`` against a real pool; harm is checked from the host.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from pydantic_ai import Agent, ModelRetry

from pynox import Pool
from pynox_pydantic_ai import PynoxCodeMode, PynoxToolset
from tests.harness.fixtures import shared_pool

from .conftest import run_async
from .scripted import Transcript, code_calls, late_write, pydantic_model

pytestmark = pytest.mark.timeout(90)


pool = shared_pool(workers=2)


@pytest.mark.parametrize("session", [True, False])
def test_a_cancelled_run_stops_its_code_promptly(pool: Pool, tmp_path: Path, session: bool) -> None:
    late = tmp_path / "late.txt"
    toolset = PynoxToolset(pool, session=session, allow_write=[tmp_path])
    agent = Agent(pydantic_model(code_calls(late_write(late))), toolsets=[toolset])

    async def cancelled_after_a_second() -> float:
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(agent.run("go"), 1.0)
        return time.monotonic() - started

    assert run_async(cancelled_after_a_second()) < 2.5, "the cancel waited for the code"
    time.sleep(4)  # past the moment the code would have written
    assert not late.exists(), "the cancelled code's side effect happened"
    # The control: uncancelled, the same code writes the file (the harm is real).
    run_async(agent.run("go"))
    assert late.read_text() == "written"


def _conversation(toolset: PynoxToolset, first: str, second: str) -> Transcript:
    """Two runs of one conversation (the second continues the first's message history)."""
    agent = Agent(pydantic_model(code_calls(first)), toolsets=[toolset])
    history = agent.run_sync("first").all_messages()
    transcript = Transcript()
    # The scripted model counts the history's tool returns too: its second call is this run's first.
    Agent(pydantic_model(code_calls(first, second), transcript), toolsets=[toolset]).run_sync(
        "second", message_history=history)
    return transcript


def test_a_continued_conversation_starts_fresh_and_the_model_is_told(pool: Pool) -> None:
    toolset = PynoxToolset(pool, session=True)
    assert "within one agent run" in toolset.description and "even in the same conversation" in toolset.description
    continued = _conversation(toolset, "x = 41\nprint(x)", "print(x + 1)")
    assert continued.results[0] == "41"
    assert continued.results[-1].startswith("[A fresh process: variables, imports and functions from earlier "
                                            "messages of this conversation are gone")
    assert "NameError: name 'x' is not defined" in continued.results[-1]
    fresh = Transcript()  # a new conversation: nothing to be told
    Agent(pydantic_model(code_calls("print(x)"), fresh), toolsets=[toolset]).run_sync("new conversation")
    assert fresh.results[0].startswith("NameError: name 'x' is not defined")


def test_a_host_functions_model_retry_reaches_the_model_with_its_message(pool: Pool) -> None:
    def lookup(key: str) -> str:
        if key != key.upper():
            raise ModelRetry("keys are upper case")
        return "found"

    transcript = Transcript()
    code = "from pynox_host import lookup\nprint(lookup('abc'))"
    agent = Agent(pydantic_model(code_calls(code, code.replace("'abc'", "'ABC'")), transcript),
                  toolsets=[PynoxToolset(pool, functions={"lookup": lookup})])
    agent.run_sync("go")
    assert "keys are upper case" in transcript.results[0] and transcript.outcomes[0] == "retried"
    assert transcript.results[1] == "found"


def test_code_mode_states_the_grants_limits_and_what_persists(pool: Pool, tmp_path: Path) -> None:
    def weather(city: str) -> str:
        """The weather in a city."""
        return f"sunny in {city}"

    transcript = Transcript()
    calls = [("run_code", {"code": "x = await weather(city='Oslo')\nx"}), ("run_code", {"code": "x.upper()"})]
    agent = Agent(pydantic_model(calls, transcript), tools=[weather],
                  capabilities=[PynoxCodeMode(pool, allow_read=[tmp_path], timeout="7s")])
    agent.run_sync("go")
    description = transcript.tool("run_code").description
    assert f"Read files: {tmp_path}" in description and "7s of time" in description
    assert "Write files: nowhere" in description and "Network: not allowed" in description
    assert "variables" in description and "this run" in description
    assert transcript.results == ["Out: 'sunny in Oslo'", "Out: 'SUNNY IN OSLO'"]


def test_code_mode_calls_of_one_run_share_state_and_runs_do_not(pool: Pool) -> None:
    calls = [("run_code", {"code": "counter = 1"}), ("run_code", {"code": "counter + 1"})]
    first, second = Transcript(), Transcript()
    mode = PynoxCodeMode(pool)

    def noop() -> str:
        """Nothing."""
        return ""

    Agent(pydantic_model(calls, first), tools=[noop], capabilities=[mode]).run_sync("go")
    assert first.results[1] == "Out: 2"
    Agent(pydantic_model([("run_code", {"code": "counter"})], second), tools=[noop],
          capabilities=[mode]).run_sync("again")
    assert "NameError" in second.results[0]

