"""``PynoxCodeMode``: the agent's tools as awaitable functions of one ``run_code`` tool, on full CPython.

The shape of pydantic-ai-harness's ``CodeMode``: the selected tools leave the model's tool list
and become coroutine globals of the code ``run_code`` runs (also importable from
``pynox_host.aio``), so the model orchestrates them in one step, with loops, conditions and
``asyncio.gather``, and the code's trailing expression is the tool's result. The code runs in a
Pynox job under the grants given here, so ``import pandas`` works where Monty could not.

Each call the code makes goes back through pydantic-ai's own machinery, a ``ToolManager`` over the
agent's tools with the run's capabilities: its arguments are validated against the tool's schema,
the run's hooks and tracing see it, the tool gets the run's context (deps, usage), and a
``ModelRetry`` it raises makes ``run_code`` itself a retry for the model. ``max_tool_calls`` bounds the calls of one
``run_code``: the one past it fails in the sandbox with ``HostError``.

The ``run_code`` calls of one agent run share one Pynox session, as the harness's ``CodeMode`` keeps its
state: variables, imports and functions survive from call to call, and the session ends with the run (a
cancelled run's code is stopped at once). The description tells the model so, and what the code may touch.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Unpack

from pydantic import ValidationError
from pydantic_ai import BinaryContent, ModelRetry, RunContext, ToolFailed, ToolReturn
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.messages import ToolCallPart
from pydantic_ai.tool_manager import ToolManager
from pydantic_ai.tools import AgentDepsT, ToolDefinition
from pydantic_ai.toolsets import AbstractToolset, FunctionToolset, ToolsetTool, WrapperToolset
from pydantic_core import to_jsonable_python

import pynox
from pynox import Grants, HostError, Pool, PynoxError, SessionRunner, check_grants

from ._toolset import stop_running

__all__ = ["PynoxCodeMode"]

ToolSelector = Literal["all"] | Sequence[str] | Callable[[RunContext[Any], ToolDefinition], bool]
RUN_CODE = "run_code"
_TYPES = {"string": "str", "integer": "int", "number": "float", "boolean": "bool", "array": "list",
          "object": "dict", "null": "None"}


def _signature(definition: ToolDefinition) -> str:
    """How the code calls a tool: its JSON schema's properties as Python parameters."""
    schema = definition.parameters_json_schema
    required = set(schema.get("required", ()))
    params = []
    for name, prop in schema.get("properties", {}).items():
        kind = _TYPES.get(str(prop.get("type")), "object") if isinstance(prop, dict) else "object"
        params.append(f"{name}: {kind}" + ("" if name in required else " = ..."))
    summary = (definition.description or "").strip().split("\n\n")[0].replace("\n", " ")
    return f"async {definition.name}({', '.join(params)})" + (f": {summary}" if summary else "")


@dataclass(init=False)
class PynoxCodeMode(AbstractCapability[AgentDepsT]):
    """Wrap the agent's selected tools (``tools``: ``"all"``, a list of names, or a predicate of the run
    context and the tool definition) into one ``run_code(code: str)`` tool whose code runs in Pynox.

        Agent(model, tools=[get_weather], capabilities=[PynoxCodeMode(allow_read=["data"])])

    ``pool=None`` uses the default pool. ``grants`` are Pynox's (allow_read, timeout, memory...);
    ``max_tool_calls`` bounds the tool calls of one ``run_code`` (None: Pynox's own 1,000);
    ``max_retries`` is ``run_code``'s own retry budget.
    """

    pool: Pool | None = None
    tools: ToolSelector = "all"
    max_tool_calls: int | None = None
    max_retries: int = 1
    grants: Grants = field(default_factory=lambda: Grants())

    def __init__(self, pool: Pool | None = None, *, tools: ToolSelector = "all", max_tool_calls: int | None = None,
                 max_retries: int = 1, **grants: Unpack[Grants]) -> None:
        check_grants("PynoxCodeMode()", grants)
        if max_tool_calls is not None and max_tool_calls < 0:
            raise ValueError(f"max_tool_calls must be at least 0, got {max_tool_calls}")
        self.pool, self.tools, self.max_tool_calls, self.max_retries = pool, tools, max_tool_calls, max_retries
        self.grants = grants
        # Checked now, as any Pynox tool checks its grants when it is made (a bad unit fails here).
        self._tool = pynox.CodeTool(pool, **grants)

    @classmethod
    def get_serialization_name(cls) -> str | None:
        return None  # holds a pool: not expressible in an agent spec

    def get_wrapper_toolset(self, toolset: AbstractToolset[AgentDepsT]) -> AbstractToolset[AgentDepsT] | None:
        return _CodeModeToolset(toolset, self)

    def selects(self, ctx: RunContext[Any], definition: ToolDefinition) -> bool:
        if definition.name == RUN_CODE:
            return False
        if self.tools == "all":
            return True
        if callable(self.tools):
            return bool(self.tools(ctx, definition))
        return definition.name in self.tools


