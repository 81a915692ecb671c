"""pynox-langchain on LangChain's and LangGraph's own machinery: failures are failures, and CodeAct.

The agent loops are LangGraph graphs driven by LangChain's fake chat model (``scripted_langgraph``);
the tool runs on a real pool. The control beside the first test is the old wiring,
``langchain_core.tools.tool(pool.tool())``, which records the same failure as a success.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool as langchain_tool

import pynox
from pynox import Pool, RequestError
from pynox_langchain import PynoxEval, create_codeact_graph, python_tool

from .procs import running_pools, wait_for_idle
from .scripted import code_calls
from .scripted_langgraph import ScriptedChatModel, run_langgraph

pytestmark = pytest.mark.timeout(90)

FAILING = "print('half')\n1 / 0"


def tool_call(code: str, call_id: str = "call-1") -> dict[str, object]:
    return {"type": "tool_call", "name": "run_python", "id": call_id, "args": {"code": code}}


def test_toolnode_sees_a_failed_run_as_an_error(pool: Pool) -> None:
    transcript = run_langgraph({"tools": [python_tool(pool)]}, code_calls(FAILING, "print('fine')"))
    assert transcript.outcomes == ["error", "success"]
    failed, fine = transcript.results
    assert failed.startswith("half\nZeroDivisionError: division by zero (agent.py:2)") and "    1 / 0" in failed
    assert fine == "fine"


def test_the_old_wiring_recorded_the_failure_as_a_success(pool: Pool) -> None:
    """The control: the plain function in ``tool()`` returns the failure's text as a successful call."""
    transcript = run_langgraph({"tools": [langchain_tool(pool.tool())]}, code_calls(FAILING))
    assert "ZeroDivisionError" in transcript.results[0] and transcript.outcomes == ["success"]


def test_invoke_and_ainvoke_with_a_tool_call_give_a_tool_message(pool: Pool) -> None:
    run_python = python_tool(pool)
    good = run_python.invoke(tool_call("x = 6 * 7\nx"))
    assert isinstance(good, ToolMessage) and good.status == "success" and good.content == "Out: 42"
    assert isinstance(good.artifact, pynox.Result) and good.artifact.return_value == "42"
    bad = asyncio.run(run_python.ainvoke(tool_call("open('/etc/shadow')", "call-2")))
    assert isinstance(bad, ToolMessage) and bad.status == "error" and bad.tool_call_id == "call-2"
    assert "PermissionError" in bad.content and "Hint: /etc/shadow is outside the paths" in bad.content
    # Invoked with its arguments alone (no tool call), the tool gives the text, as LangChain's tools do.
    assert run_python.invoke({"code": "print('plain')"}) == "plain"


def test_a_refusal_by_pynox_is_an_error_too(pool: Pool, tmp_path: Path) -> None:
    # A grant the pool refuses at every run is refused when the tool is made, to the host, not the model.
    with pytest.raises(RequestError, match=r"^allow_write: .* overlaps the runtime path"):
        python_tool(pool, allow_write=[os.path.join(sys.base_prefix, "lib")])
    # One that stops holding after (its directory removed) is refused at the run: an error message.
    gone = tmp_path / "gone"
    gone.mkdir()
    tool = python_tool(pool, allow_read=[str(gone)])
    gone.rmdir()
    message = tool.invoke(tool_call("print('never')"))
    assert message.status == "error" and message.content.startswith("RequestError: allow_read:"), message.content


def test_a_figure_is_an_image_block(pool: Pool) -> None:
    code = "import matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt\nplt.plot([1, 2])\nplt.show()"
    message = python_tool(pool).invoke(tool_call(code))
    assert message.status == "success", message.content
    text, image = message.content
    assert text == {"type": "text", "text": "[1 image]"}
    assert image["type"] == "image" and image["mime_type"] == "image/png" and image["base64"].startswith("iVBOR")


def test_a_session_per_langgraph_thread_ended_by_close(pool: Pool) -> None:
    others = running_pools()
    with Pool(workers=1) as own:
        wait_for_idle(templates=1, ignore=others)
        run_python = python_tool(own, session=True)
        run_langgraph({"tools": [run_python]}, code_calls("x = 'a'"), config={"configurable": {"thread_id": "a"}})
        seen = run_langgraph({"tools": [run_python]}, code_calls("print(x)"),
                             config={"configurable": {"thread_id": "a"}})
        other = run_langgraph({"tools": [run_python]}, code_calls("print(x)"),
                              config={"configurable": {"thread_id": "b"}})
        assert seen.results == ["a"]
        assert other.results[0].startswith("NameError: name 'x' is not defined") and other.outcomes == ["error"]
        run_python.close()
        wait_for_idle(templates=1, ignore=others)  # both threads' sessions are gone


# --- CodeAct ---------------------------------------------------------------------------------------------

CATALOG = {"lamp": 25.0, "lamp shade": 12.0, "desk": 180.0}


def search(query: str) -> list[str]:
    """Product names containing ``query``."""
    return [name for name in CATALOG if query in name]


def price(product: str) -> float:
    """The price of one product, in euros."""
    if product not in CATALOG:
        raise pynox.HostError(f"no product named {product!r}")
    return CATALOG[product]


def test_codeact_graph_calls_the_tools_in_one_script_keeps_variables_and_reports_a_failure(pool: Pool) -> None:
    replies = [
        AIMessage("```python\nnames = search('lamp')\nprint(names)\n```"),
        AIMessage("```python\nprint(price('sofa'))\n```"),
        AIMessage("```python\ntotal = sum(price(n) for n in names)\nprint(f'{total:.2f}')\n```"),
        AIMessage("The lamps cost 37.00 EUR together."),
    ]
    evaluate = PynoxEval(pool)
    graph = create_codeact_graph(ScriptedChatModel(responses=replies), [search, price], evaluate).compile()
    states = list(graph.stream({"messages": [HumanMessage("What do the lamps cost?")]}, stream_mode="values"))
    observed = [state["messages"][-1].content for state in states
                if isinstance(state["messages"][-1], HumanMessage) and len(state["messages"]) > 1]
    assert observed[0] == "['lamp', 'lamp shade']"
    assert "HostError: no product named 'sofa'" in observed[1]
    assert observed[2] == "37.00"  # `names` from the first script: one session for the whole run
    failed = [state.get("failed") for state in states if "failed" in state]
    assert True in failed and failed[-1] is False
    assert states[-1]["messages"][-1].content == "The lamps cost 37.00 EUR together."
    evaluate.close()


def test_pynox_eval_has_langgraph_codeacts_eval_fn_shape(pool: Pool) -> None:
    """``create_codeact``'s contract: ``(code, context) -> (output, new_variables)``, sync or awaited; the
    variables stay in the Pynox process, so none are handed back."""
    evaluate = PynoxEval(pool, timeout="10s")
    assert evaluate("basket = search('lamp')\nprint(len(basket))", {"search": search}) == ("2", {})
    output, new = asyncio.run(evaluate.aeval("print(basket)", {"search": search}))
    assert (output, new) == ("['lamp', 'lamp shade']", {})
    output, _ = evaluate("import socket\nsocket.create_connection(('127.0.0.1', 9))", {"search": search})
    assert "PermissionError" in output and evaluate.last_result is not None and not evaluate.last_result.ok
    evaluate.close()
