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

For a real model, replace ``FunctionModel(scripted)`` with e.g.
``"anthropic:claude-sonnet-4-5"``.

    python examples/pydantic_ai_agent.py
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

from pydantic_ai import Agent, RunContext
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

import pynox
from pynox_pydantic_ai import PynoxCapability, PynoxToolset

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


if __name__ == "__main__":
    main()
