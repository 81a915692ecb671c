"""A data analyst agent: LangGraph's tool loop over a granted CSV, pandas, and a figure.

The model is SCRIPTED (LangChain's fake chat model playing fixed replies): no model service is
reachable here. Everything else is real: LangGraph's ``ToolNode`` calls pynox-langchain's
``run_python``, whose code runs in one Pynox session that may read ``data/`` and write ``out/`` only.
The figure comes back to the model as an image block and lands in ``out/`` for the host.

    python examples/analyst_agent.py
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

import pynox
from pynox_langchain import python_tool

SALES = """region,month,revenue
north,2026-01,1200
north,2026-02,1350
south,2026-01,800
south,2026-02,950
west,2026-01,400
west,2026-02,1100
"""

QUESTION = "Which region grew most from January to February? Show me a chart."

# What a model might write, turn by turn (scripted).
LOAD = """import pandas as pd
sales = pd.read_csv("data/sales.csv")
by_region = sales.pivot(index="region", columns="month", values="revenue")
by_region["growth"] = by_region["2026-02"] - by_region["2026-01"]
by_region"""
CHART = """import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
ax = by_region["growth"].plot.bar(title="Revenue growth, Jan to Feb")
plt.savefig("out/growth.png")
plt.show()
print("best:", by_region["growth"].idxmax(), int(by_region["growth"].max()))"""
ANSWER = "West grew most (+700, from 400 to 1100); the chart is in out/growth.png."


class ScriptedModel(FakeMessagesListChatModel):
    """LangChain's fake chat model; ``bind_tools`` (which the fake lacks) changes nothing: the replies are fixed."""

    def bind_tools(self, tools: Any, **kwargs: Any) -> ScriptedModel:  # type: ignore[override]
        return self


def build_agent(run_python: Any) -> Any:
    model = ScriptedModel(responses=[
        AIMessage("", tool_calls=[{"name": "run_python", "args": {"code": LOAD}, "id": "call-1"}]),
        AIMessage("", tool_calls=[{"name": "run_python", "args": {"code": CHART}, "id": "call-2"}]),
        AIMessage(ANSWER),
    ]).bind_tools([run_python])
    graph = StateGraph(MessagesState)
    graph.add_node("agent", lambda state: {"messages": [model.invoke(state["messages"])]})
    graph.add_node("tools", ToolNode([run_python]))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition, ["tools", END])
    graph.add_edge("tools", "agent")
    return graph.compile()


def show(message: Any) -> None:
    if isinstance(message, HumanMessage):
        print(f"user: {message.content}")
    elif isinstance(message, AIMessage) and message.tool_calls:
        for call in message.tool_calls:
            print(f"model (scripted) calls {call['name']}:")
            print("\n".join(f"    {line}" for line in call["args"]["code"].splitlines()))
    elif isinstance(message, AIMessage):
        print(f"model (scripted): {message.content}")
    elif isinstance(message, ToolMessage):
        blocks = message.content if isinstance(message.content, list) else [message.content]
        print(f"{message.name} [{message.status}]:")
        for block in blocks:
            if isinstance(block, dict) and block.get("type") == "image":
                print(f"    <image {block['mime_type']}>")
            else:
                text = block["text"] if isinstance(block, dict) else block
                print("\n".join(f"    {line}".rstrip() for line in text.splitlines()))


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="pynox-analyst-") as work:
        os.chdir(work)  # the pool resolves the relative grants here
        os.makedirs("data")
        os.makedirs("out")
        with open("data/sales.csv", "w") as csv:
            csv.write(SALES)
        with pynox.Pool(workers=1, preload=["pandas", "matplotlib"]) as pool:
            run_python = python_tool(pool, allow_read=["data"], allow_write=["out"], session=True, timeout="30s")
            final = build_agent(run_python).invoke({"messages": [HumanMessage(QUESTION)]})
            run_python.close()
        for message in final["messages"]:
            show(message)
        with open("out/growth.png", "rb") as png:
            print("host: out/growth.png is a PNG:", png.read(8) == b"\x89PNG\r\n\x1a\n")
        os.chdir("/")


if __name__ == "__main__":
    main()
