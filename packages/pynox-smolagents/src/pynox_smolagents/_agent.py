"""``PynoxCodeAgent``: a ``CodeAgent`` whose code runs in Pynox, and that says so, shows figures, saves and loads.

smolagents picks a ``CodeAgent``'s executor by ``executor_type`` and saves that
name in ``agent.json``. A plain ``CodeAgent(executor=PynoxExecutor(...))`` keeps
its default name, "local", so saving and loading it would give an agent that
runs the model's code unconfined in smolagents' local executor. Two guards:

- ``PynoxCodeAgent`` is ``executor_type="pynox"`` and builds its executor from
  ``executor_kwargs`` (the grants), so ``PynoxCodeAgent.from_folder`` loads a
  Pynox-backed agent with the grants it was saved with.
- Saving any ``CodeAgent`` whose executor is a ``PynoxExecutor`` writes
  ``"executor_type": "pynox"`` with those grants (installed on ``CodeAgent.to_dict``
  when this package is imported): ``CodeAgent.from_folder`` then refuses it
  ("Unsupported executor type: pynox") instead of running it locally.
"""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path
from typing import Any

from smolagents import CodeAgent
from smolagents.agents import AGENT_REGISTRY, MultiStepAgent
from smolagents.memory import ActionStep

from ._executor import PynoxExecutor
from ._tool import PynoxTool

__all__ = ["EXECUTOR_TYPE", "PynoxCodeAgent", "save_with_its_executor"]

EXECUTOR_TYPE = "pynox"
# The sentence smolagents' code-agent prompts (code_agent.yaml, structured_code_agent.yaml) end with the import list.
_IMPORTS_SENTENCE = "You can use imports in your code, but only from the following list of modules: "


class PynoxCodeAgent(CodeAgent):
    """``CodeAgent`` with every step's code in a Pynox session: ``PynoxCodeAgent(tools, model, executor_kwargs={...})``.

    ``executor_kwargs`` are :class:`PynoxExecutor`'s (``allow_read``, ``allow_write``, ``timeout``, ``profile``,
    ``pool``, ...), or pass ``executor=PynoxExecutor(...)``. Beyond a plain ``CodeAgent`` with that executor:

    - the system prompt's list of authorized imports is replaced by what the sandbox allows (any installed
      package; the files, network and limits granted), since the kernel policy decides, not an import list;
    - ``max_print_outputs_length`` reaches the executor;
    - figures a step leaves open and PNG images it displays are shown to the model with the next step
      (``observations_images``);
    - ``save()`` writes ``executor_type: "pynox"`` and the grants; ``PynoxCodeAgent.from_folder(path)`` loads a
      Pynox-backed agent with them (``executor_kwargs={"pool": pool}`` runs it on a given pool).
    """

    def __init__(self, tools: list[Any], model: Any, *, executor: PynoxExecutor | None = None,
                 executor_type: str = EXECUTOR_TYPE, executor_kwargs: dict[str, Any] | None = None,
                 additional_authorized_imports: list[str] | None = None, **kwargs: Any) -> None:
        if executor_type != EXECUTOR_TYPE:
            raise ValueError(f"PynoxCodeAgent runs its code in Pynox: executor_type must be {EXECUTOR_TYPE!r}, "
                             f"not {executor_type!r} (use smolagents' CodeAgent for its own executors)")
        if executor is not None and not isinstance(executor, PynoxExecutor):
            raise TypeError(f"PynoxCodeAgent's executor must be a PynoxExecutor, not {type(executor).__name__}")
        if executor is not None and executor_kwargs:
            raise TypeError("give PynoxCodeAgent an executor or executor_kwargs, not both")
        # smolagents' authorized imports reach the executor, which checks them as smolagents' own executors do.
        super().__init__(tools, model, executor=executor, executor_type=EXECUTOR_TYPE,
                         executor_kwargs=executor_kwargs, additional_authorized_imports=additional_authorized_imports,
                         **kwargs)

    @classmethod
    def from_dict(cls, agent_dict: dict[str, Any], **kwargs: Any) -> PynoxCodeAgent:
        """As ``CodeAgent.from_dict`` (and so ``from_folder``), with the saved grants under any ``executor_kwargs``
        given here (``{"pool": pool}`` runs it on that pool, with its saved grants). An agent saved with another
        executor loads confined by Pynox's defaults.

        The saved grants are whatever ``agent.json`` says, as its tools are whatever their files say (smolagents
        runs them on the host when it loads them): load only folders you trust, or give the grants here."""
        saved = agent_dict.get("executor_kwargs") if agent_dict.get("executor_type") == EXECUTOR_TYPE else None
        kwargs["executor_kwargs"] = {**(saved or {}), **(kwargs.get("executor_kwargs") or {})}
        kwargs["executor_type"] = EXECUTOR_TYPE
        agent: PynoxCodeAgent = super().from_dict(agent_dict, **kwargs)
        return agent

    @property
    def pynox_executor(self) -> PynoxExecutor:
        executor = self.python_executor
        assert isinstance(executor, PynoxExecutor)  # __init__ admits no other
        return executor

    def create_python_executor(self) -> PynoxExecutor:
        options = dict(self.executor_kwargs)
        options.setdefault("max_print_outputs_length", self.max_print_outputs_length)
        options.setdefault("additional_authorized_imports", self.additional_authorized_imports)
        return PynoxExecutor(**options)

    def save(self, output_dir: str | os.PathLike[str], relative_path: str | None = None) -> None:
        """smolagents' ``save``, whose ``app.py`` then imports this class from ``pynox_smolagents`` (smolagents'
        template imports every agent class from ``smolagents``, where this one is not)."""
        super().save(output_dir, relative_path=relative_path)
        app = Path(output_dir) / "app.py"
        text = app.read_text(encoding="utf-8")
        first = re.search(r"^from smolagents import (.*)$", text, flags=re.MULTILINE)
        if first is None:
            raise ValueError(f"smolagents wrote an app.py this version of pynox_smolagents does not know: {app}")
        names = [name.strip() for name in first.group(1).split(",") if name.strip() != type(self).__name__]
        imports = f"from smolagents import {', '.join(names)}\nfrom pynox_smolagents import {type(self).__name__}"
        app.write_text(text[:first.start()] + imports + text[first.end():], encoding="utf-8")

    def initialize_system_prompt(self) -> str:
        prompt = str(super().initialize_system_prompt())
        executor = getattr(self, "python_executor", None)
        if executor is None:  # smolagents renders a first prompt before the executor exists; run() renders again
            return prompt
        listed = str(self.authorized_imports)
        sandbox = _sandbox_rules(executor)
        if _IMPORTS_SENTENCE + listed in prompt:
            return prompt.replace(_IMPORTS_SENTENCE + listed, sandbox)
        return prompt.replace(listed, sandbox)  # a prompt of the user's own wording

    def _setup_step_callbacks(self, step_callbacks: Any) -> None:
        super()._setup_step_callbacks(step_callbacks)
        self.step_callbacks.register(ActionStep, _show_figures)


