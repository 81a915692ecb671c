"""The OpenAI Agents SDK: ``python_tool`` driven by ``Runner.run`` with the SDK's own ``ScriptedModel``.

Runs in its own environment (``requirements-separate.txt``; marked ``separate_env``, run by ``.ci/run``):
openai-agents requires a websockets the workspace's pins exclude. The checks are the conformance suite's
(``test_conformance.py``), written against this SDK, plus what is the SDK's own: its failure path (the
run's trace records a handled tool error) and state per ``Runner.run``.
"""

from __future__ import annotations

import gc
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from agents import Agent, Runner, TracingProcessor, set_trace_processors
from agents.items import ToolCallOutputItem
from agents.testing import ScriptedModel, assistant_message, function_call
from agents.tracing import FunctionSpanData

from pynox import Pool
from pynox_openai_agents import PynoxFunctionTool, python_tool

from .conftest import run_async
from .procs import running_pools, wait_for_idle, wait_for_none
from .test_docs_and_examples import CODE, ROOT, python_blocks, run_script, section

pytestmark = [pytest.mark.separate_env, pytest.mark.timeout(60)]

ANSWER = "Done."


class SpanRecorder(TracingProcessor):
    """The SDK's tracing, kept here instead of exported: the function spans of a run and their errors."""

    def __init__(self) -> None:
        self.errors: list[dict[str, Any] | None] = []

    def on_trace_start(self, trace: Any) -> None: ...
    def on_trace_end(self, trace: Any) -> None: ...
    def on_span_start(self, span: Any) -> None: ...

    def on_span_end(self, span: Any) -> None:
        if isinstance(span.span_data, FunctionSpanData):
            self.errors.append(span.error)

    def shutdown(self) -> None: ...
    def force_flush(self) -> None: ...


@dataclass
class Transcript:
    model: ScriptedModel
    results: list[Any] = field(default_factory=list)
    answer: str = ""


def script(*codes: str | tuple[str, ...]) -> ScriptedModel:
    """One model turn per entry (a tuple: parallel calls in one turn), then the answer."""
    steps: list[Any] = []
    for turn, codes_of_turn in enumerate(codes):
        batch = codes_of_turn if isinstance(codes_of_turn, tuple) else (codes_of_turn,)
        steps.append([function_call("run_python", {"code": code}, call_id=f"call-{turn}-{i}")
                      for i, code in enumerate(batch)])
    return ScriptedModel([*steps, [assistant_message(ANSWER)]])


def run(tool: PynoxFunctionTool, *codes: str | tuple[str, ...]) -> Transcript:
    model = script(*codes)
    agent = Agent(name="coder", model=model, tools=[tool])
    result = run_async(Runner.run(agent, "Use the Python tool."))
    model.assert_complete()
    outputs = [item.output for item in result.new_items if isinstance(item, ToolCallOutputItem)]
    return Transcript(model, [output.strip() if isinstance(output, str) else output for output in outputs],
                      str(result.final_output))


def lookup(name: str) -> dict[str, object]:
    """Look up a product by name."""
    return {"name": name, "price": 12.5}


def test_the_model_sees_run_python_with_the_docstring_and_one_code_parameter(pool: Pool) -> None:
    transcript = run(python_tool(pool, allow_read=["/usr/share"], timeout="7s"), "print('hello')")
    call = transcript.model.first_call
    assert call is not None and [tool.name for tool in call.tools] == ["run_python"]
    seen = call.tools[0]
    assert isinstance(seen, PynoxFunctionTool)
    docstring = pool.tool(allow_read=["/usr/share"], timeout="7s").__doc__ or ""
    for line in filter(None, (line.strip() for line in docstring.split("\nArgs:\n")[0].splitlines())):
        assert line in seen.description
    assert "Args:" not in seen.description and seen.description.count("7s of time") == 1
    schema = seen.params_json_schema
    assert schema["properties"] == {"code": {"description": "Python source code to run, as a complete script.",
                                             "title": "Code", "type": "string"}}
    assert schema["required"] == ["code"]
    assert transcript.results == ["hello"] and transcript.answer == ANSWER


def test_a_failed_run_takes_the_sdks_failure_path_and_the_run_goes_on(pool: Pool) -> None:
    recorder = SpanRecorder()
    set_trace_processors([recorder])
    try:
        transcript = run(python_tool(pool), "print(open('/etc/passwd').read())", "print('after')")
    finally:
        set_trace_processors([])
    denied, after = transcript.results
    assert "PermissionError: [Errno 13] Permission denied: '/etc/passwd' (agent.py:1)" in denied
    assert 'allow_read=["/etc/passwd"]' in denied and "root:" not in denied
    assert "An error occurred while running the tool" not in denied  # the SDK's default text says nothing
    assert after == "after" and transcript.answer == ANSWER
    # The SDK recorded a handled tool error for the failed call, and none for the good one.
    failed, good = recorder.errors
    assert failed is not None and failed["message"] == "Error running tool (non-fatal)"
    assert "PermissionError" in failed["data"]["error"]
    assert good is None


def test_each_call_is_a_fresh_process_without_a_session(pool: Pool) -> None:
    transcript = run(python_tool(pool), "x = 41", "print(x + 1)")
    assert transcript.results[1].startswith("NameError: name 'x' is not defined")


