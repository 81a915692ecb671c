"""pynox-pydantic-ai beyond the shared suite: async tool, per-run sessions, instructions, errors as text."""

from __future__ import annotations

import asyncio
import inspect
from pathlib import Path

import pytest
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

import pynox
from pynox import Pool
from pynox_pydantic_ai import PynoxCapability, PynoxToolset

from .conftest import WORKERS, run_async
from .procs import pynox_processes, wait_for_idle
from .scripted import ANSWER, Transcript, code_calls, pydantic_model, run_pydantic_ai

pytestmark = pytest.mark.timeout(60)


def test_the_tool_is_async_and_nothing_starts_before_the_first_call(earlier_pools: frozenset[int]) -> None:
    before = pynox_processes()
    toolset = PynoxToolset(session=True, allow_read=["/usr/share"])  # the default pool: not started here
    PynoxCapability(toolset)
    assert pynox_processes() == before
    assert inspect.iscoroutinefunction(toolset.tools["run_python"].function)
    assert toolset.description.startswith("Run Python code in an isolated sandbox")


def test_a_bad_grant_fails_when_the_toolset_is_made(pool: Pool) -> None:
    with pytest.raises(pynox.PynoxError, match="not a duration"):
        PynoxToolset(pool, timeout="soon")
    with pytest.raises(TypeError, match="pass it alone"):
        PynoxToolset(session=pool.session(), allow_read=["/tmp"])


def test_each_run_gets_its_own_session_which_ends_with_the_run(pool: Pool, earlier_pools: frozenset[int]) -> None:
    agent = Agent(pydantic_model(code_calls("x = 41", "print(x + 1)")), toolsets=[PynoxToolset(pool, session=True)])
    first = agent.run_sync("go")
    assert first.output == ANSWER
    wait_for_idle(templates=WORKERS, ignore=earlier_pools)  # the run's session (its template and process) is gone
    transcript = Transcript()
    Agent(pydantic_model(code_calls("print(x)"), transcript), toolsets=agent.toolsets).run_sync("again")
    assert transcript.results[0].startswith("NameError: name 'x' is not defined")


def test_a_session_of_the_callers_is_shared_by_runs_and_left_open(pool: Pool) -> None:
    with pool.session(timeout="5s") as session:
        toolset = PynoxToolset(session=session)
        assert "5s of time" in toolset.description and "Calls share one Python process" in toolset.description
        run_pydantic_ai({"toolsets": [toolset]}, code_calls("x = 41"))
        transcript = run_pydantic_ai({"toolsets": [toolset]}, code_calls("print(x + 1)"))
        assert transcript.results == ["42"]
        assert session.alive and session.steps == 2
    assert not session.alive


def test_the_capability_tells_the_model_what_the_code_may_touch(pool: Pool, tmp_path: Path) -> None:
    # A directory of the test's own: a checkout (and its venv, the runtime) may itself lie under /tmp.
    out = str(tmp_path)
    toolset = PynoxToolset(pool, allow_read=["/usr/share"], allow_write=[out], timeout="7s")
    transcript = run_pydantic_ai({"capabilities": [PynoxCapability(toolset)]}, code_calls("print(1)"))
    instructions = transcript.instructions or ""
    assert instructions == toolset.model_instructions
    assert instructions.startswith("You can run Python code with the `run_python` tool.")
    assert f"- Read files: /usr/share, {out}" in instructions and f"- Write files: {out}." in instructions
    assert "7s of time" in instructions and "Args:" not in instructions
    mine = run_pydantic_ai({"capabilities": [PynoxCapability(toolset, instructions="Only print summaries.")]},
                           code_calls("print(1)"))
    assert mine.instructions == "Only print summaries."


def test_a_pynox_failure_is_text_for_the_model_and_the_run_completes() -> None:
    with Pool(workers=1) as closed:
        toolset = PynoxToolset(closed)
    transcript = run_pydantic_ai({"toolsets": [toolset]}, code_calls("print(1)"))
    assert transcript.results == ["PoolError: this pool is closed"] and transcript.answer == ANSWER


def test_runs_in_parallel_on_one_loop(pool: Pool) -> None:
    toolset = PynoxToolset(pool)

    async def both() -> list[str]:
        agents = [Agent(pydantic_model(code_calls(f"print({n} * 2)")), toolsets=[toolset]) for n in (1, 2)]
        results = await asyncio.gather(*(agent.run("go") for agent in agents))
        return [result.output for result in results]

    assert run_async(both()) == [ANSWER, ANSWER]


def test_calls_into_a_session_run_in_the_models_order_even_when_made_together(pool: Pool) -> None:
    codes = ["import time\ntime.sleep(0.3)\nx = 41", "print(x + 1)"]

    def both_at_once(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        returned = [part for message in messages for part in message.parts if isinstance(part, ToolReturnPart)]
        if returned:
            return ModelResponse(parts=[TextPart(" | ".join(part.model_response_str() for part in returned))])
        return ModelResponse(parts=[ToolCallPart("run_python", {"code": code}, tool_call_id=f"call-{n}")
                                    for n, code in enumerate(codes)])

    agent = Agent(FunctionModel(both_at_once), toolsets=[PynoxToolset(pool, session=True)])
    assert agent.run_sync("go").output.endswith(" | 42")


def test_the_specs_one_liner_constructs_its_agent(monkeypatch: pytest.MonkeyPatch) -> None:
    # The integration group carries pydantic-ai's Anthropic extra: without it this line raises ImportError.
    monkeypatch.setenv("ANTHROPIC_API_KEY", "not-used: the agent is constructed, never run")
    agent = Agent("anthropic:claude-sonnet-4-5", tools=[pynox.tool()])
    assert type(agent.model).__name__ == "AnthropicModel"
