"""pynox-smolagents against the real pool: the ``run_python`` tool in a ``ToolCallingAgent``, and ``PynoxExecutor``
running a ``CodeAgent``'s steps in one session. A scripted ``Model`` stands in for the LLM: no network.

Process-level leftover checks live in ``test_smolagents_conformance.py``, beside the shared suite's helpers.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from smolagents import CodeAgent, Model, ToolCallingAgent, tool
from smolagents.memory import ActionStep
from smolagents.models import ChatMessage, ChatMessageToolCall, ChatMessageToolCallFunction, MessageRole
from smolagents.monitoring import LogLevel
from smolagents.utils import AgentToolExecutionError

import pynox
from pynox_smolagents import PynoxExecutor, PynoxTool, python_tool
from tests.harness.fixtures import shared_pool

pytestmark = pytest.mark.timeout(90)

ROOT = Path(__file__).resolve().parents[2]
QUIET = LogLevel.OFF


class ScriptedModel(Model):
    """Replies from a script, in order, and keeps every prompt it was given. A ``str`` reply is a ``CodeAgent``
    action (wrapped in its code tags); a ``dict`` is one tool call for a ``ToolCallingAgent``."""

    def __init__(self, replies: Sequence[str | dict[str, Any]]) -> None:
        super().__init__(model_id="scripted")
        self.replies = list(replies)
        self.prompts: list[list[Any]] = []

    def generate(self, messages: list[Any], stop_sequences: list[str] | None = None,
                 response_format: dict[str, str] | None = None, tools_to_call_from: list[Any] | None = None,
                 **kwargs: Any) -> ChatMessage:
        self.prompts.append(messages)
        reply = self.replies.pop(0)
        if isinstance(reply, str):
            return ChatMessage(role=MessageRole.ASSISTANT, content=f"Thought: next step.\n<code>\n{reply}\n</code>")
        call = ChatMessageToolCall(function=ChatMessageToolCallFunction(name=reply["name"], arguments=reply["args"]),
                                   id=f"call_{len(self.prompts)}", type="function")
        return ChatMessage(role=MessageRole.ASSISTANT, content="", tool_calls=[call])

    def last_prompt_text(self) -> str:
        return "\n".join(str(message.content if hasattr(message, "content") else message)
                         for message in self.prompts[-1])


HOST_THREADS: list[str] = []
CATALOG = {"lamp": 25.0, "desk": 180.0}


@tool
def price(product: str) -> float:
    """The price of one product, in euros.

    Args:
        product: The product's name.
    """
    HOST_THREADS.append(threading.current_thread().name)
    if product not in CATALOG:
        raise KeyError(f"no product named {product!r}")
    return CATALOG[product]


pool = shared_pool(workers=2)


def action_steps(agent: Any) -> list[ActionStep]:
    return [step for step in agent.memory.steps if isinstance(step, ActionStep)]


# -- the tool ---------------------------------------------------------------------------------------------------

def test_tool_is_run_python_with_the_core_docstring(pool: pynox.Pool, tmp_path: Path) -> None:
    made = python_tool(pool, allow_write=[tmp_path], timeout="5s")
    assert isinstance(made, PynoxTool)
    assert made.name == "run_python" and made.output_type == "string"
    assert list(made.inputs) == ["code"] and made.inputs["code"]["type"] == "string"
    # The same description smolagents' own @tool gives the core function: one text, whichever path.
    same = tool(pool.tool(allow_write=[tmp_path], timeout="5s"))
    assert made.description == same.description and made.inputs == same.inputs
    assert made.description.startswith("Run Python code in an isolated sandbox")
    assert f"Write files: {tmp_path}." in made.description and "5s of time" in made.description
    assert "Args:" not in made.description


def test_bad_grant_raises_before_any_agent_runs(pool: pynox.Pool) -> None:
    with pytest.raises(pynox.ConfigError, match="duration"):
        python_tool(pool, timeout="soon")
    with pytest.raises(pynox.ConfigError, match="duration"):
        PynoxExecutor(pool, timeout="soon")


def test_tool_calling_agent_define_use_raise_retry_answer(pool: pynox.Pool) -> None:
    def run(code: str) -> dict[str, Any]:
        return {"name": "run_python", "args": {"code": code}}

    model = ScriptedModel([
        run("total = 40\nprint('total is', total)"),
        run("from pynox_host import price\nprint(price('lamp') + total)"),
        run("print(total / 0)"),
        run("print(f'{(price(\"desk\") + total) / 2:.1f}')"),
        {"name": "final_answer", "args": {"answer": "110.0"}},
    ])
    run_python = python_tool(pool, session=True, functions={"price": price})
    agent = ToolCallingAgent(tools=[run_python], model=model, verbosity_level=QUIET)
    assert agent.run("What is half of the desk price plus 40?") == "110.0"

    steps = action_steps(agent)
    assert steps[0].observations == "total is 40"
    assert steps[1].observations == "65.0"  # a host function and the first call's variable
    # A failed run is the step's error, as for smolagents' own PythonInterpreterTool: its accounting sees it.
    assert steps[2].observations is None and isinstance(steps[2].error, AgentToolExecutionError)
    assert "InterpreterError: ZeroDivisionError: division by zero (agent.py:1)" in str(steps[2].error)
    assert [step.error is None for step in steps] == [True, True, False, True, True]
    assert steps[3].observations == "110.0"  # the retry, in the same process: `price` and `total` are still there
    # The model read the error before it retried.
    assert "ZeroDivisionError: division by zero" in "\n".join(str(p) for p in model.prompts[3])


def test_tool_calling_agent_reads_a_denied_path_as_its_step_error(pool: pynox.Pool) -> None:
    model = ScriptedModel([
        {"name": "run_python", "args": {"code": "print(open('/etc/passwd').read())"}},
        {"name": "final_answer", "args": {"answer": "denied"}},
    ])
    agent = ToolCallingAgent(tools=[python_tool(pool)], model=model, verbosity_level=QUIET)
    assert agent.run("Read /etc/passwd") == "denied"
    error = str(action_steps(agent)[0].error)
    assert "InterpreterError: PermissionError" in error and 'allow_read=["/etc/passwd"]' in error
    assert "root:" not in error


# -- the executor -----------------------------------------------------------------------------------------------

def test_code_agent_steps_share_a_session_call_host_tools_and_answer(pool: pynox.Pool) -> None:
    HOST_THREADS.clear()
    model = ScriptedModel([
        "total = 40\nprint('defined total')",
        "p = price('lamp')\nprint('lamp plus total:', p + total)\np * 2",
        "raise ValueError('not yet')",
        "print('retrying with', total, p)\nfinal_answer(p + total)",
    ])
    executor = PynoxExecutor(pool)
    sessions_before = pool.stats()["sessions_active"]
    with CodeAgent(tools=[price], model=model, executor=executor, verbosity_level=QUIET) as agent:
        assert agent.run("What do a lamp and 40 euros make?") == 65.0
        steps = action_steps(agent)
        assert [step.is_final_answer for step in steps] == [False, False, False, True]
        assert steps[0].observations == "Execution logs:\ndefined total\nLast output from code snippet:\nNone"
        # The tool ran in this process, on the pool's host-function threads, and the trailing value came back.
        assert steps[1].observations == "Execution logs:\nlamp plus total: 65.0\nLast output from code snippet:\n50.0"
        assert steps[1].action_output == 50.0 and HOST_THREADS and HOST_THREADS[0].startswith("pynox-host")
        # The error reached the model as smolagents' execution error, with the model's own line; it retried.
        assert steps[2].error is not None
        assert "Code execution failed: ValueError: not yet (agent.py:1)" in str(steps[2].error)
        assert "ValueError: not yet" in "\n".join(str(p) for p in model.prompts[3])
        assert steps[3].observations is not None and "retrying with 40 25.0" in steps[3].observations
        assert pool.stats()["sessions_active"] == sessions_before + 1
    # `with CodeAgent` called cleanup(): the session's process is gone.
    assert pool.stats()["sessions_active"] == sessions_before


def test_prints_before_an_error_reach_the_model(pool: pynox.Pool) -> None:
    model = ScriptedModel(["print('partial result: 7')\nint('x')", "final_answer('done')"])
    with CodeAgent(tools=[], model=model, executor=PynoxExecutor(pool), verbosity_level=QUIET) as agent:
        assert agent.run("task") == "done"
        failed = action_steps(agent)[0]
    assert failed.observations == "Execution logs:\npartial result: 7\n"
    assert "ValueError: invalid literal for int() with base 10: 'x' (agent.py:2)" in str(failed.error)


def test_host_tool_failure_is_a_host_error_in_the_code(pool: pynox.Pool) -> None:
    model = ScriptedModel([
        "try:\n    price('sofa')\nexcept Exception as error:\n    print(type(error).__name__, error)",
        "final_answer(price('desk'))",
    ])
    with CodeAgent(tools=[price], model=model, executor=PynoxExecutor(pool), verbosity_level=QUIET) as agent:
        assert agent.run("task") == 180.0
        assert "HostError KeyError: \"no product named 'sofa'\"" in (action_steps(agent)[0].observations or "")


def test_final_answer_passes_through_except_exception(pool: pynox.Pool) -> None:
    model = ScriptedModel(["try:\n    final_answer({'n': 3, 'items': ['a']})\nexcept Exception:\n    print('caught')"])
    with CodeAgent(tools=[], model=model, executor=PynoxExecutor(pool), verbosity_level=QUIET) as agent:
        assert agent.run("task") == {"n": 3, "items": ["a"]}
        assert action_steps(agent)[0].observations == "Execution logs:\nLast output from code snippet:\n" \
            "{'n': 3, 'items': ['a']}"


def test_the_first_final_answer_ends_the_step_whatever_the_code_does(pool: pynox.Pool) -> None:
    """As smolagents' local executor: code that catches the end of the step (or calls the host function
    directly) runs on, but reaches no tool and cannot change the answer."""
    before = len(HOST_THREADS)
    model = ScriptedModel(["try:\n    final_answer('first')\nexcept BaseException:\n    pass\n"
                           "import pynox_host\ntry:\n    price('lamp')\n"
                           "except Exception as e:\n    print('refused:', e)\n"
                           "try:\n    pynox_host.final_answer('second')\n"
                           "except Exception as e:\n    print('refused:', e)"])
    with CodeAgent(tools=[price], model=model, executor=PynoxExecutor(pool), verbosity_level=QUIET) as agent:
        assert agent.run("task") == "first"
        logs = agent.python_executor.state["_print_outputs"]
    assert len(HOST_THREADS) == before, "a tool ran after the step's final answer"
    assert logs.count("this step already gave its final answer") == 2, logs


def test_step_values_are_not_kept_after_the_step(pool: pynox.Pool) -> None:
    executor = PynoxExecutor(pool)
    model = ScriptedModel(["import pynox_host\nfor _ in range(20):\n    pynox_host.pynox_step_value('x' * 500_000)\n"
                           "len('done')", "final_answer('ok')"])
    with CodeAgent(tools=[], model=model, executor=executor, verbosity_level=QUIET) as agent:
        assert agent.run("task") == "ok"
        assert executor._value == [] and executor._final == []  # nothing held between steps


def test_managed_agent_is_called_by_its_name_from_the_code(pool: pynox.Pool) -> None:
    helper_model = ScriptedModel([{"name": "final_answer", "args": {"answer": "the lamp costs 25 euros"}}])
    helper = ToolCallingAgent(tools=[], model=helper_model, name="researcher",
                              description="Finds prices. Give it a task in plain words.", verbosity_level=QUIET)
    model = ScriptedModel([
        "report = researcher(task='find the lamp price')\nprint(report)",
        "final_answer(len(report) > 0)",
    ])
    with CodeAgent(tools=[], model=model, managed_agents=[helper], executor=PynoxExecutor(pool),
                   verbosity_level=QUIET) as agent:
        assert agent.run("How much is the lamp?") is True
        assert "the lamp costs 25 euros" in (action_steps(agent)[0].observations or "")
    assert "find the lamp price" in str(helper_model.prompts[0])


def test_variables_arrive_as_globals_and_an_uncrossable_one_is_a_clear_error(pool: pynox.Pool) -> None:
    model = ScriptedModel(["final_answer(sum(readings) * scale['factor'])"])
    with CodeAgent(tools=[], model=model, executor=PynoxExecutor(pool), verbosity_level=QUIET) as agent:
        assert agent.run("sum them", additional_args={"readings": [1, 2, 3], "scale": {"factor": 10}}) == 60

    agent = CodeAgent(tools=[], model=ScriptedModel([]), executor=PynoxExecutor(pool), verbosity_level=QUIET)
    with pytest.raises(TypeError, match=r"cannot send these variables into the sandbox: 'handle' \(object\)\. "
                                        "It sends JSON values, tuples"):
        agent.run("task", additional_args={"handle": object()})
    agent.cleanup()


def test_timeout_ends_the_session_and_the_next_step_has_tools_and_variables(pool: pynox.Pool) -> None:
    model = ScriptedModel([
        "mine = 1",
        "while True:\n    pass",
        "print('mine' in globals(), given, price('lamp'))\nfinal_answer('ok')",
    ])
    executor = PynoxExecutor(pool, timeout="1s")
    with CodeAgent(tools=[price], model=model, executor=executor, verbosity_level=QUIET) as agent:
        assert agent.run("task", additional_args={"given": "g"}) == "ok"
        steps = action_steps(agent)
    error = str(steps[1].error)
    assert "TimeoutError" in error and "session ended" in error
    # A fresh process: the model's own variable is gone; the agent's variables and tools are bound again.
    assert steps[2].observations is not None and "False g 25.0" in steps[2].observations


def test_denied_path_and_syntax_error_are_retryable_errors(pool: pynox.Pool) -> None:
    model = ScriptedModel(["data = open('/etc/shadow').read()", "x = (1,", "final_answer('gave up')"])
    with CodeAgent(tools=[], model=model, executor=PynoxExecutor(pool), verbosity_level=QUIET) as agent:
        assert agent.run("task") == "gave up"
        denied, syntax = (str(step.error) for step in action_steps(agent)[:2])
    assert "PermissionError" in denied and 'allow_read=["/etc/shadow"]' in denied
    assert "SyntaxError" in syntax and "agent.py:1" in syntax


def test_trailing_expression_keeps_line_numbers_and_odd_text(pool: pynox.Pool) -> None:
    model = ScriptedModel([
        "word = 'naïve ☃'\n(word\n + '!')  # a comment",
        "x = 1\nx +",  # a syntax error is reported as it is, at the model's line
        "[1, 2][5]",
        "final_answer(word)",
    ])
    with CodeAgent(tools=[], model=model, executor=PynoxExecutor(pool), verbosity_level=QUIET) as agent:
        assert agent.run("task") == "naïve ☃"
        steps = action_steps(agent)
    assert steps[0].action_output == "naïve ☃!"
    assert "SyntaxError" in str(steps[1].error) and "agent.py:2" in str(steps[1].error)
    assert "IndexError: list index out of range (agent.py:1)" in str(steps[2].error)


def test_an_error_in_a_trailing_expression_quotes_the_models_own_line(pool: pynox.Pool) -> None:
    model = ScriptedModel(["print(spent)", "total = 1\n(total\n + missing)", "final_answer('ok')"])
    with CodeAgent(tools=[], model=model, executor=PynoxExecutor(pool), verbosity_level=QUIET) as agent:
        assert agent.run("task") == "ok"
        first, second = (str(step.error) for step in action_steps(agent)[:2])
    assert "NameError: name 'spent' is not defined (agent.py:1)\n    print(spent)" in first
    assert "NameError: name 'missing' is not defined (agent.py:" in second
    for error in (first, second):
        assert "__pynox_emit__" not in error, error


def test_profile_from_the_pool_config(tmp_path: Path) -> None:
    config = tmp_path / "pynox.toml"
    out = tmp_path / "out"
    out.mkdir()
    config.write_text(f'[profiles.analysis]\nallow_write = ["{out}"]\ntimeout = "5s"\n')
    with pynox.Pool(workers=1, config=config) as own:
        model = ScriptedModel([f"open({str(out / 'r.txt')!r}, 'w').write('x')\nfinal_answer('written')"])
        with CodeAgent(tools=[], model=model, executor=PynoxExecutor(own, profile="analysis"),
                       verbosity_level=QUIET) as agent:
            assert agent.run("task") == "written"
        assert (out / "r.txt").read_text() == "x"
        assert "Write files: " + str(out) in python_tool(own, profile="analysis").description


def test_example_runs_offline() -> None:
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "smolagents_agent.py")], capture_output=True,
                          text=True, timeout=120, check=False, env={**os.environ, "PYTHONWARNINGS": "error"})
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "tool agent: 45" in lines
    assert "executor agent: 174.6 EUR" in lines


def run_readme_example(readme: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """The README's first Python block, run as a script as a reader would paste it."""
    block = readme.read_text().split("```python\n", 1)[1].split("```", 1)[0]
    script = tmp_path / "readme_example.py"
    script.write_text(block)
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, check=False,
                          cwd=tmp_path, env={**os.environ, "PYTHONWARNINGS": "error"})


