"""pynox-pydantic-ai as pydantic-ai's own tools behave: failed parts, RunContext and async host
functions, Tool objects, images as BinaryContent, the permissions said once, the spec's one-liner.

Every agent here runs on pydantic-ai's own test doubles (FunctionModel, TestModel) against a real pool.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
from pydantic_ai import Agent, BinaryContent, RunContext, Tool
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

import pynox
from pynox import Pool
from pynox_pydantic_ai import PynoxCapability, PynoxToolset
from tests.harness.fixtures import shared_pool

from .scripted import code_calls, run_pydantic_ai
from .test_docs_and_examples import run_script

pytestmark = pytest.mark.timeout(90)


pool = shared_pool(workers=2)


def _returns(result: object) -> list[ToolReturnPart]:
    return [part for message in result.all_messages()  # type: ignore[attr-defined]
            for part in message.parts if isinstance(part, ToolReturnPart)]


@pytest.mark.parametrize(("code", "grants", "expected"), [
    ("print('fine')", {}, "success"),
    ("raise KeyError('k')", {}, "failed"),
    ("open('/etc/passwd').read()", {}, "failed"),
    ("import time\ntime.sleep(5)", {"timeout": "300ms"}, "failed"),
    ("import sys\nsys.exit(3)", {}, "failed"),
    ("from pynox_host import refuse\nrefuse()", {}, "failed"),
])
def test_each_failure_class_is_a_failed_part_and_a_success_is_not(
        pool: Pool, code: str, grants: dict[str, object], expected: str) -> None:
    def refuse() -> None:
        raise pynox.HostError("not allowed")

    transcript = run_pydantic_ai({"toolsets": [PynoxToolset(pool, functions={"refuse": refuse}, **grants)]},
                                 code_calls(code))
    assert transcript.outcomes == [expected], transcript.results


def test_a_refusal_by_pynox_is_a_failed_part_and_the_run_completes() -> None:
    with Pool(workers=1) as closed:
        toolset = PynoxToolset(closed)
    transcript = run_pydantic_ai({"toolsets": [toolset]}, code_calls("print(1)"))
    assert transcript.outcomes == ["failed"] and transcript.results == ["PoolError: this pool is closed"]


def test_a_failure_consumes_no_retry_and_the_result_is_the_applications(pool: Pool) -> None:
    # With no retries to spare, a ModelRetry would end the run; a failed part does not.
    agent = Agent(FunctionModel(_calls("raise ValueError('bad')", "print('good')")),
                  toolsets=[PynoxToolset(pool, max_retries=0)])
    result = agent.run_sync("go")
    failed, good = _returns(result)
    assert (failed.outcome, good.outcome) == ("failed", "success")
    assert isinstance(good.metadata, pynox.Result) and good.metadata.stdout == "good\n"
    assert good.content == "good"


def _calls(*codes: str) -> object:
    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        done = sum(isinstance(part, ToolReturnPart) for message in messages for part in message.parts)
        if done < len(codes):
            return ModelResponse(parts=[ToolCallPart("run_python", {"code": codes[done]})])
        return ModelResponse(parts=[TextPart("done")])

    return respond


@dataclass
class Deps:
    user: str


def test_a_host_function_takes_the_runs_context_hidden_from_the_model(pool: Pool) -> None:
    def whoami(ctx: RunContext[Deps]) -> str:
        """The user this run is for."""
        return ctx.deps.user

    toolset = PynoxToolset(pool, functions={"whoami": whoami})
    assert "- whoami() -> str: The user this run is for." in toolset.description
    agent = Agent(FunctionModel(_calls("from pynox_host import whoami\nwhoami()")), deps_type=Deps,
                  toolsets=[toolset])
    assert [part.content for part in _returns(agent.run_sync("go", deps=Deps("alice")))] == ["Out: 'alice'"]
    assert [part.content for part in _returns(agent.run_sync("go", deps=Deps("bob")))] == ["Out: 'bob'"]


def test_async_host_functions_and_tool_objects(pool: Pool) -> None:
    async def forecast(ctx: RunContext[Deps], city: str) -> str:
        return f"sunny in {city} for {ctx.deps.user}"

    def celsius(fahrenheit: float) -> float:
        return round((fahrenheit - 32) * 5 / 9, 1)

    tools = [Tool(forecast, name="forecast"), Tool(celsius, name="celsius", description="F to C.")]
    toolset = PynoxToolset(pool, functions=tools)
    assert "- forecast(city: str) -> str" in toolset.description
    assert "- celsius(fahrenheit: float) -> float: F to C." in toolset.description
    code = "from pynox_host import forecast, celsius\n(forecast('Paris'), celsius(212))"
    agent = Agent(FunctionModel(_calls(code)), deps_type=Deps, toolsets=[toolset])
    [part] = _returns(agent.run_sync("go", deps=Deps("carol")))
    assert part.content == "Out: ('sunny in Paris for carol', 100.0)"


def test_figures_reach_the_model_as_png_binary_content(pool: Pool) -> None:
    pytest.importorskip("matplotlib")
    code = "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nprint('plotted')"
    agent = Agent(FunctionModel(_calls(code)), toolsets=[PynoxToolset(pool, timeout="60s")])
    [part] = _returns(agent.run_sync("go"))
    text, image = part.content
    assert text == "plotted\n[1 image]"
    assert isinstance(image, BinaryContent) and image.media_type == "image/png"
    assert image.data.startswith(b"\x89PNG\r\n\x1a\n")


def test_the_permissions_are_said_once_and_no_returns_block(pool: Pool) -> None:
    plain = run_pydantic_ai({"toolsets": [PynoxToolset(pool, allow_read=["/usr/share"])]}, code_calls("print(1)"))
    description = plain.tool("run_python").description
    assert description.count("Read files: /usr/share") == 1 and "Returns:" not in description
    assert "<returns>" not in description and "<summary>" not in description
    capable = run_pydantic_ai({"capabilities": [PynoxCapability(PynoxToolset(pool, allow_read=["/usr/share"]))]},
                              code_calls("print(1)"))
    told = capable.tool("run_python").description + (capable.instructions or "")
    assert told.count("Read files: /usr/share") == 1
    assert "Read files" in (capable.instructions or "") and "Read files" not in capable.tool("run_python").description


_ONE_LINER = """\
import os
os.environ["ANTHROPIC_API_KEY"] = "not-used: the model is overridden"
from pydantic_ai import Agent
from pydantic_ai.messages import ToolCallPart, ToolReturnPart
from pydantic_ai.models.test import TestModel
import pynox

