"""Strands agents whose Python runs in Pynox, offline: a scripted model stands in for the LLM.

1. ``python_tool``: Pynox's ``run_python`` as a strands tool (a plain function
   in ``Agent(tools=[...])`` would be silently dropped). With a session, a
   variable from one call is there in the next.
2. ``PynoxSandbox``: ``Agent(sandbox=...)`` with strands' ``python_repl`` and
   ``file_editor`` vended by the sandbox, described as they really behave under
   Pynox (where files may be written, whether variables persist): writes land
   only where the host allowed, a denied path is named with the grant that
   would allow it, and strands' ``shell`` fails with a message that says why.

For a real model, pass e.g. ``strands.models.BedrockModel(...)`` instead of
``ScriptedModel``.

    python examples/strands_agent.py
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import AsyncGenerator, AsyncIterable
from pathlib import Path
from typing import Any

from strands import Agent
from strands.models import Model
from strands.vended_tools import shell

import pynox
from pynox_strands import PynoxSandbox, python_tool


class ScriptedModel(Model):
    """Streams one tool call per turn (what an LLM might decide), printing each result, then answers."""

    def __init__(self, calls: list[tuple[str, dict[str, Any]]], answer: str) -> None:
        self.calls = calls
        self.answer = answer

    def update_config(self, **model_config: Any) -> None:
        pass

    def get_config(self) -> dict[str, Any]:
        return {}

    async def structured_output(self, output_model: Any, prompt: Any, system_prompt: str | None = None,
                                **kwargs: Any) -> AsyncGenerator[dict[str, Any], None]:
        raise NotImplementedError
        yield {}  # makes this an async generator, as the interface declares

    async def stream(self, messages: Any, tool_specs: Any = None, system_prompt: str | None = None,
                     **kwargs: Any) -> AsyncIterable[Any]:
        results = [block["toolResult"] for message in messages for block in message["content"]
                   if "toolResult" in block]
        if results:
            print(f"--- returned:\n{results[-1]['content'][0]['text']}")
        yield {"messageStart": {"role": "assistant"}}
        if len(results) < len(self.calls):
            name, args = self.calls[len(results)]
            print(f"--- {name}: {args.get('code') or ' '.join(map(str, args.values()))}")
            yield {"contentBlockStart": {"start": {"toolUse": {"name": name, "toolUseId": f"call-{len(results)}"}}}}
            yield {"contentBlockDelta": {"delta": {"toolUse": {"input": json.dumps(args)}}}}
            yield {"contentBlockStop": {}}
            yield {"messageStop": {"stopReason": "tool_use"}}
        else:
            yield {"contentBlockDelta": {"delta": {"text": self.answer}}}
            yield {"contentBlockStop": {}}
            yield {"messageStop": {"stopReason": "end_turn"}}


def main() -> None:
    with tempfile.TemporaryDirectory() as out, pynox.Pool(workers=1) as pool:
        # 1. The run_python tool, with a session the host opens and closes.
        with pool.session(timeout="10s") as session:
            model = ScriptedModel([("run_python", {"code": "squares = [n * n for n in range(10)]"}),
                                   ("run_python", {"code": "print(sum(squares))"})], "The sum is 285.")
            print("--- answer:", Agent(model=model, tools=[python_tool(session=session)], callback_handler=None)(
                "Sum the first ten squares."))

        # 2. python_repl and file_editor vended by the sandbox (not strands' stock instances, whose
        # descriptions are of another sandbox); strands' shell, routed to the sandbox, is refused.
        report = Path(out, "report.txt")
        sandbox = PynoxSandbox(pool, allow_write=[out], timeout="10s", vend=["python_repl", "file_editor"])
        model = ScriptedModel([("python_repl", {"code": f"open({str(report)!r}, 'w').write('42 rows')"}),
                               ("python_repl", {"code": "open('/etc/hostname', 'w').write('pwned')"}),
                               ("file_editor", {"command": "view", "path": str(report)}),
                               ("file_editor", {"command": "view", "path": "/etc/shadow"}),
                               ("shell", {"command": "rm -rf /"})], "Report written; the rest was refused.")
        agent = Agent(model=model, sandbox=sandbox, tools=[shell], callback_handler=None)
        description = agent.tool_registry.registry["python_repl"].tool_spec["description"]
        print("--- python_repl is described as:", description.split("\n")[0])
        print("--- answer:", agent("Write the report."))
        print("--- the host reads:", report.read_text())


if __name__ == "__main__":
    main()
