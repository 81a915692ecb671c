"""Pynox for LangChain and LangGraph: a ``run_python`` ``BaseTool`` and a CodeAct path.

    from pynox_langchain import python_tool, PynoxEval, create_codeact_graph

    run_python = python_tool(allow_read=["data"], timeout="10s")       # sync and async
    graph = create_codeact_graph(model, [search, price], PynoxEval()).compile()

A failed run reaches the model as an error: invoked with a tool call, the tool returns a
``ToolMessage`` with ``status="error"``. Importing this module starts nothing: the pool starts on
the first call.
"""

from __future__ import annotations

from ._codeact import CodeActState, PynoxEval, create_codeact_graph
from ._tool import PynoxTool, content_blocks, python_tool

__all__ = ["CodeActState", "PynoxEval", "PynoxTool", "content_blocks", "create_codeact_graph", "python_tool"]
