"""Google ADK: ``PynoxCodeExecutor`` as an ``LlmAgent``'s ``code_executor``, run by ADK's ``InMemoryRunner`` with a
scripted model (a ``BaseLlm`` that answers with code blocks, then text).

Runs in its own environment (``requirements-separate.txt``; marked ``separate_env``, run by ``.ci/run``):
google-adk requires an opentelemetry-api the workspace's pins exclude.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from google.adk.agents import LlmAgent
from google.adk.models import BaseLlm, LlmRequest, LlmResponse
from google.adk.runners import InMemoryRunner
from google.genai import types
from pydantic import Field

from pynox import Pool
from pynox_adk import PynoxCodeExecutor

from .conftest import run_async
from .procs import running_pools, wait_for_idle, wait_for_none
from .test_docs_and_examples import CODE, ROOT, python_blocks, run_script, section

pytestmark = [pytest.mark.separate_env, pytest.mark.timeout(90)]

ANSWER = "Done."


class ScriptedLlm(BaseLlm):
    """Answers each turn with the next reply (a code block for ADK's executor), then with ``ANSWER``."""

    model: str = "scripted"
    replies: list[str] = Field(default_factory=list)
    turn: int = 0

    async def generate_content_async(self, llm_request: LlmRequest,
                                     stream: bool = False) -> AsyncGenerator[LlmResponse, None]:
        text = self.replies[self.turn] if self.turn < len(self.replies) else ANSWER
        self.turn += 1
        yield LlmResponse(content=types.Content(role="model", parts=[types.Part(text=text)]))


@dataclass
class Outcome:
    results: list[tuple[str, str]] = field(default_factory=list)  # (outcome, output) per execution
    artifacts: list[str] = field(default_factory=list)
    answer: str = ""


def block(code: str) -> str:
    return f"Let me compute it.\n```python\n{code}\n```"


async def ask(runner: InMemoryRunner, session_id: str, *codes: str) -> Outcome:
    runner.agent.model = ScriptedLlm(replies=[block(code) for code in codes])  # type: ignore[union-attr]
    outcome = Outcome()
    message = types.Content(role="user", parts=[types.Part(text="Use Python.")])
    async for event in runner.run_async(user_id="user", session_id=session_id, new_message=message):
        outcome.artifacts += list(event.actions.artifact_delta)
        for part in (event.content.parts or []) if event.content else []:
            if part.code_execution_result is not None:
                result = part.code_execution_result
                outcome.results.append((str(result.outcome.name if result.outcome else None), result.output or ""))
            elif part.text and not part.thought and "```" not in part.text:
                outcome.answer = part.text
    return outcome


def agent_runner(executor: PynoxCodeExecutor) -> InMemoryRunner:
    agent = LlmAgent(name="analyst", model=ScriptedLlm(), code_executor=executor)
    return InMemoryRunner(agent=agent, app_name="pynox")


async def new_session(runner: InMemoryRunner) -> str:
    return (await runner.session_service.create_session(app_name="pynox", user_id="user")).id


def run_in_sessions(executor: PynoxCodeExecutor, *conversations: tuple[int, tuple[str, ...]]) -> list[Outcome]:
    """Each conversation: (which ADK session, by number, the codes the model writes in one invocation)."""
    async def scenario() -> list[Outcome]:
        runner = agent_runner(executor)
        sessions: dict[int, str] = {}
        outcomes = []
        for number, codes in conversations:
            if number not in sessions:
                sessions[number] = await new_session(runner)
            outcomes.append(await ask(runner, sessions[number], *codes))
        await runner.close()
        return outcomes

    return run_async(scenario())


def test_each_block_is_a_fresh_process_unless_stateful(pool: Pool) -> None:
    (outcome,) = run_in_sessions(PynoxCodeExecutor(pool), (1, ("x = 41\nprint('set')", "print(x + 1)")))
    assert outcome.results[0] == ("OUTCOME_OK", "Code execution result:\nset\n\n")
    failed, output = outcome.results[1]
    assert failed == "OUTCOME_FAILED" and "NameError: name 'x' is not defined" in output
    assert outcome.answer == ANSWER


def test_stateful_keeps_state_within_an_adk_session_and_never_across(pool: Pool) -> None:
    executor = PynoxCodeExecutor(pool, stateful=True)
    try:
        first, later, other = run_in_sessions(executor, (1, ("x = 41",)),
                                              (1, ("import math\nprint(math.floor(x + 1.5))",)), (2, ("print(x)",)))
    finally:
        executor.close()
    assert first.results == [("OUTCOME_OK", "Code execution result:\n\n")]
    assert later.results == [("OUTCOME_OK", "Code execution result:\n42\n\n")]
    assert other.results[0][0] == "OUTCOME_FAILED" and "NameError: name 'x' is not defined" in other.results[0][1]


def test_a_denied_path_is_a_failed_execution_with_the_hint(pool: Pool) -> None:
    (outcome,) = run_in_sessions(PynoxCodeExecutor(pool), (1, ("print(open('/etc/passwd').read())", "print('after')")))
    (failed, denied), after = outcome.results
    assert failed == "OUTCOME_FAILED"
    assert "PermissionError: [Errno 13] Permission denied: '/etc/passwd'" in denied
    assert 'allow_read=["/etc/passwd"]' in denied and "root:" not in denied
    assert after == ("OUTCOME_OK", "Code execution result:\nafter\n\n") and outcome.answer == ANSWER


def test_figures_are_output_files_adk_saves_as_artifacts(pool: Pool) -> None:
    code = "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()\nprint('drawn')"
    (outcome,) = run_in_sessions(PynoxCodeExecutor(pool, memory="1g"), (1, (code,)))
    assert outcome.results == [("OUTCOME_OK", "Code execution result:\ndrawn\n\n\n\nSaved artifacts:\n`figure_1.png`")]
    assert outcome.artifacts == ["figure_1.png"]


def test_timeout_seconds_shortens_the_grant(pool: Pool) -> None:
    (outcome,) = run_in_sessions(PynoxCodeExecutor(pool, timeout_seconds=1, timeout="30s"),
                                 (1, ("import time\ntime.sleep(20)",)))
    failed, output = outcome.results[0]
    assert failed == "OUTCOME_FAILED" and "TimeoutError" in output


def test_optimize_data_file_is_refused() -> None:
    with pytest.raises(ValueError, match="optimize_data_file"):
        PynoxCodeExecutor(optimize_data_file=True)


def test_nothing_is_left_running_after_close() -> None:
    others = running_pools()
    with Pool(workers=1) as own:
        executor = PynoxCodeExecutor(own, stateful=True)
        outcome: Any = run_in_sessions(executor, (1, ("x = 1",)), (1, ("print(x)",)))
        assert outcome[1].results == [("OUTCOME_OK", "Code execution result:\n1\n\n")]
        executor.close()
        wait_for_idle(templates=1, ignore=others)
    wait_for_none(others)


def test_a_misspelt_grant_is_named_with_the_valid_ones() -> None:
    """As tests/test_grant_types.py checks of the adapters in the main environment; ADK's own fields pass."""
    with pytest.raises(TypeError, match=r"^PynoxCodeExecutor\(\) got an unknown grant 'allow_reed' \(did you mean "
                                        r"'allow_read'\?\)"):
        PynoxCodeExecutor(stateful=True, allow_reed=["data"])


# The model, scripted, as the doc block expects it (`CODE` is set before it).
MODEL = """\
from google.adk.models import BaseLlm, LlmResponse
from google.genai import types as genai_types


class Scripted(BaseLlm):
    model: str = "scripted"
    turn: int = 0

    async def generate_content_async(self, llm_request, stream=False):
        text = f"```python\\n{CODE}\\n```" if self.turn == 0 else "Done."
        self.turn += 1
        yield LlmResponse(content=genai_types.Content(role="model", parts=[genai_types.Part(text=text)]))


model = Scripted()
"""


def test_the_integrations_doc_block_runs(tmp_path: Path) -> None:
    """docs/integrations.md's block, run as a user would (a fresh interpreter, the default pool), the model scripted."""
    (block,) = python_blocks(section((ROOT / "docs" / "integrations.md").read_text(), "Google ADK"))
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "orders.csv").write_text("product,quantity\nlamp,2\ndesk,1\nlamp,4\n")
    others = running_pools()  # this module's pool among them: the block's own default pool must end
    out = run_script(f"CODE = {CODE!r}\n{MODEL}\n{block}", tmp_path, others)
    assert "3 orders" in out, out
