"""PynoxCodeMode: the agent's tools as awaitable globals of one run_code tool, in full CPython under Pynox.

Driven by FunctionModel, as pydantic-ai's own tests drive agents. The weather example is the one
CodeMode's README gives: two overlapping get_weather calls, then a dict of Celsius values as the
code's last expression.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass

import pytest
from pydantic_ai import Agent, ModelRetry, RunContext
from pydantic_ai.messages import ModelMessage, ModelResponse, RetryPromptPart, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from pynox import Pool
from pynox_pydantic_ai import PynoxCodeMode
from tests.harness.fixtures import shared_pool

pytestmark = pytest.mark.timeout(90)

WEATHER = ("import asyncio\n"
           "paris, tokyo = await asyncio.gather(get_weather(city='Paris'), get_weather(city='Tokyo'))\n"
           "{'Paris': round((paris['temp_f'] - 32) * 5 / 9, 1), 'Tokyo': round((tokyo['temp_f'] - 32) * 5 / 9, 1)}")


pool = shared_pool(workers=2)


class _Weather:
    """get_weather, counting how many calls ran at once."""

    def __init__(self) -> None:
        self.now = self.most = 0
        self.lock = threading.Lock()

    async def __call__(self, city: str) -> dict[str, object]:
        """Current weather for a city."""
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)
        await asyncio.sleep(0.3)
        with self.lock:
            self.now -= 1
        return {"city": city, "temp_f": {"Paris": 68.0, "Tokyo": 77.0}[city]}


def _model(code: str, seen: dict[str, object]) -> FunctionModel:
    """Calls run_code with ``code`` once, then answers with what came back."""

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        seen["tools"] = [tool.name for tool in info.function_tools]
        seen.setdefault("description", next((t.description for t in info.function_tools if t.name == "run_code"), ""))
        parts = [p for m in messages for p in m.parts if isinstance(p, ToolReturnPart | RetryPromptPart)]
        seen["parts"] = parts
        retried = isinstance(parts[-1], RetryPromptPart) or getattr(parts[-1], "outcome", None) == "retried" \
            if parts else False
        if not parts or (retried and len(parts) < 2):
            return ModelResponse(parts=[ToolCallPart("run_code", {"code": code})])
        last = parts[-1]
        return ModelResponse(parts=[TextPart(str(last.content))])

    return FunctionModel(respond)


def _weather_tool(weather: _Weather) -> object:
    async def get_weather(city: str) -> dict[str, object]:
        """Current weather for a city."""
        return await weather(city)

    return get_weather


def test_the_weather_example_gives_celsius_with_overlapping_calls(pool: Pool) -> None:
    weather, seen = _Weather(), {}
    agent = Agent(_model(WEATHER, seen), tools=[_weather_tool(weather)], capabilities=[PynoxCodeMode(pool)])
    assert agent.run_sync("What is the weather in Paris and Tokyo, in Celsius?").output == \
        "Out: {'Paris': 20.0, 'Tokyo': 25.0}"
    assert seen["tools"] == ["run_code"]  # the selected tool left the model's list
    assert "- async get_weather(city: str): Current weather for a city." in str(seen["description"])
    assert weather.most == 2, "asyncio.gather made the calls one after the other"


def test_code_monty_cannot_run_works(pool: Pool) -> None:
    pytest.importorskip("pandas")
    code = WEATHER.rsplit("\n", 1)[0] + ("\nimport pandas as pd\n"
                                         "frame = pd.DataFrame([paris, tokyo])\nround(float(frame.temp_f.mean()), 1)")
    agent = Agent(_model(code, {}), tools=[_weather_tool(_Weather())], capabilities=[PynoxCodeMode(pool)])
    assert agent.run_sync("mean?").output == "Out: 72.5"


def test_max_tool_calls_is_enforced_in_the_sandbox(pool: Pool) -> None:
    weather, seen = _Weather(), {}
    code = ("from pynox_host import HostError\nawait get_weather(city='Paris')\ntry:\n"
            "    await get_weather(city='Tokyo')\nexcept HostError as error:\n    print('refused:', error)")
    agent = Agent(_model(code, seen), tools=[_weather_tool(weather)],
                  capabilities=[PynoxCodeMode(pool, max_tool_calls=1)])
    output = agent.run_sync("go").output
    assert "refused: get_weather(): this code reached its limit of 1 tool calls" in output


def test_a_tool_raising_model_retry_makes_run_code_a_retry(pool: Pool) -> None:
    def lookup(name: str) -> str:
        """Look a name up."""
        raise ModelRetry(f"no entry {name!r}; try its full name")

    seen: dict[str, object] = {}
    agent = Agent(_model("await lookup(name='Bob')", seen), tools=[lookup],
                  capabilities=[PynoxCodeMode(pool, max_retries=2)])
    agent.run_sync("go")
    # pydantic-ai 2.x records a retry as the call's own return part, outcome "retried".
    retried = [part for part in seen["parts"] if getattr(part, "outcome", None) == "retried"  # type: ignore[attr-defined]
               or isinstance(part, RetryPromptPart)]
    assert retried and all(part.tool_name == "run_code" for part in retried)
    assert "no entry 'Bob'; try its full name" in str(retried[0].content)


@dataclass
class Deps:
    unit: str


def test_selected_tools_get_the_runs_context_and_the_others_stay_native(pool: Pool) -> None:
    def convert(ctx: RunContext[Deps], value: float) -> str:
        """Format a temperature in the run's unit."""
        return f"{value} {ctx.deps.unit}"

    def note(text: str) -> str:
        """Keep a note (called by the model directly)."""
        return text

    seen: dict[str, object] = {}
    agent = Agent(_model("await convert(value=21.5)", seen), deps_type=Deps, tools=[convert, note],
                  capabilities=[PynoxCodeMode(pool, tools=["convert"])])
    assert agent.run_sync("go", deps=Deps("°C")).output == "Out: '21.5 °C'"
    assert sorted(seen["tools"]) == ["note", "run_code"]  # type: ignore[call-overload]


def test_calls_from_the_code_go_through_the_agents_tool_machinery(pool: Pool) -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from pydantic_ai.capabilities.instrumentation import Instrumentation
    from pydantic_ai.models.instrumented import InstrumentationSettings

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    seen: dict[str, object] = {}
    agent = Agent(_model("await get_weather(city='Paris')\nawait get_weather(city=3)", seen),
                  tools=[_weather_tool(_Weather())],
                  capabilities=[PynoxCodeMode(pool), Instrumentation(settings=InstrumentationSettings(
                      tracer_provider=provider))])
    output = agent.run_sync("go").output
    # Validated as the model's own call would be: 3 is not a city name (a string).
    assert "get_weather(): invalid arguments" in output and "city" in output
    names = [span.name for span in exporter.get_finished_spans()]
    assert any("get_weather" in name for name in names), names  # traced by the agent's own capability
