"""``python_tool``: Pynox's ``run_python`` as a LangChain ``BaseTool``, failing as LangChain's tools fail.

* A failed run (an exception, a non-zero exit, a timeout, a denial, a refusal by Pynox) raises
  ``ToolException`` with the text the model reads, and the tool handles it as LangChain does
  (``handle_tool_error=True``): invoked with a tool call, the tool returns a ``ToolMessage`` with
  ``status="error"``, so LangGraph's ``ToolNode``, callbacks and tracing see a failure.
* A good run is ``content_and_artifact``: the text (and each figure and displayed image as an ``image``
  content block) for the model, the :class:`pynox.Result` as the message's ``artifact``.
* Output as it happens: in a LangGraph node whose graph streams ``"custom"``, each chunk of output and each
  display output goes to the graph's stream writer while the code runs, as the protocol's events
  (``{"event": "stream", "name", "text"}``, ``{"event": "display_data", "data", "metadata"}``).
* ``invoke`` runs the job synchronously, ``ainvoke`` awaits ``Pool.arun``.
* ``session=True``: variables survive between calls. State is scoped as LangGraph scopes it: each
  thread (``configurable.thread_id``) has a session of its own; calls outside a thread share the
  tool's. :meth:`PynoxTool.close` ends them all.
"""

from __future__ import annotations

import base64
import threading
from collections.abc import Callable, Mapping
from typing import Any, Literal, Unpack

from langchain_core.callbacks import AsyncCallbackManagerForToolRun, CallbackManagerForToolRun
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool, ToolException
from pydantic import BaseModel, Field, PrivateAttr

from pynox import CodeTool, Grants, OutputEvent, Pool, PynoxError, Result, Session, StreamText, check_grants

__all__ = ["PynoxTool", "content_blocks", "python_tool"]


class RunPythonInput(BaseModel):
    code: str = Field(description="Python source code to run, as a complete script.")


def content_blocks(result: Result) -> str | list[str | dict[str, Any]]:
    """What the model reads of a run: its text, and, if the code drew figures or displayed images, a text
    block and one ``image`` block (base64) per image, in order, in LangChain's standard content blocks."""
    images = result.displayed_images
    if not images:
        return result.text
    return [{"type": "text", "text": result.text},
            *({"type": "image", "base64": base64.b64encode(data).decode(), "mime_type": mime}
              for data, mime in images)]


def _stream_writer() -> Callable[[OutputEvent], None] | None:
    """Where this call's output goes as it happens: the stream writer of the LangGraph node it runs in, when
    the graph streams custom events; None elsewhere (the run then does not stream, and pays nothing)."""
    try:
        from langgraph.config import get_stream_writer

        writer = get_stream_writer()
    except (ImportError, RuntimeError, KeyError):  # not in a graph's node
        return None
    if getattr(writer, "__name__", "") == "_no_op_stream_writer":  # the graph does not stream custom events
        return None

    def write(event: OutputEvent) -> None:
        if isinstance(event, StreamText):
            writer({"event": "stream", "name": event.name, "text": event.text})
        else:
            writer({"event": "display_data", "data": dict(event.data), "metadata": dict(event.metadata)})

    return write


class PynoxTool(BaseTool):
    """``run_python(code)`` on Pynox; make one with :func:`python_tool`."""

    name: str = "run_python"
    description: str = ""
    args_schema: type[BaseModel] = RunPythonInput
    response_format: Literal["content", "content_and_artifact"] = "content_and_artifact"
    handle_tool_error: bool = True
    _runner: CodeTool = PrivateAttr()
    _threads: dict[str, CodeTool] = PrivateAttr(default_factory=dict)
    _lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)

    def __init__(self, runner: CodeTool, **kwargs: Any) -> None:
        super().__init__(description=runner.doc, **kwargs)
        self._runner = runner

    @property
    def runner(self) -> CodeTool:
        """The core tool calls run through (its :attr:`~pynox.CodeTool.grants`, its description)."""
        return self._runner

    def _for(self, config: RunnableConfig | None) -> CodeTool:
        thread = ((config or {}).get("configurable") or {}).get("thread_id")
        if not self._runner.owns_session or thread is None:
            return self._runner
        with self._lock:
            runner = self._threads.get(str(thread))
            if runner is None:
                runner = self._threads[str(thread)] = self._runner.for_run()
        return runner

    def _run(self, code: str, config: RunnableConfig,
             run_manager: CallbackManagerForToolRun | None = None) -> tuple[Any, Result]:
        try:
            result = self._for(config).run(code, on_output=_stream_writer())
        except PynoxError as exc:  # a refusal or a broken pool: the model reads it, the graph goes on
            raise ToolException(f"{type(exc).__name__}: {exc}") from exc
        return _outcome(result)

    async def _arun(self, code: str, config: RunnableConfig,
                    run_manager: AsyncCallbackManagerForToolRun | None = None) -> tuple[Any, Result]:
        try:
            result = await self._for(config).arun(code, on_output=_stream_writer())
        except PynoxError as exc:
            raise ToolException(f"{type(exc).__name__}: {exc}") from exc
        return _outcome(result)

    def close(self) -> None:
        """End every session this tool started (the tool's own and each thread's); the next call starts anew."""
        with self._lock:
            runners, self._threads = list(self._threads.values()), {}
        for runner in [*runners, self._runner]:
            runner.close()

    async def aclose(self) -> None:
        """:meth:`close`, without holding up the event loop."""
        with self._lock:
            runners, self._threads = list(self._threads.values()), {}
        for runner in [*runners, self._runner]:
            await runner.aclose()


def _outcome(result: Result) -> tuple[Any, Result]:
    if not result.ok:
        raise ToolException(result.text)
    return content_blocks(result), result


def python_tool(pool: Pool | None = None, *, profile: str | None = None, session: bool | Session = False,
                functions: Mapping[str, Callable[..., Any]] | None = None, **grants: Unpack[Grants]) -> PynoxTool:
    """A LangChain tool ``run_python(code: str)`` whose code runs in Pynox.

    Permissions come from ``profile`` and ``grants`` (allow_read, allow_write, allow_network, allow_hosts, env,
    timeout, memory, max_output, max_file_size, package_dirs), never from the model; ``functions`` are
    host functions the code may call through ``pynox_host``. ``pool=None`` uses the default pool,
    started on the first call (never here). ``session=True`` keeps variables between calls, one
    session per LangGraph thread; a :class:`pynox.Session` is shared as it is and stays yours to close.
    """
    check_grants("python_tool()", grants)
    return PynoxTool(CodeTool(pool, profile=profile, session=session, functions=functions, **grants))
