"""The shared conformance suite (``test_conformance.py``), run for smolagents' ways of giving an agent ``run_python``.

The suite's test functions are imported as they are and parametrised here with smolagents cases, driven by a
scripted ``ToolCallingAgent``: the same checks, the same fixtures, one more framework. ``PynoxExecutor`` is not
a tool, so it gets the suite's leftover check on its own.
"""

from __future__ import annotations

from typing import Any

import pytest
import smolagents
from smolagents.memory import ActionStep
from smolagents.models import (
    ChatMessage,
    ChatMessageToolCall,
    ChatMessageToolCallFunction,
    MessageRole,
    get_tool_json_schema,
)
from smolagents.monitoring import LogLevel

import pynox
from pynox_smolagents import PynoxExecutor, python_tool

from .cases import Case
from .procs import running_pools, wait_for_idle, wait_for_none
from .scripted import ANSWER, Call, ToolSeen, Transcript
from .test_conformance import (  # noqa: F401  (collected here, with this module's cases)
    test_a_denied_path_is_text_with_the_hint_and_the_run_goes_on,
    test_a_host_function_is_listed_and_callable,
    test_a_session_keeps_state_between_calls,
    test_each_call_is_a_fresh_process_without_a_session,
    test_nothing_is_left_running_after_the_agent_finishes,
    test_the_model_sees_run_python_with_the_docstring_and_one_code_parameter,
)
from .test_smolagents import QUIET, ScriptedModel, price


class ScriptedToolCallingModel(smolagents.Model):
    """Makes ``calls`` one per step, then answers through ``final_answer`` (smolagents' way to end a run)."""

    def __init__(self, calls: list[Call], transcript: Transcript) -> None:
        super().__init__(model_id="scripted")
        self.calls = calls
        self.transcript = transcript
        self.turn = 0

    def generate(self, messages: list[Any], stop_sequences: list[str] | None = None,
                 response_format: dict[str, str] | None = None, tools_to_call_from: list[Any] | None = None,
                 **kwargs: Any) -> ChatMessage:
        # final_answer is how every smolagents agent answers: the others' text reply. The suite counts the rest.
        schemas = [get_tool_json_schema(tool)["function"] for tool in tools_to_call_from or ()]
        self.transcript.tools = [ToolSeen(s["name"], s["description"], s["parameters"]) for s in schemas
                                 if s["name"] != "final_answer"]
        name, args = self.calls[self.turn] if self.turn < len(self.calls) else ("final_answer", {"answer": ANSWER})
        self.turn += 1
        call = ChatMessageToolCall(function=ChatMessageToolCallFunction(name=name, arguments=args),
                                   id=f"call-{self.turn}", type="function")
        return ChatMessage(role=MessageRole.ASSISTANT, content="", tool_calls=[call])


def run_smolagents(agent_kwargs: dict[str, Any], calls: list[Call]) -> Transcript:
    transcript = Transcript()
    agent = smolagents.ToolCallingAgent(model=ScriptedToolCallingModel(calls, transcript),
                                        verbosity_level=LogLevel.OFF, **agent_kwargs)
    transcript.answer = str(agent.run("Use the Python tool."))
    steps = [step for step in agent.memory.steps if isinstance(step, ActionStep)]
    transcript.results = [step.observations or tool_error_text(step) for step in steps if not step.is_final_answer]
    return transcript


def tool_error_text(step: ActionStep) -> str:
    """A failed run is the step's error, which smolagents words "Error executing tool 'run_python' with arguments
    {...}: InterpreterError: <text>\nPlease try again or use another tool": the suite compares <text>."""
    if step.error is None:
        return ""
    text = str(step.error).split(": InterpreterError: ", 1)[1]
    return text.removesuffix("\nPlease try again or use another tool")


SMOLAGENTS_CASES = [
    Case("smolagents/python_tool", lambda pool, **o: {"tools": [python_tool(pool, **o)]}, run_smolagents,
         session_ends_with_run=False),
    # The spec's line: smolagents.tool(pynox.tool(...)).
    Case("smolagents/tool(pynox.tool)", lambda pool, **o: {"tools": [smolagents.tool(pool.tool(**o))]},
         run_smolagents, session_ends_with_run=False),
]

pytestmark = pytest.mark.timeout(60)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "case" in metafunc.fixturenames:
        metafunc.parametrize("case", SMOLAGENTS_CASES, ids=[case.id for case in SMOLAGENTS_CASES])


def test_nothing_is_left_running_after_the_code_agent_finishes() -> None:
    others = running_pools()  # the module's pool, whose tool-long sessions live until it closes
    with pynox.Pool(workers=1) as own:
        wait_for_idle(templates=1, ignore=others)
        model = ScriptedModel(["x = price('lamp')", "import time\ntime.sleep(0.2)", "final_answer(x)"])
        with smolagents.CodeAgent(tools=[price], model=model, executor=PynoxExecutor(own),
                                  verbosity_level=QUIET) as agent:
            assert agent.run("task") == 25.0
            with pytest.raises(AssertionError, match="still running"):  # the session's own template and process
                wait_for_idle(templates=1, ignore=others, deadline=0.5)
        wait_for_idle(templates=1, ignore=others)  # cleanup() ended them
    wait_for_none(others)