@dataclass
class _RunState:
    """What the ``run_code`` calls of one agent run share: their session, and the calls in flight."""

    session: SessionRunner | None = None
    names: frozenset[str] = frozenset()  # the host functions the session was started with
    running: set[asyncio.Task[Any]] = field(default_factory=set)

    async def end(self) -> None:
        """Stop the calls still running (their jobs are killed, not waited for), then end the session."""
        await stop_running(self.running)
        session, self.session = self.session, None
        if session is not None:
            await session.aclose()


@dataclass
class _CodeModeToolset(WrapperToolset[AgentDepsT]):
    """The agent's toolset with the selected tools behind ``run_code``; the others stay as they are."""

    mode: PynoxCodeMode[AgentDepsT]
    # The run's shared state (set by for_run; a step's copy of this toolset shares it).
    run: _RunState | None = None
    # The run_code tool of the latest get_tools (its functions are the tools selected then).
    _own: FunctionToolset[AgentDepsT] | None = field(default=None, init=False, repr=False)

    async def for_run(self, ctx: RunContext[AgentDepsT]) -> AbstractToolset[AgentDepsT]:
        run = await super().for_run(ctx)
        assert isinstance(run, _CodeModeToolset)  # WrapperToolset.for_run gives self or a replace() of it
        return replace(run, run=_RunState())

    async def __aexit__(self, *args: Any) -> bool | None:
        if self.run is not None:
            await self.run.end()
        return await super().__aexit__(*args)

    async def get_tools(self, ctx: RunContext[AgentDepsT]) -> dict[str, ToolsetTool[AgentDepsT]]:
        inner = await self.wrapped.get_tools(ctx)
        selected = {name: tool for name, tool in inner.items() if self.mode.selects(ctx, tool.tool_def)}
        kept = {name: tool for name, tool in inner.items() if name not in selected}
        if not selected:
            return kept
        own = FunctionToolset[AgentDepsT](max_retries=self.mode.max_retries)
        own.add_function(self._run_code(selected), name=RUN_CODE, takes_ctx=True,
                         description=self._description(selected))
        self._own = own
        return {**kept, **await own.get_tools(ctx)}

    async def call_tool(self, name: str, tool_args: dict[str, Any], ctx: RunContext[AgentDepsT],
                        tool: ToolsetTool[AgentDepsT]) -> Any:
        if name == RUN_CODE and self._own is not None:
            return await self._own.call_tool(name, tool_args, ctx, tool)
        return await self.wrapped.call_tool(name, tool_args, ctx, tool)

    def _description(self, selected: dict[str, ToolsetTool[AgentDepsT]]) -> str:
        lines = [_signature(tool.tool_def) for tool in selected.values()]
        cap = (f" At most {self.mode.max_tool_calls} function calls per run." if self.mode.max_tool_calls is not None
               else "")
        rules = self.mode._tool.description
        return ("Run Python code (full CPython, in an isolated sandbox) that calls these functions. They are "
                "async globals of the code: await them, or run several at once with `await asyncio.gather(...)`; "
                "the code may await at top level. The value of the code's last expression is the result; "
                f"print() what else you need.{cap}\n\n" + "\n".join(f"- {line}" for line in lines) +
                "\n\nThe run_code calls of this run share one Python process, like notebook cells: variables, "
                "imports and functions defined in one call are there in the next. A new run starts fresh, and so "
                "does the call after one that timed out or crashed (its result says so).\n\n"
                "What the code may do:\n" + "\n".join(f"- {line}" for line in rules.permissions) +
                f"\n\n{rules.closing}")

    def _run_code(self, selected: dict[str, ToolsetTool[AgentDepsT]]) -> Callable[..., Any]:
        mode, wrapped = self.mode, self.wrapped

        state = self.run if self.run is not None else _RunState()  # no for_run: this call's alone

        async def run_code(ctx: RunContext[AgentDepsT], code: str) -> ToolReturn:
            calls = {"made": 0}
            retries: list[str] = []
            # A tool manager of the agent's own kind over its unwrapped tools: validation, the run's
            # capability hooks (tracing among them) and retry counting, as for the model's own calls.
            manager = await ToolManager[AgentDepsT](wrapped, root_capability=ctx.root_capability).for_run_step(ctx)
            functions = {name: _dispatcher(name, tool, manager, mode.max_tool_calls, calls, retries)
                         for name, tool in selected.items()}
            task = asyncio.current_task()
            if task is not None:
                state.running.add(task)
            try:
                session = await _session_for(state, mode, functions)
                result = await session.arun(code, functions=functions)
            except PynoxError as exc:
                raise ToolFailed(f"{type(exc).__name__}: {exc}") from exc
            finally:
                if task is not None:
                    state.running.discard(task)
            if retries:  # a tool asked the model to try again: so does run_code, with its words
                raise ModelRetry(retries[0])
            if not result.ok:
                raise ToolFailed(result.text)
            images = [BinaryContent(data, media_type=mime) for data, mime in result.displayed_images]
            return ToolReturn(return_value=[result.text, *images] if images else result.text, metadata=result)

        run_code.__doc__ = "Run code.\n\nArgs:\n    code: Python source code to run."
        return run_code


