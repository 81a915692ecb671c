"""A scripted LangChain chat model and the LangGraph agent loop it drives: model, ``ToolNode``, model, ...

LangChain's own ``FakeMessagesListChatModel`` plays the replies (a tool call per turn, then the
answer); the subclass only adds ``bind_tools``, which the fake lacks, recording the tools as the
model would be shown them (OpenAI's function format, as providers convert them).
"""

from __future__ import annotations

from typing import Any

from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from pydantic import Field

from .scripted import ANSWER, Call, ToolSeen, Transcript


class ScriptedChatModel(FakeMessagesListChatModel):
    """LangChain's fake chat model, with ``bind_tools`` recording what it was given."""

    bound: list[dict[str, Any]] = Field(default_factory=list)

    def bind_tools(self, tools: Any, **kwargs: Any) -> ScriptedChatModel:
        self.bound = [convert_to_openai_tool(tool) for tool in tools]
        return self


def tool_calls(calls: list[Call], answer: str = ANSWER) -> list[BaseMessage]:
    """The replies: one tool call per turn, then ``answer``."""
    replies: list[BaseMessage] = [AIMessage("", tool_calls=[{"name": name, "args": args, "id": f"call-{i}"}])
                                  for i, (name, args) in enumerate(calls)]
    return [*replies, AIMessage(answer)]


def agent_graph(model: ScriptedChatModel, tools: list[BaseTool]) -> Any:
    """The usual LangGraph tool-calling agent: the model, then LangGraph's ``ToolNode`` while it calls tools."""
    bound = model.bind_tools(tools)

    def call_model(state: MessagesState) -> dict[str, Any]:
        return {"messages": [bound.invoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", call_model)
    graph.add_node("tools", ToolNode(tools))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition, ["tools", END])
    graph.add_edge("tools", "agent")
    return graph.compile()


def text(message: ToolMessage) -> str:
    if isinstance(message.content, str):
        return message.content
    return "\n".join(block if isinstance(block, str) else block.get("text", f"<{block.get('type')}>")
                     for block in message.content)


def run_langgraph(agent_kwargs: dict[str, Any], calls: list[Call], config: dict[str, Any] | None = None) -> Transcript:
    """Drive :func:`agent_graph` through ``calls``; outcomes are the ToolMessages' statuses."""
    model = ScriptedChatModel(responses=tool_calls(calls))
    graph = agent_graph(model, agent_kwargs["tools"])
    final = graph.invoke({"messages": [HumanMessage("Use the Python tool.")]}, config=config)
    transcript = Transcript()
    transcript.tools = [ToolSeen(spec["function"]["name"], spec["function"]["description"],
                                 spec["function"]["parameters"]) for spec in model.bound]
    returned = [message for message in final["messages"] if isinstance(message, ToolMessage)]
    transcript.results = [text(message) for message in returned]
    transcript.outcomes = [message.status for message in returned]
    transcript.answer = str(final["messages"][-1].content)
    return transcript
