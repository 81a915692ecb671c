"""CodeAct on LangGraph with the code in Pynox: :class:`PynoxEval` and :func:`create_codeact_graph`.

:class:`PynoxEval` is an ``eval_fn`` in the shape ``langgraph-codeact``'s ``create_codeact`` takes,
``(code, context) -> (output, new_variables)``: the code runs in one Pynox session (so its variables
live on in that process, and ``new_variables`` is always empty: nothing the code made is copied into
the graph's state), and the callables of ``context`` (the agent's tools) are host functions, globals of
the code as CodeAct's prompt promises them, running in this process.

``langgraph-codeact`` 0.1.3, its latest release, requires ``langgraph<0.4``; this workspace pins
LangGraph 1.x, so it is not installed here. :func:`create_codeact_graph` is the same loop written with
LangGraph itself (model, then sandbox while the model writes code), taking the same ``eval_fn``; with
an older LangGraph, ``create_codeact(model, tools, PynoxEval(...))`` takes it unchanged.

With ``save_session=True`` the session's variables travel with the thread's checkpoint, as the messages
do: after each script the sandbox node saves the session (``pynox.Session.save``, serialized inside the
confined process) into the graph's ``pynox_session``, and a thread resumed where its session's process is
gone (a new pool, a restarted application, another thread ran in between) starts its session from it.
The pools must share a key (``[pool] session_key_file``) for a state to be taken by another pool.
"""

from __future__ import annotations

import inspect
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Annotated, Any, TypedDict, Unpack

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, SystemMessage
from langchain_core.runnables import RunnableConfig, RunnableLambda
from langchain_core.tools import BaseTool, StructuredTool
from langchain_core.tools import tool as make_langchain_tool
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages

from pynox import CodeTool, Grants, Pool, PynoxError, Result, check_grants

__all__ = ["CodeActState", "PynoxEval", "create_codeact_graph"]

_log = logging.getLogger(__name__)
_FENCED = re.compile(r"```[^\n`]*\n(.*?)```", re.DOTALL)


