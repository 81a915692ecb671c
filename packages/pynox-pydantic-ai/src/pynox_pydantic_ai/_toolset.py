"""``PynoxToolset`` and ``PynoxCapability``: Pynox's ``run_python`` as pydantic-ai's own tools behave.

* A run whose code failed raises ``ToolFailed`` with the text the model reads: pydantic-ai records a
  failed tool part (the provider's native error channel) and no retry is consumed. A good run returns
  a ``ToolReturn``: the text and its images, figures and displayed ones (``BinaryContent``) for the model, the
  :class:`pynox.Result` as ``metadata`` for the application.
* Host functions are written as pydantic-ai tools are: a first parameter annotated ``RunContext[...]``
  receives the current run's context (hidden from the model's signature), ``async def`` ones are
  awaited on the agent's loop, and pydantic-ai ``Tool`` objects are accepted as they are. Each call
  is a span of the run's tracer, under the ``run_python`` call that made it, as a nested tool call is.
* The permissions are stated once: in the tool's description, or, under :class:`PynoxCapability`, in
  the instructions only.
* A host function that raises ``ModelRetry`` makes ``run_python`` a retry for the model, with its message,
  as a tool of the agent's own would; the code sees a ``HostError`` with the same message.
* ``session=True`` keeps state for one agent run, and nothing is left running after it. A conversation
  continued in a later run (``message_history``) starts in a fresh process: the description says so, and
  the first result of such a run tells the model its earlier variables are gone. A cancelled run
  (``task.cancel()``, ``asyncio.wait_for``) stops its running code: a session's step is interrupted
  (``KeyboardInterrupt``) and killed if it does not stop within the pool's grace, and the session ends
  with the run.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import inspect
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Unpack

from opentelemetry import context as otel_context
from pydantic_ai import BinaryContent, ModelRetry, RunContext, Tool, ToolFailed, ToolReturn
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.messages import ToolCallPart
from pydantic_ai.tools import AgentDepsT
from pydantic_ai.toolsets import AbstractToolset, FunctionToolset

from pynox import CodeTool, Grants, HostError, Pool, PynoxError, Session, check_grants

__all__ = ["PynoxCapability", "PynoxToolset"]

HostFunctions = Mapping[str, "Callable[..., Any] | Tool[Any]"] | Iterable["Tool[Any]"]
_RUN_SCOPE = ("within one agent run (this message and the calls it leads to; the next message starts in a fresh "
              "process, even in the same conversation)")
_STATE_GONE = ("[A fresh process: variables, imports and functions from earlier messages of this conversation are "
               "gone; define again what you need.]")


class _NoContext:
    """Stands for the run context in a host function's signature until a call binds the real one."""


def _takes_context(function: Callable[..., Any]) -> bool:
    """Whether ``function``'s first parameter is annotated ``RunContext[...]``, as pydantic-ai decides it."""
    try:
        parameters = list(inspect.signature(function).parameters.values())
    except (TypeError, ValueError):
        return False
    if not parameters:
        return False
    annotation: Any = parameters[0].annotation
    try:
        annotation = typing.get_type_hints(function).get(parameters[0].name, annotation)
    except Exception:  # an annotation that does not resolve here: read it as written
        pass
    if isinstance(annotation, str):
        return annotation.split("[", 1)[0].rsplit(".", 1)[-1] == "RunContext"
    return annotation is RunContext or typing.get_origin(annotation) is RunContext


def _described(function: Callable[..., Any], description: str | None) -> Callable[..., Any]:
    """``function`` with ``description`` as the docstring the model reads."""
    if not description:
        return function

    @functools.wraps(function)
    def call(*args: Any, **kwargs: Any) -> Any:
        return function(*args, **kwargs)

    call.__doc__ = description
    return call


def _host_functions(functions: HostFunctions | None) -> tuple[dict[str, Callable[..., Any]], dict[str, bool]]:
    """The host functions by name, and for each whether it takes the run context."""
    if functions is None:
        return {}, {}
    items = functions.items() if isinstance(functions, Mapping) else ((tool.name, tool) for tool in functions)
    callables: dict[str, Callable[..., Any]] = {}
    context: dict[str, bool] = {}
    for name, value in items:
        if isinstance(value, Tool):
            callables[name] = _described(value.function, value.description)
            context[name] = value.takes_ctx
        elif callable(value):
            callables[name] = value
            context[name] = _takes_context(value)
        else:
            raise TypeError(f"host function {name!r} must be a callable or a pydantic-ai Tool, got "
                            f"{type(value).__name__}")
    return callables, context


