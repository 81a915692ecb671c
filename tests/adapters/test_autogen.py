"""AutoGen: ``PynoxCodeExecutor`` driven by ``CodeExecutorAgent`` in a ``RoundRobinGroupChat``, the coder a scripted
model (autogen-ext's ``ReplayChatCompletionClient``).

Runs in its own environment (``requirements-separate.txt``; marked ``separate_env``, run by ``.ci/run``):
autogen-core requires a protobuf the workspace's pins exclude.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from autogen_agentchat.agents import ApprovalRequest, ApprovalResponse, AssistantAgent, CodeExecutorAgent
from autogen_agentchat.conditions import TextMentionTermination
from autogen_agentchat.messages import TextMessage
from autogen_agentchat.teams import RoundRobinGroupChat
from autogen_core import CancellationToken
from autogen_core.code_executor import CodeBlock
from autogen_ext.models.replay import ReplayChatCompletionClient

from pynox import Pool
from pynox_autogen import PynoxCodeExecutor, PynoxCodeResult

from .conftest import run_async
from .procs import running_pools, wait_for_idle, wait_for_none
from .test_docs_and_examples import CODE, ROOT, python_blocks, run_script, section

pytestmark = [pytest.mark.separate_env, pytest.mark.timeout(90)]


def approve(request: ApprovalRequest) -> ApprovalResponse:
    """Every block runs: the sandbox, not a reviewer, decides what it may touch."""
    return ApprovalResponse(approved=True, reason="confined by Pynox")


def executor_agent(executor: PynoxCodeExecutor) -> CodeExecutorAgent:
    return CodeExecutorAgent("executor", code_executor=executor, approval_func=approve)


def team_run(executor: PynoxCodeExecutor, *replies: str) -> list[str]:
    """A coder (scripted: ``replies``, then TERMINATE) and the executor taking turns; what the executor said."""
    coder = AssistantAgent("coder", model_client=ReplayChatCompletionClient([*replies, "TERMINATE"]))
    team = RoundRobinGroupChat([coder, executor_agent(executor)],
                               termination_condition=TextMentionTermination("TERMINATE"))
    result = run_async(team.run(task="Compute with Python."))
    said = [message for message in result.messages if message.source == "executor"]
    assert all(isinstance(message, TextMessage) for message in said)
    return [message.content.strip() for message in said if isinstance(message, TextMessage)]


def block(code: str, language: str = "python") -> str:
    return f"Here it is:\n```{language}\n{code}\n```"


def test_a_team_keeps_state_across_calls_and_refuses_other_languages(pool: Pool) -> None:
    async def scenario() -> list[str]:
        async with PynoxCodeExecutor(pool) as executor:
            return await asyncio.to_thread(team_run, executor, block("x = 41\nprint('set')"),
                                           block("import math\nprint(math.floor(x + 1.5))"), block("ls /", "sh"))

    said = run_async(scenario())
    assert said[:2] == ["set", "42"]
    assert said[2].startswith("The script ran, then exited with an error (POSIX exit code: 1)")
    assert "unknown language sh: PynoxCodeExecutor runs Python code blocks only" in said[2]


def test_a_denied_path_is_a_failed_block_with_the_hint(pool: Pool) -> None:
    async def scenario() -> list[str]:
        async with PynoxCodeExecutor(pool) as executor:
            return await asyncio.to_thread(team_run, executor, block("print(open('/etc/passwd').read())"),
                                           block("print('after')"))

    denied, after = run_async(scenario())
    assert denied.startswith("The script ran, then exited with an error (POSIX exit code: 1)")
    assert "PermissionError: [Errno 13] Permission denied: '/etc/passwd'" in denied
    assert 'allow_read=["/etc/passwd"]' in denied and "root:" not in denied
    assert after == "after"


def test_blocks_of_one_message_run_in_order_and_stop_at_the_first_failure(pool: Pool) -> None:
    async def scenario() -> tuple[int, str]:
        async with PynoxCodeExecutor(pool) as executor:
            result = await executor.execute_code_blocks(
                [CodeBlock("print(1)", "python"), CodeBlock("1 / 0", "python"), CodeBlock("print(3)", "python")],
                CancellationToken())
            return result.exit_code, result.output

    exit_code, output = run_async(scenario())
    assert exit_code == 1 and output.startswith("1\n") and "ZeroDivisionError" in output and "3" not in output


def test_a_timeout_is_exit_124(pool: Pool) -> None:
    async def scenario() -> tuple[int, str]:
        async with PynoxCodeExecutor(pool, timeout="1s") as executor:
            result = await executor.execute_code_blocks([CodeBlock("while True: pass", "python")],
                                                        CancellationToken())
            return result.exit_code, result.output

    exit_code, output = run_async(scenario())
    assert exit_code == 124 and "TimeoutError" in output


def test_cancelling_the_token_interrupts_the_code_and_the_session_keeps_its_variables(pool: Pool) -> None:
    async def scenario() -> tuple[float, str]:
        async with PynoxCodeExecutor(pool) as executor:
            agent = executor_agent(executor)
            await agent.on_messages([TextMessage(content=block("x = 1"), source="coder")], CancellationToken())
            token = CancellationToken()
            asyncio.get_running_loop().call_later(0.5, token.cancel)
            started = time.monotonic()
            with pytest.raises(asyncio.CancelledError):
                await agent.on_messages([TextMessage(content=block("import time\ntime.sleep(30)"), source="coder")],
                                        token)
            stopped = time.monotonic() - started
            response = await agent.on_messages([TextMessage(content=block("print(x + 1)"), source="coder")],
                                               CancellationToken())
            return stopped, str(response.chat_message.to_text())

    stopped, after = run_async(scenario())
    assert stopped < 10, stopped
    assert after.strip() == "2", after


STUBBORN = "import time\nwhile True:\n    try:\n        time.sleep(30)\n    except KeyboardInterrupt:\n        pass"


def test_a_block_that_ignores_the_interrupt_is_killed_and_the_next_call_says_so(pool: Pool) -> None:
    others = running_pools()

    async def scenario() -> str:
        async with PynoxCodeExecutor(pool) as executor:
            agent = executor_agent(executor)
            await agent.on_messages([TextMessage(content=block("x = 1"), source="coder")], CancellationToken())
            token = CancellationToken()
            asyncio.get_running_loop().call_later(0.5, token.cancel)
            with pytest.raises(asyncio.CancelledError):
                await agent.on_messages([TextMessage(content=block(STUBBORN), source="coder")], token)
            wait_for_idle(templates=1, ignore=others)  # past the grace the step is killed, its process with it
            response = await agent.on_messages([TextMessage(content=block("print(x)"), source="coder")],
                                               CancellationToken())
            return str(response.chat_message.to_text())

    after = run_async(scenario())
    assert "NameError: name 'x' is not defined" in after
    assert "Variables, imports and functions defined in earlier calls are gone" in after, after


def test_restart_gives_a_fresh_session_and_execute_needs_a_start(pool: Pool) -> None:
    async def scenario() -> str:
        executor = PynoxCodeExecutor(pool)
        with pytest.raises(RuntimeError, match="must be started"):
            await executor.execute_code_blocks([CodeBlock("print(1)", "python")], CancellationToken())
        async with executor:
            await executor.execute_code_blocks([CodeBlock("x = 1", "python")], CancellationToken())
            await executor.restart()
            result = await executor.execute_code_blocks([CodeBlock("print(x)", "python")], CancellationToken())
        return result.output

    assert "NameError: name 'x' is not defined" in run_async(scenario())


def test_nothing_is_left_running_after_stop() -> None:
    others = running_pools()

    async def scenario() -> None:
        with Pool(workers=1) as own:
            async with PynoxCodeExecutor(own) as executor:
                await executor.execute_code_blocks([CodeBlock("x = 1", "python")], CancellationToken())
            wait_for_idle(templates=1, ignore=others)

    run_async(scenario())
    wait_for_none(others)


def test_the_executor_is_a_component_saved_with_its_grants() -> None:
    executor = PynoxCodeExecutor(allow_read=["/usr/share"], timeout="7s")
    saved = executor.dump_component()
    assert saved.provider == "pynox_autogen.PynoxCodeExecutor"
    loaded = PynoxCodeExecutor.load_component(saved)
    assert loaded.runner.grants == executor.runner.grants
    assert loaded.runner.grants.read == ("/usr/share",) and loaded.runner.grants.timeout == 7


def test_figures_are_saved_as_output_files(pool: Pool, tmp_path: Path) -> None:
    code = "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()\nprint('drawn')"

    async def scenario() -> PynoxCodeResult:
        async with PynoxCodeExecutor(pool, memory="1g", output_dir=tmp_path) as executor:
            return await executor.execute_code_blocks([CodeBlock(code, "python")], CancellationToken())

    result = run_async(scenario())
    assert result.exit_code == 0 and result.output.startswith("drawn\n[1 image]")
    (saved,) = result.output_files
    assert saved.parent == tmp_path and saved.read_bytes().startswith(b"\x89PNG")


def test_a_misspelt_grant_is_named_with_the_valid_ones() -> None:
    """As tests/test_grant_types.py checks of the adapters in the main environment."""
    with pytest.raises(TypeError, match=r"^PynoxCodeExecutor\(\) got an unknown grant 'allow_reed' \(did you mean "
                                        r"'allow_read'\?\)"):
        PynoxCodeExecutor(allow_reed=["data"])  # type: ignore[call-arg]


# The model, scripted, as the doc block expects it (`CODE` is set before it).
MODEL_CLIENT = """\
from autogen_ext.models.replay import ReplayChatCompletionClient

