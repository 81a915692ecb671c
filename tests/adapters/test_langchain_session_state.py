"""pynox-langchain: a CodeAct thread's Pynox variables travel with its LangGraph checkpoint.

LangGraph's own checkpointer (``InMemorySaver``) keeps the thread; the model is LangChain's fake chat model
playing scripted replies. The thread is resumed by a new graph on a NEW pool (the same key, as a restarted
application's pool would have): its variables are back, because the session's state was saved into the
checkpoint. The control is the same resumption without ``save_session``: the variable is gone.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langgraph.checkpoint.memory import InMemorySaver

from pynox import Pool
from pynox_langchain import PynoxEval, create_codeact_graph
from tests.harness.fixtures import session_key_config

from .scripted_langgraph import ScriptedChatModel

pytestmark = pytest.mark.timeout(120)


def _observed(graph: object, thread: str, question: str) -> str:
    final = graph.invoke({"messages": [HumanMessage(question)]},  # type: ignore[attr-defined]
                         {"configurable": {"thread_id": thread}})
    return str([m for m in final["messages"] if isinstance(m, HumanMessage)][-1].content)


@pytest.mark.parametrize("save_session", [True, False])
def test_a_thread_resumed_on_a_new_pool_gets_its_variables_back(tmp_path: Path, save_session: bool) -> None:
    config = session_key_config(tmp_path)
    saver = InMemorySaver()
    first: list[BaseMessage] = [AIMessage("```python\nbasket = {'lamp': 25.0, 'shade': 12.0}\nprint(len(basket))\n```"),
             AIMessage("Two items.")]
    with Pool(workers=1, config=config) as pool:
        evaluate = PynoxEval(pool)
        graph = create_codeact_graph(ScriptedChatModel(responses=first), [], evaluate,
                                     save_session=save_session).compile(checkpointer=saver)
        assert _observed(graph, "t-1", "Fill the basket") == "2"
        evaluate.close()
    later: list[BaseMessage] = [AIMessage("```python\nprint(f\"{sum(basket.values()):.2f}\")\n```"),
                                AIMessage("37.00 in all.")]
    with Pool(workers=1, config=config) as pool:  # the application restarted: a new pool, the same key
        evaluate = PynoxEval(pool)
        graph = create_codeact_graph(ScriptedChatModel(responses=later), [], evaluate,
                                     save_session=save_session).compile(checkpointer=saver)
        output = _observed(graph, "t-1", "What does it cost?")
        evaluate.close()
    if save_session:
        assert output == "37.00"
    else:  # control: the checkpoint kept the messages, and the variables were lost with the old pool
        assert "NameError" in output and "basket" in output


def test_threads_keep_their_own_variables_in_one_graph(tmp_path: Path) -> None:
    replies: list[BaseMessage] = [AIMessage("```python\nwho = 'first'\n```"), AIMessage("ok"),
               AIMessage("```python\nwho = 'second'\n```"), AIMessage("ok"),
               AIMessage("```python\nprint(who)\n```"), AIMessage("done")]
    with Pool(workers=1, config=session_key_config(tmp_path)) as pool:
        evaluate = PynoxEval(pool)
        graph = create_codeact_graph(ScriptedChatModel(responses=replies), [], evaluate,
                                     save_session=True).compile(checkpointer=InMemorySaver())
        _observed(graph, "a", "one")
        _observed(graph, "b", "two")
        assert _observed(graph, "a", "who?") == "first"  # thread a's own state, not b's process
        evaluate.close()