async def _session_for(state: _RunState, mode: PynoxCodeMode[Any], functions: dict[str, Callable[..., Any]]
                       ) -> SessionRunner:
    """The run's session, started on its first call; a call with other tools selected needs a new process (the
    pool fixes a session's host functions when it starts)."""
    names = frozenset(functions)
    if state.session is not None and state.names != names:
        session, state.session = state.session, None
        await session.aclose()
    if state.session is None:
        pool = await asyncio.to_thread(lambda: mode._tool.pool)  # the default pool starts here, off the loop
        state.session = pool.session(functions=functions, host_globals="await", **mode.grants)
        state.names = names
    return state.session


def _dispatcher(name: str, tool: ToolsetTool[Any], manager: ToolManager[Any], limit: int | None,
                calls: dict[str, int], retries: list[str]) -> Callable[..., Any]:
    """The host function the code's ``await name(...)`` reaches: the agent's own tool, through a tool manager."""
    properties = list(tool.tool_def.parameters_json_schema.get("properties", {}))

    async def call(*args: Any, **kwargs: Any) -> Any:
        if len(args) > len(properties):
            raise HostError(f"{name}() takes at most {len(properties)} positional arguments")
        arguments = {**dict(zip(properties, args, strict=False)), **kwargs}
        calls["made"] += 1
        if limit is not None and calls["made"] > limit:
            raise HostError(f"{name}(): this code reached its limit of {limit} tool calls")
        try:
            value = await manager.handle_call(ToolCallPart(name, arguments), wrap_validation_errors=False)
        except ModelRetry as exc:
            retries.append(f"{name}(): {exc.message}")
            raise HostError(f"{name}(): {exc.message}") from None
        except ValidationError as exc:  # the code passed what the tool does not take
            raise HostError(f"{name}(): invalid arguments: {exc}") from None
        if isinstance(value, ToolReturn):
            value = value.return_value
        return to_jsonable_python(value)  # a model or a dataclass a tool returns, as JSON for the code

    call.__name__ = name
    call.__signature__ = inspect.Signature([inspect.Parameter("args", inspect.Parameter.VAR_POSITIONAL),  # type: ignore[attr-defined]
                                            inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD)])
    return call
