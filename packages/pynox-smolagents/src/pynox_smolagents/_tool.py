"""``python_tool()``: Pynox's ``run_python`` as a smolagents ``Tool`` (for ``ToolCallingAgent``, or any agent).

The tool is the core's :class:`pynox.CodeTool`: its description (what the code
may touch, written for the model) becomes the smolagents description, its
``code`` argument the only input, and its text result the observation. A run
that failed raises smolagents' ``InterpreterError`` with that same text, as
smolagents' own ``PythonInterpreterTool`` does: the agent records it as the
step's error (``step.error``, its error accounting and callbacks see it), shows
it to the model, and the model tries again.

``to_dict()`` (so ``save()``, ``push_to_hub()`` and an agent's ``save()``) writes
a subclass whose class attributes hold the grants; ``Tool.from_code`` builds
the same tool from it, with the same grants.
"""

from __future__ import annotations

import json
import textwrap
import weakref
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Unpack

from smolagents import Tool
from smolagents.local_python_executor import InterpreterError

import pynox
from pynox import check_grants

from ._settings import saved_grants

__all__ = ["PynoxTool", "python_tool"]

_CODE_INPUT = "Python source code to run, as a complete script."
_AGENT_SCOPE = "of this agent (no other agent sees its variables)"  # each agent holds its own copy: for_agent


class PynoxTool(Tool):
    """``run_python(code) -> str`` on a Pynox pool, as a smolagents tool. Build it with :func:`python_tool`.

    ``PynoxTool()`` with no tool builds its own from the class's :attr:`settings` (what a saved tool's
    code sets), on ``pool`` (default: Pynox's default pool) with any ``grants`` given here over the saved ones.
    """

    name = "run_python"
    description = "Run Python code in an isolated sandbox and return what it prints."
    # smolagents declares its tools' schema as class attributes; each instance sets its own in __init__.
    inputs = {"code": {"type": "string", "description": _CODE_INPUT}}  # noqa: RUF012
    output_type = "string"
    # What a saved tool is rebuilt from: {"session": bool, "grants": {...}} (see to_dict).
    settings: ClassVar[dict[str, Any]] = {}

    def __init__(self, code_tool: pynox.CodeTool | Callable[[str], str] | None = None, *,
                 pool: pynox.Pool | None = None, **grants: Unpack[pynox.Grants]) -> None:
        check_grants(f"{type(self).__name__}()", grants)
        if code_tool is None:
            saved = type(self).settings
            session = bool(saved.get("session", False))
            code_tool = pynox.CodeTool(pool, session=session, session_scope=_AGENT_SCOPE if session else None,
                                       **{**saved.get("grants", {}), **grants})
        elif pool is not None or grants:
            raise TypeError("PynoxTool takes a tool, or a pool and grants to build one from: not both")
        # A run_python made by pynox.tool() or Pool.tool() carries the tool object it runs over.
        code_tool = getattr(code_tool, "code_tool", code_tool)
        if not isinstance(code_tool, pynox.CodeTool):
            raise TypeError("PynoxTool takes a pynox.CodeTool, or a run_python made by pynox.tool() or Pool.tool(); "
                            f"got {type(code_tool).__name__}")
        self.code_tool = code_tool
        # Per instance: the description states this tool's own grants (what @tool takes from a docstring:
        # everything before its Args section).
        parts = code_tool.description
        self.description = f"{parts.summary}\n\n{parts.body}"
        self.inputs = {"code": {"type": "string", "description": parts.code}}
        super().__init__()
        self.is_initialized = True  # nothing to set up: the pool starts on the first call

    def for_agent(self, agent: Any) -> PynoxTool:
        """The tool as ``agent`` holds it: this one, or, if it owns a session, a copy with a session of its own
        (ended when the agent is gone), so one tool given to two agents never shares their variables."""
        if not self.code_tool.owns_session:
            return self
        runner = self.code_tool.for_run()
        own = type(self)(runner)
        weakref.finalize(agent, runner.close)
        return own

    def forward(self, code: str) -> str:
        if not isinstance(code, str):
            raise InterpreterError(f"code must be a string of Python source, got {type(code).__name__}")
        try:
            result = self.code_tool.run(code)
        except pynox.PynoxError as exc:  # a refusal or a broken pool: the model reads it as the step's error
            raise InterpreterError(f"{type(exc).__name__}: {exc}") from None
        if not result.ok:
            raise InterpreterError(result.text)
        return result.text

    def to_dict(self) -> dict[str, Any]:
        """The tool as smolagents saves tools: code that defines it (here, a subclass holding the grants).

        Host functions cannot be saved (they are code), nor ``env`` (its values may be credentials): a tool
        with either raises ``ValueError``; pass them again when loading (``Tool.from_code(code, env=...)``).
        """
        if self.code_tool.functions:
            raise ValueError(f"a run_python tool with host functions ({', '.join(self.code_tool.functions)}) "
                             "cannot be saved: they are code; make them smolagents tools of the agent instead")
        settings = {"session": self.code_tool.owns_session,
                    "grants": saved_grants(self.code_tool.requested, "run_python")}
        code = textwrap.dedent(f"""\
            import pynox_smolagents


            class SavedRunPython(pynox_smolagents.PynoxTool):
                name = {json.dumps(self.name)}
                description = {json.dumps(self.description)}
                inputs = {self.inputs!r}
                output_type = {json.dumps(self.output_type)}
                settings = {settings!r}
            """)
        return {"name": self.name, "code": code, "requirements": ["pynox_smolagents", "smolagents"]}


def python_tool(pool: pynox.Pool | None = None, *, profile: str | None = None, session: bool = False,
                functions: Mapping[str, Callable[..., Any]] | None = None,
                **grants: Unpack[pynox.Grants]) -> PynoxTool:
    """A smolagents tool named ``run_python`` that runs the model's code on ``pool`` (default: Pynox's default
    pool, started on the first call).

    Permissions come from ``profile`` and ``grants`` (allow_read, allow_write, allow_network, allow_hosts, timeout,
    memory, ...), fixed here; ``session=True`` keeps variables between calls; ``functions`` are host functions the code
    imports from ``pynox_host``. A bad grant raises here, before any agent runs.
    """
    check_grants("python_tool()", grants)
    return PynoxTool(pynox.CodeTool(pool, profile=profile, session=session, functions=functions,
                                    session_scope=_AGENT_SCOPE if session else None, **grants))