def test_readme_example_runs_offline(tmp_path: Path) -> None:
    done = run_readme_example(ROOT / "packages" / "pynox-smolagents" / "README.md", tmp_path)
    assert done.returncode == 0, done.stderr


# The blocks of docs/integrations.md's smolagents section use a `model` they do not define: each runs here, as its
# own program (as tests/test_docs.py runs the others), with this scripted model in front of it.
DOC_MODEL = '''
from smolagents import Model
from smolagents.models import ChatMessage, ChatMessageToolCall, ChatMessageToolCallFunction, MessageRole


class ScriptedModel(Model):
    def __init__(self, replies):
        super().__init__(model_id="scripted")
        self.replies = replies

    def generate(self, messages, stop_sequences=None, response_format=None, tools_to_call_from=None, **kwargs):
        reply = self.replies.pop(0)
        if isinstance(reply, str):
            return ChatMessage(role=MessageRole.ASSISTANT, content=f"<code>\\n{reply}\\n</code>")
        call = ChatMessageToolCall(function=ChatMessageToolCallFunction(name=reply[0], arguments=reply[1]),
                                   id="call", type="function")
        return ChatMessage(role=MessageRole.ASSISTANT, content="", tool_calls=[call])


COUNT = "import csv\\nprint(len(list(csv.DictReader(open('data/orders.csv')))))"
model = ScriptedModel(REPLIES)
'''
DOC_REPLIES = {
    "PynoxCodeAgent": '["n = len(open(\'data/orders.csv\').read().splitlines()) - 1", "final_answer(n)"]',
    "ToolCallingAgent": '[("run_python", {"code": COUNT}), ("final_answer", {"answer": "3 orders"})]',
}