model_client = ReplayChatCompletionClient([f"```python\\n{CODE}\\n```", "TERMINATE"])
"""


def test_the_integrations_doc_block_runs(tmp_path: Path) -> None:
    """docs/integrations.md's block, run as a user would (a fresh interpreter, the default pool), the model scripted."""
    (block,) = python_blocks(section((ROOT / "docs" / "integrations.md").read_text(), "AutoGen"))
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "orders.csv").write_text("product,quantity\nlamp,2\ndesk,1\nlamp,4\n")
    others = running_pools()  # this module's pool among them: the block's own default pool must end
    out = run_script(f"CODE = {CODE!r}\n{MODEL_CLIENT}\n{block}", tmp_path, others)
    assert "3 orders" in out, out


def test_cancelling_a_teams_run_kills_the_running_block(pool: Pool) -> None:
    """The stop button of docs/use-cases.md: the token given to ``team.run`` reaches the block that runs."""
    others = running_pools()

    async def scenario() -> float:
        async with PynoxCodeExecutor(pool) as executor:
            coder = AssistantAgent("coder", model_client=ReplayChatCompletionClient(
                [block("import time\ntime.sleep(30)"), "TERMINATE"]))
            team = RoundRobinGroupChat([coder, executor_agent(executor)],
                                       termination_condition=TextMentionTermination("TERMINATE"))
            stop_button = CancellationToken()
            asyncio.get_running_loop().call_later(1.0, stop_button.cancel)
            started = time.monotonic()
            with pytest.raises(asyncio.CancelledError):
                await team.run(task="Compute with Python.", cancellation_token=stop_button)
            stopped = time.monotonic() - started
            wait_for_idle(templates=1, ignore=others)  # the sleeping job is gone
            return stopped

    assert run_async(scenario()) < 10