def _traced(name: str, function: Callable[..., Any], ctx: RunContext[Any],
            parent: otel_context.Context, retries: list[str]) -> Callable[..., Any]:
    """``function``, each call a span of the run's tracer (a no-op tracer when the agent is not instrumented); a
    ``ModelRetry`` it raises is kept in ``retries`` for the model and reaches the code as a ``HostError`` with its
    message."""
    attributes = {"pynox.host_function": name, "gen_ai.tool.name": name}

    if inspect.iscoroutinefunction(getattr(function, "func", function)):
        async def traced_async(*args: Any, **kwargs: Any) -> Any:
            with ctx.tracer.start_as_current_span(f"pynox host call {name}", context=parent, attributes=attributes):
                try:
                    return await function(*args, **kwargs)
                except ModelRetry as exc:
                    retries.append(f"{name}(): {exc.message}")
                    raise HostError(f"{name}(): {exc.message}") from None

        traced: Callable[..., Any] = traced_async
    else:
        def traced_sync(*args: Any, **kwargs: Any) -> Any:
            with ctx.tracer.start_as_current_span(f"pynox host call {name}", context=parent, attributes=attributes):
                try:
                    return function(*args, **kwargs)
                except ModelRetry as exc:
                    retries.append(f"{name}(): {exc.message}")
                    raise HostError(f"{name}(): {exc.message}") from None

        traced = traced_sync
    traced.__signature__ = inspect.signature(function)  # type: ignore[attr-defined]  # what the job may pass
    traced.__doc__ = getattr(function, "__doc__", None)
    return traced