def smolagents_doc_blocks() -> list[str]:
    text = (ROOT / "docs" / "integrations.md").read_text()
    section = text.split("\n## smolagents\n", 1)[1].split("\n## ", 1)[0]
    return [block.split("```", 1)[0] for block in section.split("<!-- run-by: tests/adapters/test_smolagents.py -->"
                                                                  "\n```python\n")[1:]]


def test_integrations_doc_blocks_run(tmp_path: Path) -> None:
    blocks = smolagents_doc_blocks()
    assert [next(kind for kind in DOC_REPLIES if f"import {kind}" in block) for block in blocks] == \
        ["PynoxCodeAgent", "ToolCallingAgent"]
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "orders.csv").write_text("product,amount\nlamp,25.00\ndesk,180.00\nlamp,12.50\n")
    for block in blocks:
        kind = next(kind for kind in DOC_REPLIES if f"import {kind}" in block)
        script = tmp_path / "example.py"
        script.write_text(DOC_MODEL.replace("REPLIES", DOC_REPLIES[kind]) + block)
        done = subprocess.run([sys.executable, "-W", "error", str(script)], cwd=tmp_path, capture_output=True,
                              text=True, timeout=100, check=False)
        assert done.returncode == 0, done.stdout + done.stderr
        assert done.stdout.rstrip().splitlines()[-1] in ("3", "3 orders")


def test_a_code_agent_with_allow_hosts_reaches_the_listed_host_only(pool: pynox.Pool) -> None:
    import socket

    with socket.create_server(("127.0.0.1", 0)) as listed, socket.create_server(("127.0.0.1", 0)) as other:
        ports = listed.getsockname()[1], other.getsockname()[1]
        code = (f"import socket\nfor port in {ports}:\n    try:\n"
                "        socket.create_connection(('127.0.0.1', port), timeout=3).close(); print('reached', port)\n"
                "    except OSError as exc:\n        print('refused', port, type(exc).__name__)")
        model = ScriptedModel([code, "final_answer('done')"])
        executor = PynoxExecutor(pool, allow_hosts=[f"127.0.0.1:{ports[0]}"])
        with CodeAgent(tools=[], model=model, executor=executor, verbosity_level=QUIET) as agent:
            assert agent.run("task") == "done"
            observed = action_steps(agent)[0].observations or ""
        assert f"reached {ports[0]}" in observed and f"refused {ports[1]} PermissionError" in observed, observed
        other.settimeout(0.3)
        with pytest.raises(TimeoutError):
            other.accept()
