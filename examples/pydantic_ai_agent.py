"""A Pydantic AI agent whose Python runs in Pynox, offline: a scripted model stands in for the LLM.

``PynoxCapability`` gives the agent the ``run_python`` tool and tells the model,
in its instructions, what the code may touch. With ``session=True`` each agent
run gets one Pynox session: a variable from one call is there in the next, and
the session ends with the run. ``catalog_price`` is a host function: it runs in
this process (where it could use a database), the code calls it through
``pynox_host``, and, like a pydantic-ai tool, it takes the run's context (its
first parameter, hidden from the model) to price for the run's own customer.
A denied read comes back to the model as a failed tool part (the provider's
error channel), with its text and hint; a good run's ``pynox.Result`` is the
part's ``metadata``, for the application.

Then ``PynoxCodeMode``: the agent's own ``get_weather`` tool becomes an awaitable
global of one ``run_code`` tool, and the model's code calls it twice at once
with ``asyncio.gather``; its last expression is the tool's result.

For a real model, replace ``FunctionModel(scripted)`` with e.g.
``"anthropic:claude-sonnet-4-5"``.

    python examples/pydantic_ai_agent.py
"""

from __future__ import annotations

import asyncio
import tempfile
from dataclasses import dataclass
from pathlib import Path

from pydantic_ai import Agent, RunContext
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

import pynox
from pynox_pydantic_ai import PynoxCapability, PynoxCodeMode, PynoxToolset

# The code an LLM might write, one call per turn.
STEPS = [
    "import csv\nrows = list(csv.DictReader(open(ORDERS)))\nprint(len(rows), 'orders')",
    "from pynox_host import catalog_price\n"
    "total = sum(int(r['quantity']) * catalog_price(r['product']) for r in rows)\nprint(f'total {total:.2f} EUR')",
    "print(open('/etc/shadow').read())",
]


@dataclass
class Customer:
    discount: float  # 0.1 is 10 % off


def catalog_price(ctx: RunContext[Customer], product: str) -> float:
    """The unit price of a product, in euros, for this customer."""
    return {"lamp": 25.0, "desk": 180.0}[product] * (1 - ctx.deps.discount)


def scripted(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Plays STEPS in order, printing what each returned, then answers."""
    returned = [part for message in messages for part in message.parts if isinstance(part, ToolReturnPart)]
    if returned:
        print(f"--- run_python returned ({returned[-1].outcome}):\n{returned[-1].content}")
    if len(returned) < len(STEPS):
        return ModelResponse(parts=[ToolCallPart("run_python", {"code": STEPS[len(returned)]})])
    return ModelResponse(parts=[TextPart("3 orders, 369.00 EUR in total; /etc/shadow is not mine to read.")])


WEATHER_CODE = """import asyncio
paris, tokyo = await asyncio.gather(get_weather(city='Paris'), get_weather(city='Tokyo'))
{'Paris': round((paris['temp_f'] - 32) * 5 / 9, 1), 'Tokyo': round((tokyo['temp_f'] - 32) * 5 / 9, 1)}"""


async def get_weather(city: str) -> dict[str, object]:
    """Current weather for a city, temperatures in Fahrenheit."""
    await asyncio.sleep(0.1)  # a real one would ask a weather service
    return {"city": city, "temp_f": {"Paris": 68.0, "Tokyo": 77.0}[city]}


def code_mode(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """One run_code call, then the answer it gave."""
    returned = [part for message in messages for part in message.parts if isinstance(part, ToolReturnPart)]
    if not returned:
        print("--- code mode tools: " + ", ".join(tool.name for tool in info.function_tools))
        return ModelResponse(parts=[ToolCallPart("run_code", {"code": WEATHER_CODE})])
    return ModelResponse(parts=[TextPart(f"In Celsius: {returned[-1].content.removeprefix('Out: ')}")])


def main() -> None:
    with tempfile.TemporaryDirectory() as data, pynox.Pool(workers=1) as pool:
        orders = Path(data, "orders.csv")
        orders.write_text("product,quantity\nlamp,2\ndesk,2\nlamp,0\n")
        STEPS[0] = STEPS[0].replace("ORDERS", repr(str(orders)))
        toolset = PynoxToolset(pool, session=True, allow_read=[data], timeout="10s",
                               functions={"catalog_price": catalog_price})
        agent = Agent(FunctionModel(scripted), deps_type=Customer, capabilities=[PynoxCapability(toolset)])
        print("--- instructions:\n" + toolset.model_instructions)
        result = agent.run_sync("How much are our orders worth?", deps=Customer(discount=0.1))
        counted = next(part for message in result.all_messages() for part in message.parts
                       if isinstance(part, ToolReturnPart) and part.outcome == "success")
        print(f"--- the application reads: exit {counted.metadata.exit}, stdout {counted.metadata.stdout!r}")
        print("--- answer: " + result.output)

        weather = Agent(FunctionModel(code_mode), tools=[get_weather], capabilities=[PynoxCodeMode(pool)])
        print("--- code mode answer: " + weather.run_sync("Weather in Paris and Tokyo?").output)


if __name__ == "__main__":
    main()