def _sandbox_rules(executor: PynoxExecutor) -> str:
    """What the prompt says in place of the import list: the sandbox's own rules, as the tool describes them."""
    description = executor.permissions
    lines = ["Your code runs in a sandbox: you may import any installed package, and the sandbox decides what "
             "the code may touch:", *(f"   - {line}" for line in description.permissions),
             f"   {description.closing}"]
    return "\n".join(lines)


def _show_figures(memory_step: ActionStep, agent: Any) -> None:
    """smolagents' own way to show a vision model what a step produced: the step's observation images."""
    executor = getattr(agent, "python_executor", None)
    if isinstance(executor, PynoxExecutor) and executor.step_images:
        memory_step.observations_images = [*(memory_step.observations_images or []), *executor.step_images]


# What a saved agent whose code runs in Pynox needs installed to load (smolagents comes with it).
REQUIREMENT = "pynox-smolagents"


def save_with_its_executor() -> None:
    """Make ``CodeAgent.to_dict`` (which ``save`` and ``push_to_hub`` use) record a ``PynoxExecutor`` as
    ``executor_type: "pynox"`` with its grants and ``pynox-smolagents`` among the requirements, so no saved
    agent reloads with the local executor; and make ``CodeAgent(executor=PynoxExecutor(...))`` give the
    executor the agent's ``max_print_outputs_length``, as smolagents gives it to the executors it builds; and
    give each agent its own copy of a ``python_tool(session=True)`` (its own session). Idempotent."""
    to_dict = CodeAgent.to_dict
    if getattr(to_dict, "_pynox_saves_executor", False):
        return
    init = CodeAgent.__init__

    @functools.wraps(init)
    def init_telling_its_executor(self: CodeAgent, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        executor = getattr(self, "python_executor", None)
        if isinstance(executor, PynoxExecutor):
            executor.follow_agent(self.max_print_outputs_length)

    agent_init = MultiStepAgent.__init__

    @functools.wraps(agent_init)
    def init_with_tools_of_its_own(self: MultiStepAgent, *args: Any, **kwargs: Any) -> None:
        agent_init(self, *args, **kwargs)
        # smolagents gives a tool no sign of which agent calls it: a session tool's state follows the agent
        # only if each agent holds its own copy.
        self.tools = {name: tool.for_agent(self) if isinstance(tool, PynoxTool) else tool
                      for name, tool in self.tools.items()}

    @functools.wraps(to_dict)
    def to_dict_with_executor(self: CodeAgent) -> dict[str, Any]:
        agent_dict: dict[str, Any] = to_dict(self)
        executor = getattr(self, "python_executor", None)
        if isinstance(executor, PynoxExecutor):
            agent_dict["executor_type"] = EXECUTOR_TYPE
            agent_dict["executor_kwargs"] = executor.to_dict()
            agent_dict["requirements"] = sorted({*agent_dict.get("requirements", ()), REQUIREMENT})
        return agent_dict

    to_dict_with_executor._pynox_saves_executor = True  # type: ignore[attr-defined]
    CodeAgent.to_dict = to_dict_with_executor
    CodeAgent.__init__ = init_telling_its_executor
    MultiStepAgent.__init__ = init_with_tools_of_its_own
    # smolagents loads managed agents by class name from this registry.
    AGENT_REGISTRY.setdefault(PynoxCodeAgent.__name__, PynoxCodeAgent)
