"""Scripted models: each framework's own model interface, playing a fixed list of tool calls, then answering.

No network and no real model: pydantic-ai's ``FunctionModel`` and a strands
``Model`` subclass that streams a tool call, then text. Both record what the
model was shown (tools, instructions) and what each tool call returned, in a
``Transcript`` the tests read.

No relative imports: the snippet scripts run this module outside the package.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, AsyncIterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic_ai import Agent as PydanticAgent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from strands import Agent as StrandsAgent
from strands.models import Model

Call = tuple[str, dict[str, Any]]
ANSWER = "Done."
PYTHON = "<python>"
"""A call's tool name meaning: whichever of ``run_python`` and ``python_repl`` the model was shown."""


def code_calls(*codes: str) -> list[Call]:
    """One ``run_python`` call per piece of code."""
    return [("run_python", {"code": code}) for code in codes]


def late_write(path: Path) -> str:
    """Code that writes ``path`` three seconds in: a file that exists after a cancel says the code ran on."""
    return f"import time\ntime.sleep(3)\nopen({str(path)!r}, 'w').write('written')"


@dataclass
class ToolSeen:
    """A tool as the model was shown it."""

    name: str
    description: str
    parameters: dict[str, Any]


@dataclass
class Transcript:
    tools: list[ToolSeen] = field(default_factory=list)
    instructions: str | None = None
    results: list[str] = field(default_factory=list)
    # pydantic-ai's outcome of each tool return ("success", "failed", ...), beside its text.
    outcomes: list[str] = field(default_factory=list)
    answer: str = ""

    def tool(self, name: str) -> ToolSeen:
        matches = [seen for seen in self.tools if seen.name == name]
        assert len(matches) == 1, f"the model saw {len(matches)} tools named {name!r}: {self.tools}"
        return matches[0]


def _resolve(name: str, shown: list[str]) -> str:
    if name != PYTHON:
        return name
    return next((tool for tool in ("run_python", "python_repl") if tool in shown), "run_python")


def _answer(results: list[str], echo: bool) -> str:
    return f"{ANSWER} {results[-1]}" if echo and results else ANSWER


# --- pydantic-ai -------------------------------------------------------------------------------------


def pydantic_model(calls: list[Call], transcript: Transcript | None = None, *, echo: bool = False) -> FunctionModel:
    """A ``FunctionModel`` that makes ``calls`` one per turn, reading each result, then answers
    (``echo``: with the last result after the answer)."""
    transcript = transcript if transcript is not None else Transcript()

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        transcript.tools = [ToolSeen(tool.name, tool.description or "", tool.parameters_json_schema)
                            for tool in info.function_tools]
        transcript.instructions = info.instructions
        returned = [part for message in messages for part in message.parts if isinstance(part, ToolReturnPart)]
        # The text the model reads: a failed part's message goes through the provider's error channel
        # (Anthropic is_error, Bedrock status=error); model_response_str() would wrap it in {"error": ...}.
        transcript.results = [part.content if part.outcome == "failed" and isinstance(part.content, str)
                              else part.model_response_str() for part in returned]
        transcript.outcomes = [part.outcome for part in returned]
        if len(returned) < len(calls):
            name, args = calls[len(returned)]
            name = _resolve(name, [seen.name for seen in transcript.tools])
            return ModelResponse(parts=[ToolCallPart(name, args, tool_call_id=f"call-{len(returned)}")])
        return ModelResponse(parts=[TextPart(_answer(transcript.results, echo))])

    return FunctionModel(respond)


def run_pydantic_ai(agent_kwargs: dict[str, Any], calls: list[Call]) -> Transcript:
    transcript = Transcript()
    agent = PydanticAgent(pydantic_model(calls, transcript), **agent_kwargs)
    transcript.answer = agent.run_sync("Use the Python tool.").output
    return transcript


# --- strands -----------------------------------------------------------------------------------------


class ScriptedStrandsModel(Model):
    """A strands ``Model`` that streams ``calls`` as tool uses, one per turn, then a text answer
    (``echo``: with the last result after it)."""

    def __init__(self, calls: list[Call], transcript: Transcript | None = None, *, echo: bool = False) -> None:
        self.calls = calls
        self.transcript = transcript if transcript is not None else Transcript()
        self.echo = echo

    def update_config(self, **model_config: Any) -> None:
        pass

    def get_config(self) -> dict[str, Any]:
        return {}

    async def structured_output(self, output_model: Any, prompt: Any, system_prompt: str | None = None,
                                **kwargs: Any) -> AsyncGenerator[dict[str, Any], None]:
        raise NotImplementedError("the scripted model answers in text only")
        yield {}  # pragma: no cover  # makes this an async generator, as the interface declares

    async def stream(self, messages: Any, tool_specs: Any = None, system_prompt: str | None = None,
                     **kwargs: Any) -> AsyncIterable[Any]:
        self.transcript.tools = [ToolSeen(spec["name"], spec["description"], spec["inputSchema"]["json"])
                                 for spec in tool_specs or ()]
        self.transcript.instructions = system_prompt
        returned = [block["toolResult"] for message in messages for block in message["content"]
                    if "toolResult" in block]
        self.transcript.results = ["\n".join(item["text"] if "text" in item else "<image>" if "image" in item
                                             else json.dumps(item) for item in result["content"])
                                   for result in returned]
        yield {"messageStart": {"role": "assistant"}}
        if len(returned) < len(self.calls):
            name, args = self.calls[len(returned)]
            name = _resolve(name, [seen.name for seen in self.transcript.tools])
            yield {"contentBlockStart": {"start": {"toolUse": {"name": name, "toolUseId": f"call-{len(returned)}"}}}}
            yield {"contentBlockDelta": {"delta": {"toolUse": {"input": json.dumps(args)}}}}
            yield {"contentBlockStop": {}}
            yield {"messageStop": {"stopReason": "tool_use"}}
        else:
            yield {"contentBlockDelta": {"delta": {"text": _answer(self.transcript.results, self.echo)}}}
            yield {"contentBlockStop": {}}
            yield {"messageStop": {"stopReason": "end_turn"}}


def run_strands(agent_kwargs: dict[str, Any], calls: list[Call]) -> Transcript:
    transcript = Transcript()
    agent = StrandsAgent(model=ScriptedStrandsModel(calls, transcript), callback_handler=None, **agent_kwargs)
    transcript.answer = str(agent("Use the Python tool.")).strip()
    return transcript