agent = Agent("anthropic:claude-sonnet-4-5", tools=[pynox.tool()])
with agent.override(model=TestModel(call_tools=["run_python"])):
    result = agent.run_sync("use the tool")
for message in result.all_messages():
    for part in message.parts:
        if isinstance(part, ToolCallPart | ToolReturnPart):
            print(type(part).__name__, repr(part.args if isinstance(part, ToolCallPart) else part.content))
"""


def test_the_specs_one_liner_runs_its_tool_under_test_model(tmp_path: Path, earlier_pools: frozenset[int]) -> None:
    # In a process of its own: pynox.tool() runs on the default pool, which lives until its process exits.
    out = run_script(_ONE_LINER, tmp_path, earlier_pools)
    # TestModel writes the code "a": it really ran, in Pynox, and the model read what Python said.
    assert out.splitlines() == ["ToolCallPart {'code': 'a'}",
                                "ToolReturnPart \"NameError: name 'a' is not defined (agent.py:1)\\n    a\""]


def test_each_host_call_is_a_span_under_the_tool_call(pool: Pool) -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from pydantic_ai.capabilities.instrumentation import Instrumentation
    from pydantic_ai.models.instrumented import InstrumentationSettings

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))

    def lookup(key: str) -> str:
        return key.upper()

    code = "from pynox_host import lookup\nlookup('a') + lookup('b')"
    agent = Agent(FunctionModel(_calls(code)), toolsets=[PynoxToolset(pool, functions={"lookup": lookup})],
                  capabilities=[Instrumentation(settings=InstrumentationSettings(tracer_provider=provider))])
    [part] = _returns(agent.run_sync("go"))
    assert part.content == "Out: 'AB'"
    spans = exporter.get_finished_spans()
    calls = [span for span in spans if span.name == "pynox host call lookup"]
    tool = next(span for span in spans if "run_python" in span.name)
    assert len(calls) == 2 and all(span.parent is not None and span.parent.span_id == tool.context.span_id
                                   for span in calls), [(s.name, s.parent) for s in spans]