class PynoxToolset(FunctionToolset[AgentDepsT]):
    """A toolset with one tool, ``run_python(code: str)``, whose code runs in Pynox.

    The tool is async and awaits :meth:`pynox.Pool.arun`, so no thread waits while the code runs.
    Permissions come from ``profile`` and ``grants`` (allow_read, allow_write, allow_network, allow_hosts, env,
    timeout, memory, max_output, max_file_size, package_dirs), never from the model; ``functions``
    are host functions the code may call through ``pynox_host`` (callables or pydantic-ai ``Tool``
    objects, by name or as a list of tools). ``pool=None`` uses the default pool, started on the first
    call (never at import or here).

    ``session=True`` gives each agent run its own Pynox session (variables survive between the calls
    of one run) and ends it when the run ends; a run that continues a conversation starts fresh, and the
    model is told so. A :class:`pynox.Session` is shared by every run and stays yours to close.
    """

    def __init__(self, pool: Pool | None = None, *, profile: str | None = None, session: bool | Session = False,
                 functions: HostFunctions | None = None, id: str | None = None, max_retries: int | None = None,
                 **grants: Unpack[Grants]) -> None:
        check_grants("PynoxToolset()", grants)
        super().__init__(id=id, max_retries=max_retries)
        callables, self._takes_context = _host_functions(functions)
        # The tool's own view of each function: one that takes the run context has it bound, so the
        # signature the model reads (and the arguments the job may pass) leave it out.
        shown = {name: functools.partial(fn, _NoContext()) if self._takes_context[name] else fn
                 for name, fn in callables.items()}
        self._callables = callables
        self._runner = CodeTool(pool, profile=profile, session=session, functions=shown or None,
                                session_scope=_RUN_SCOPE if session is True else None, **grants)
        self._running: set[asyncio.Task[Any]] = set()  # this run's run_python calls in flight
        self._state_gone = False  # the run continues a conversation whose code ran: its first result says so
        self.permissions_in_instructions = False
        self._add_run_python()

    def _for_call(self, ctx: RunContext[AgentDepsT], retries: list[str]) -> dict[str, Callable[..., Any]] | None:
        """This call's host functions: the run context bound where one is taken, each call traced."""
        parent = otel_context.get_current()  # the run_python call's span: host calls nest under it
        bound = {name: _traced(name, functools.partial(fn, ctx) if self._takes_context[name] else fn, ctx, parent,
                               retries)
                 for name, fn in self._callables.items()}
        return bound or None

    def _add_run_python(self) -> None:
        runner = self._runner

        async def run_python(ctx: RunContext[AgentDepsT], code: str) -> ToolReturn:
            retries: list[str] = []
            task = asyncio.current_task()
            if task is not None:
                self._running.add(task)
            try:
                result = await runner.arun(code, functions=self._for_call(ctx, retries))
            except PynoxError as exc:  # a refusal or a broken pool: the model reads it, the run goes on
                raise ToolFailed(f"{type(exc).__name__}: {exc}") from exc
            finally:
                if task is not None:
                    self._running.discard(task)
            note, self._state_gone = (f"{_STATE_GONE}\n" if self._state_gone else ""), False
            if retries:  # a host function asked the model to try again: so does run_python, with its words
                raise ModelRetry(note + retries[0])
            if not result.ok:
                raise ToolFailed(note + result.text)
            images = [BinaryContent(data, media_type=mime) for data, mime in result.displayed_images]
            text = note + result.text
            return ToolReturn(return_value=[text, *images] if images else text, metadata=result)

        # The description is given whole below; the docstring gives the argument's (no Returns: section,
        # which pydantic-ai would render as <returns> markup).
        run_python.__doc__ = f"{runner.description.summary}\n\nArgs:\n    code: {runner.description.code}"
        # Calls into one session change its state: run them in the order the model made them, one at a time.
        self.tools.pop("run_python", None)
        self.add_function(run_python, takes_ctx=True, sequential=runner.uses_session, description=self.description)

    @property
    def description(self) -> str:
        """The tool's description, as the model reads it (the permissions too, unless the instructions say them)."""
        parts = self._runner.description
        body = [parts.summary, parts.usage]
        if not self.permissions_in_instructions:
            body.append(parts.rules)
        elif parts.functions:
            body.append("\n".join([parts.functions_intro, *(f"- {line}" for line in parts.functions)]))
        return "\n\n".join(body)

    @property
    def model_instructions(self) -> str:
        """Instructions for the system prompt: the tool's name and what the code may touch."""
        rules = self._runner.description.rules
        return f"You can run Python code with the `run_python` tool. It runs in a sandbox the host set up.\n\n{rules}"

    def state_permissions_in_instructions(self) -> None:
        """The instructions carry the permissions (:class:`PynoxCapability`): the tool's description leaves
        them out."""
        self.permissions_in_instructions = True
        self._add_run_python()

    async def for_run(self, ctx: RunContext[AgentDepsT]) -> AbstractToolset[AgentDepsT]:
        run = copy.copy(self)  # the same settings; its own calls in flight and, if owned, its own session
        run._running = set()
        if self._runner.owns_session:
            run._runner = self._runner.for_run()
            run._state_gone = any(isinstance(part, ToolCallPart) and part.tool_name == "run_python"
                                  for message in ctx.messages for part in message.parts)
        run.tools = {}
        run._add_run_python()
        return run

    async def __aexit__(self, *args: Any) -> bool | None:
        # pydantic-ai leaves the toolset while a cancelled run's calls may still be running: stop them now
        # (their jobs are killed, and a session's process with its step), not when their code ends.
        await stop_running(self._running)
        await self._runner.aclose()
        return await super().__aexit__(*args)


@dataclass
class PynoxCapability(AbstractCapability[AgentDepsT]):
    """A :class:`PynoxToolset` and instructions that tell the model what its code may touch.

        Agent(model, capabilities=[PynoxCapability(PynoxToolset(allow_read=["data"]))])

    ``instructions=None`` uses the toolset's :attr:`PynoxToolset.model_instructions`, and the tool's
    description then leaves the permissions to them (each said once).
    """

    toolset: PynoxToolset[AgentDepsT]
    instructions: str | None = None

    def __post_init__(self) -> None:
        if self.instructions is None:
            self.toolset.state_permissions_in_instructions()

    @classmethod
    def get_serialization_name(cls) -> str | None:
        return None  # holds a pool and host functions: not expressible in an agent spec

    def get_toolset(self) -> PynoxToolset[AgentDepsT]:
        return self.toolset

    def get_instructions(self) -> str:
        return self.instructions if self.instructions is not None else self.toolset.model_instructions


async def stop_running(tasks: Iterable[asyncio.Task[Any]]) -> None:
    """Cancel the calls still running, other than the caller's own, and wait until each has ended: a cancelled
    call kills its job, so none is waited for to its end."""
    current = asyncio.current_task()
    running = [task for task in tasks if task is not current and not task.done()]
    for task in running:
        task.cancel()
    if running:
        await asyncio.gather(*running, return_exceptions=True)
