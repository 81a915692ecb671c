"""smolagents with Pynox, offline: a scripted model stands in for the LLM.

Two ways to use it:

1. The spec's one-liner: Pynox's ``run_python`` as a tool of smolagents' own
   ``CodeAgent``. The agent's glue code runs in smolagents' local interpreter;
   only what it passes to ``run_python`` runs in the sandbox.
2. ``PynoxCodeAgent``: every step of a ``CodeAgent`` runs in one Pynox session
   (variables survive between steps), while its tools, here
   ``exchange_rate``, stay in this process and are called by name. Values
   cross as smolagents' own serializer carries them: the DataFrame given as
   ``additional_args`` arrives as a DataFrame, and one comes back as the answer.

    python examples/smolagents_agent.py
"""

from __future__ import annotations

from typing import Any

import pandas as pd
from smolagents import CodeAgent, Model, tool
from smolagents.models import ChatMessage, MessageRole
from smolagents.monitoring import LogLevel

import pynox
from pynox_smolagents import PynoxCodeAgent


class ScriptedModel(Model):
    """Replays the code an LLM might write, one reply per step."""

    def __init__(self, steps: list[str]) -> None:
        super().__init__(model_id="scripted")
        self.steps = steps

    def generate(self, messages: list[Any], stop_sequences: list[str] | None = None,
                 response_format: dict[str, str] | None = None, tools_to_call_from: list[Any] | None = None,
                 **kwargs: Any) -> ChatMessage:
        return ChatMessage(role=MessageRole.ASSISTANT, content=f"<code>\n{self.steps.pop(0)}\n</code>")


@tool
def exchange_rate(currency: str) -> float:
    """Euros per unit of a currency. Runs in the host process: it could call an API with the host's key.

    Args:
        currency: An ISO code such as "USD".
    """
    return {"USD": 0.9, "GBP": 1.2}[currency]


def tool_agent() -> Any:
    model = ScriptedModel(["out = run_python(code='print(sum(range(10)))')\nfinal_answer(int(out))"])
    agent = CodeAgent(tools=[tool(pynox.tool(timeout="10s"))], model=model, verbosity_level=LogLevel.OFF)
    return agent.run("Add the numbers below 10, in the sandbox.")


def executor_agent(pool: pynox.Pool) -> Any:
    model = ScriptedModel([
        "amounts = {'USD': 120, 'GBP': 55.5}",  # step 1: state, kept in the session
        "euros = {c: a * exchange_rate(c) for c, a in amounts.items()}\nprint(euros)",  # step 2: a host tool
        "final_answer(f\"{sum(euros.values()):.1f} EUR\")",  # step 3: the answer ends the run
    ])
    with PynoxCodeAgent(tools=[exchange_rate], model=model, executor_kwargs={"pool": pool, "timeout": "10s"},
                        verbosity_level=LogLevel.OFF) as agent:
        return agent.run("How many euros are 120 USD and 55.50 GBP?")


def table_agent(pool: pynox.Pool) -> Any:
    orders = pd.DataFrame({"currency": ["USD", "GBP", "USD"], "amount": [120.0, 55.5, 30.0]})
    model = ScriptedModel([
        "orders['euros'] = [a * exchange_rate(c) for c, a in zip(orders['currency'], orders['amount'])]\n"
        "final_answer(orders.groupby('currency')['euros'].sum())",  # a pandas Series, built in the sandbox
    ])
    with PynoxCodeAgent(tools=[exchange_rate], model=model, executor_kwargs={"pool": pool},
                        verbosity_level=LogLevel.OFF) as agent:
        return agent.run("Total euros per currency", additional_args={"orders": orders})


if __name__ == "__main__":
    print("tool agent:", tool_agent())
    with pynox.Pool(workers=1) as pool:
        print("executor agent:", executor_agent(pool))
        totals = table_agent(pool)
        print("table agent:", type(totals).__name__, totals.round(1).to_dict())