def test_a_session_lasts_one_runner_run(pool: Pool) -> None:
    tool = python_tool(pool, session=True)
    assert "Calls share one Python process within one Runner run" in tool.description
    first = run(tool, "x = 41", "import math", "print(math.floor(x + 1.5))")
    assert first.results[2] == "42"
    second = run(tool, "print(x)")  # the same agent's next run starts with nothing
    assert second.results[0].startswith("NameError: name 'x' is not defined")
    tool.close()


def test_a_turns_parallel_calls_take_turns_in_the_session(pool: Pool) -> None:
    tool = python_tool(pool, session=True)
    transcript = run(tool, ("import time\ntime.sleep(0.3)\na = 1", "b = 2"), "print(a + b)")
    assert transcript.results[-1] == "3", transcript.results
    tool.close()


def test_a_pynox_session_is_shared_across_runs(pool: Pool) -> None:
    with pool.session() as conversation:
        tool = python_tool(session=conversation)
        run(tool, "x = 41")
        assert run(tool, "print(x + 1)").results == ["42"]


def test_a_host_function_is_listed_and_callable(pool: Pool) -> None:
    code = "from pynox_host import lookup\nproduct = lookup('lamp')\nprint(product['name'], product['price'])"
    tool = python_tool(pool, functions={"lookup": lookup})
    transcript = run(tool, code, "from pynox_host import lookup\nlookup()")
    assert "- lookup(name: str) -> dict[str, object]: Look up a product by name." in tool.description
    assert transcript.results[0] == "lamp 12.5"
    assert "HostError" in transcript.results[1] and "missing a required argument: 'name'" in transcript.results[1]


def test_nothing_is_left_running_after_the_run(pool: Pool) -> None:
    others = running_pools()
    with Pool(workers=1) as own:
        wait_for_idle(templates=1, ignore=others)
        run(python_tool(own), "import time\ntime.sleep(0.2)\nprint('slept')")
        wait_for_idle(templates=1, ignore=others)
        tool = python_tool(own, session=True)
        assert run(tool, "x = 1", "print(x)").results[1] == "1"
        gc.collect()  # the run's result (and its context) is gone: so is its session
        wait_for_idle(templates=1, ignore=others)
    wait_for_none(others)


def test_allow_hosts_reach_the_listed_host_and_no_other(pool: Pool) -> None:
    listeners = [socket.create_server(("127.0.0.1", 0)) for _ in range(2)]
    listed, other = (listener.getsockname()[1] for listener in listeners)
    code = (f"import socket\nfor port in ({listed}, {other}):\n    try:\n"
            "        socket.create_connection(('127.0.0.1', port), timeout=3).close(); print('reached', port)\n"
            "    except OSError as exc:\n        print('refused', port, type(exc).__name__)")
    try:
        tool = python_tool(pool, allow_hosts=[f"127.0.0.1:{listed}"])
        transcript = run(tool, code)
        assert f"TCP connections to 127.0.0.1:{listed} only" in tool.description
        assert f"reached {listed}" in transcript.results[0] and f"refused {other} PermissionError" in \
            transcript.results[0], transcript.results
    finally:
        for listener in listeners:
            listener.close()


def test_figures_come_back_as_images_after_the_text(pool: Pool) -> None:
    code = "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()\nprint('drawn')"
    transcript = run(python_tool(pool, memory="1g"), code)
    call = transcript.model.last_call
    assert call is not None
    # What the model was sent back: the tool's output items, as the SDK put them in its input.
    (output,) = [item["output"] for item in call.input if item.get("type") == "function_call_output"]
    text, image = output
    assert text["type"] == "input_text" and text["text"].startswith("drawn")
    assert image["type"] == "input_image" and image["image_url"].startswith("data:image/png;base64,iVBOR")


def test_a_misspelt_grant_is_named_with_the_valid_ones() -> None:
    """As tests/test_grant_types.py checks of the adapters in the main environment."""
    with pytest.raises(TypeError, match=r"^python_tool\(\) got an unknown grant 'allow_reed' \(did you mean "
                                        r"'allow_read'\?\)"):
        python_tool(allow_reed=["data"])  # type: ignore[call-arg]


# The model, scripted, as the doc block expects it (`CODE` is set before it).
MODEL = """\
from agents.testing import ModelStep, ScriptedModel, assistant_message, function_call


def answer(call):
    (output,) = [item["output"] for item in call.input if item.get("type") == "function_call_output"]
    return [assistant_message(f"Done. {output.strip()}")]


model = ScriptedModel([[function_call("run_python", {"code": CODE}, call_id="call-1")], ModelStep.respond(answer)])
"""


def test_the_integrations_doc_block_runs(tmp_path: Path) -> None:
    """docs/integrations.md's block, run as a user would (a fresh interpreter, the default pool), the model scripted."""
    (block,) = python_blocks(section((ROOT / "docs" / "integrations.md").read_text(), "OpenAI Agents SDK"))
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "orders.csv").write_text("product,quantity\nlamp,2\ndesk,1\nlamp,4\n")
    others = running_pools()  # this module's pool among them: the block's own default pool must end
    out = run_script(f"CODE = {CODE!r}\n{MODEL}\n{block}", tmp_path, others)
    assert "3 orders" in out, out