class PynoxEval:
    """Run CodeAct's scripts in one Pynox session, with the callables of the context as host functions.

    Arguments as for :func:`pynox_langchain.python_tool` (``pool``, ``profile``, grants). The session
    starts with the first script and keeps its variables until :meth:`close`; a context with other
    functions than the session's starts a new one. Call it (sync) or await :meth:`aeval`.
    ``last_result`` is the :class:`pynox.Result` of the latest script.
    """

    def __init__(self, pool: Pool | None = None, *, profile: str | None = None, **grants: Unpack[Grants]) -> None:
        check_grants("PynoxEval()", grants)
        self._pool = pool
        self._profile = profile
        self._grants = grants
        self._runner: CodeTool | None = None
        self._names: tuple[str, ...] = ()
        # Checked now, with no functions yet: a bad grant fails here, not at the model's first script.
        CodeTool(pool, profile=profile, **grants)
        self.last_result: Result | None = None
        self._restore: bytes | None = None  # a saved state the next session starts from
        self.thread: str | None = None  # the LangGraph thread whose state the session holds (save_session)

    @property
    def alive(self) -> bool:
        """Whether the session holds a process (and so the variables of the scripts so far)."""
        return self._runner is not None and self._runner.alive

    def save(self) -> bytes | None:
        """The session's variables (see :meth:`pynox.Session.save`), or None while it has no process."""
        saved = self._runner.save() if self._runner is not None else None
        return saved.data if saved is not None else None

    def restore(self, state: bytes) -> None:
        """End the session; the next script starts a new one from ``state`` (a :meth:`save`)."""
        self.close()
        self._restore = state

    def _runner_for(self, context: Mapping[str, Any]) -> tuple[CodeTool, dict[str, Callable[..., Any]]]:
        functions = {name: value for name, value in context.items() if callable(value) and name.isidentifier()}
        names = tuple(sorted(functions))
        if self._runner is None or names != self._names:
            self.close()
            self._runner = CodeTool(self._pool, profile=self._profile, session=True, functions=functions or None,
                                    host_globals="call" if functions else None, **self._grants)
            self._names = names
            state, self._restore = self._restore, None
            if state is not None:
                self._runner.restore(state)
        return self._runner, functions

    def __call__(self, code: str, context: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
        runner, functions = self._runner_for(context)
        self.last_result = runner.run(code, functions=functions or None)
        return self.last_result.text, {}

    async def aeval(self, code: str, context: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
        """:meth:`__call__`, awaitable (``create_codeact`` awaits a coroutine function)."""
        runner, functions = self._runner_for(context)
        self.last_result = await runner.arun(code, functions=functions or None)
        return self.last_result.text, {}

    def close(self) -> None:
        """End the session (its process and variables); the next script starts a fresh one."""
        runner, self._runner = self._runner, None
        if runner is not None:
            runner.close()


class CodeActState(TypedDict, total=False):
    messages: Annotated[list[AnyMessage], add_messages]
    script: str | None  # the code of the model's last message, if it wrote any
    failed: bool  # whether the last script failed (as its Result said), for the application to see
    # With save_session: the session's variables after the last script (pynox.Session.save), or None.
    pynox_session: bytes | None


def _tool_functions(tools: Sequence[BaseTool | Callable[..., Any]]) -> tuple[dict[str, Callable[..., Any]], str]:
    made = [t if isinstance(t, BaseTool) else make_langchain_tool(t) for t in tools]
    functions: dict[str, Callable[..., Any]] = {}
    lines: list[str] = []
    for tool in made:
        function = tool.func if isinstance(tool, StructuredTool) else None
        if function is None:
            raise TypeError(f"tool {tool.name!r} has no synchronous function for the code to call")
        functions[tool.name] = function
        lines.append(f"def {tool.name}{inspect.signature(function)}:\n    \"\"\"{tool.description}\"\"\"")
    return functions, "\n".join(lines)


def create_codeact_graph(model: BaseChatModel, tools: Sequence[BaseTool | Callable[..., Any]],
                         eval_fn: PynoxEval, *, prompt: str | None = None,
                         save_session: bool = False) -> StateGraph[Any]:
    """The CodeAct loop as a LangGraph ``StateGraph`` (compile it): the model answers; if its message has
    fenced code, ``eval_fn`` runs it with ``tools`` as functions and the output goes back to the model as
    the next message; a message without code ends the run. ``save_session``: the session's variables are
    saved in the graph's state (``pynox_session``) after each script, so they travel with the thread's
    checkpoint, and a thread resumed without its session's process gets them back."""
    functions, signatures = _tool_functions(tools)
    system = (f"{prompt}\n\n" if prompt else "") + (
        "Write Python in a fenced code block to act; print what you need to see. Variables persist between "
        "blocks. Answer in plain text, without a code block, when you are done.\n\nFunctions you can call "
        f"directly in the code:\n{signatures}")

    def call_model(state: CodeActState) -> dict[str, Any]:
        reply = model.invoke([SystemMessage(system), *state.get("messages", [])])
        text = reply.text if isinstance(reply, AIMessage) else str(reply.content)
        blocks = _FENCED.findall(text)
        return {"messages": [reply], "script": "\n\n".join(block.strip("\n") for block in blocks) or None}

    def resume(state: CodeActState, config: RunnableConfig | None) -> None:
        """With save_session: the session holds this thread's variables, from its checkpoint if need be."""
        if not save_session:
            return
        thread = ((config or {}).get("configurable") or {}).get("thread_id")
        thread = None if thread is None else str(thread)
        if eval_fn.thread == thread and eval_fn.alive:
            return
        saved = state.get("pynox_session")
        if saved is not None:
            eval_fn.restore(saved)
        else:
            eval_fn.close()
        eval_fn.thread = thread

    def observed(output: str) -> dict[str, Any]:
        failed = eval_fn.last_result is not None and not eval_fn.last_result.ok
        update: dict[str, Any] = {"messages": [HumanMessage(output)], "failed": failed}
        if save_session:
            try:
                update["pynox_session"] = eval_fn.save()
            except PynoxError as exc:  # over max_session_state, say: the thread's checkpoint keeps no state
                _log.warning("the session's state was not saved with the checkpoint: %s", exc)
                update["pynox_session"] = None
        return update

    def sandbox(state: CodeActState, config: RunnableConfig) -> dict[str, Any]:
        resume(state, config)
        return observed(eval_fn(state.get("script") or "", functions)[0])

    async def asandbox(state: CodeActState, config: RunnableConfig) -> dict[str, Any]:
        resume(state, config)
        return observed((await eval_fn.aeval(state.get("script") or "", functions))[0])

    def route(state: CodeActState) -> str:
        return "sandbox" if state.get("script") else END

    graph: StateGraph[Any] = StateGraph(CodeActState)
    graph.add_node("call_model", call_model)
    graph.add_node("sandbox", RunnableLambda(sandbox, afunc=asandbox))  # invoke and ainvoke
    graph.add_edge(START, "call_model")
    graph.add_conditional_edges("call_model", route, ["sandbox", END])
    graph.add_edge("sandbox", "call_model")
    return graph
