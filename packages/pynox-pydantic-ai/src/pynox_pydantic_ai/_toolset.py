"""``PynoxToolset`` and ``PynoxCapability``: Pynox's ``run_python`` as pydantic-ai expects a tool to come."""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic_ai import RunContext
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.tools import AgentDepsT
from pydantic_ai.toolsets import AbstractToolset, FunctionToolset

from pynox import CodeTool, Pool, Session

__all__ = ["PynoxCapability", "PynoxToolset"]


class PynoxToolset(FunctionToolset[AgentDepsT]):
    """A toolset with one tool, ``run_python(code: str) -> str``, whose code runs in Pynox.

    The tool is async and awaits :meth:`pynox.Pool.arun`, so no thread waits while the code runs.
    Permissions come from ``profile`` and ``grants`` (allow_read, allow_write, allow_network, env,
    timeout, memory, max_output, max_file_size, package_dirs), never from the model; ``functions``
    are host functions the code may call through ``pynox_host``. ``pool=None`` uses the default pool,
    started on the first call (never at import or here).

    ``session=True`` gives each agent run its own Pynox session (variables survive between the calls
    of one run) and ends it when the run ends; a :class:`pynox.Session` is shared by every run and
    stays yours to close. A failure of the code, and a refusal by Pynox, reach the model as the
    tool's text: they never abort the run.
    """

    def __init__(self, pool: Pool | None = None, *, profile: str | None = None, session: bool | Session = False,
                 functions: Mapping[str, Callable[..., Any]] | None = None, id: str | None = None,
                 max_retries: int | None = None, **grants: Any) -> None:
        super().__init__(id=id, max_retries=max_retries)
        self._runner = CodeTool(pool, profile=profile, session=session, functions=functions, **grants)
        self._add_run_python()

    def _add_run_python(self) -> None:
        runner = self._runner

        async def run_python(code: str) -> str:
            return await runner.atext(code)

        run_python.__doc__ = runner.doc
        # Calls into one session change its state: run them in the order the model made them, one at a time.
        self.add_function(run_python, takes_ctx=False, sequential=runner.uses_session)

    @property
    def description(self) -> str:
        """The tool's docstring, as the model reads it."""
        return self._runner.doc

    @property
    def model_instructions(self) -> str:
        """Instructions for the system prompt: the tool's name and what the code may touch."""
        rules = self._runner.description.rules
        return f"You can run Python code with the `run_python` tool. It runs in a sandbox the host set up.\n\n{rules}"

    async def for_run(self, ctx: RunContext[AgentDepsT]) -> AbstractToolset[AgentDepsT]:
        if not self._runner.owns_session:
            return self
        run = copy.copy(self)  # the same settings; its own session and a tool bound to it
        run._runner = self._runner.for_run()
        run.tools = {}
        run._add_run_python()
        return run

    async def __aexit__(self, *args: Any) -> bool | None:
        await self._runner.aclose()
        return await super().__aexit__(*args)


@dataclass
class PynoxCapability(AbstractCapability[AgentDepsT]):
    """A :class:`PynoxToolset` and instructions that tell the model what its code may touch.

        Agent(model, capabilities=[PynoxCapability(PynoxToolset(allow_read=["data"]))])

    ``instructions=None`` uses the toolset's :attr:`PynoxToolset.model_instructions`.
    """

    toolset: PynoxToolset[AgentDepsT]
    instructions: str | None = None

    @classmethod
    def get_serialization_name(cls) -> str | None:
        return None  # holds a pool and host functions: not expressible in an agent spec

    def get_toolset(self) -> PynoxToolset[AgentDepsT]:
        return self.toolset

    def get_instructions(self) -> str:
        return self.instructions if self.instructions is not None else self.toolset.model_instructions
