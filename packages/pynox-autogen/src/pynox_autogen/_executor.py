"""``PynoxCodeExecutor``: AutoGen's ``CodeExecutor`` interface with Pynox underneath.

It behaves as AutoGen's stateful executor (``JupyterCodeExecutor``) does, the code confined instead:

* ``start()`` (or ``async with``) opens a Pynox session, and the code blocks of every later call run
  in it, so variables, imports and functions survive between calls, as in a Jupyter kernel.
  ``restart()`` (what an agent's reset calls) gives a fresh session, ``stop()`` ends it. Executing
  before ``start()`` raises ``RuntimeError``, as AutoGen's Jupyter and Docker executors do.
* ``execute_code_blocks`` runs the blocks in order and stops at the first that fails; the output is
  each block's text joined by newlines, the exit code the last block's (124 for a timeout, as AutoGen's
  command-line executors report it). Figures the code drew are saved as PNG files in ``output_dir``
  and listed in ``output_files``, as the Jupyter executor does with a kernel's images.
* Python blocks only: another language is not run, and the result says so with exit code 1, as AutoGen's
  local executor reports an unknown language. Pynox's code cannot start programs, so ``sh`` cannot be
  offered.
* The ``CancellationToken`` is linked to the task running the block: cancelling it interrupts the code
  (``KeyboardInterrupt`` in the block, as a Jupyter kernel's interrupt) and ``execute_code_blocks`` raises
  ``asyncio.CancelledError``, as the interface says. The session and its variables live on, as the
  Jupyter executor's kernel does; a block that does not stop within the pool's grace is killed with its
  session's process, and the next call's output opens with a line saying its variables are gone.
"""

from __future__ import annotations

import asyncio
import tempfile
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self, Unpack

from autogen_core import CancellationToken, Component
from autogen_core.code_executor import CodeBlock, CodeExecutor, CodeResult
from pydantic import BaseModel

from pynox import CodeTool, ConfigError, Grants, KernelSupportError, Pool, PynoxError, Result, check_grants

__all__ = ["PynoxCodeExecutor", "PynoxCodeExecutorConfig", "PynoxCodeResult"]

PYTHON = frozenset({"python", "py", "python3"})  # AutoGen's own Python variants, and python3
_OPERATORS_ERRORS = (KernelSupportError, ConfigError)  # no model can mend these: they raise


@dataclass
class PynoxCodeResult(CodeResult):
    """A code result with the files the code's figures were saved to (``JupyterCodeResult``'s shape)."""

    output_files: list[Path] = field(default_factory=list)


class PynoxCodeExecutorConfig(BaseModel):
    """What ``dump_component`` saves of an executor on the default pool: its profile, grants and output_dir."""

    profile: str | None = None
    grants: dict[str, Any] = {}
    output_dir: str | None = None


def _output(result: Result) -> str:
    """The block's text as a model reads it; empty when a good run showed nothing, so the agent's own
    "produced no output" message applies."""
    if result.ok and not (result.stdout or result.stderr or result.return_value is not None or result.images
                          or result.session_reopened):
        return ""
    return result.text


class PynoxCodeExecutor(CodeExecutor, Component[PynoxCodeExecutorConfig]):
    """Run AutoGen's Python code blocks in a Pynox session.

    Permissions come from ``profile`` and ``grants`` (allow_read, allow_write, allow_network, allow_hosts, env,
    timeout, memory, max_output, max_file_size, package_dirs), never from the model; ``functions`` are
    host functions the code may call through ``pynox_host``. ``pool=None`` uses the default pool,
    started on the first call (never here). ``output_dir``: where figures are saved (a new temporary
    directory by default).
    """

    component_config_schema = PynoxCodeExecutorConfig
    component_provider_override = "pynox_autogen.PynoxCodeExecutor"

    def __init__(self, pool: Pool | None = None, *, profile: str | None = None,
                 functions: Mapping[str, Callable[..., Any]] | None = None, output_dir: Path | str | None = None,
                 **grants: Unpack[Grants]) -> None:
        check_grants("PynoxCodeExecutor()", grants)
        self._runner = CodeTool(pool, profile=profile, session=True, functions=functions, **grants)
        self._configurable = pool is None and not functions
        self._output_dir = Path(tempfile.mkdtemp()) if output_dir is None else Path(output_dir)
        self._output_dir.mkdir(parents=True, exist_ok=True)
        self._started = False

    @property
    def runner(self) -> CodeTool:
        """The core tool the blocks run through (its grants, its description for a system prompt)."""
        return self._runner

    @property
    def output_dir(self) -> Path:
        return self._output_dir

    async def execute_code_blocks(self, code_blocks: list[CodeBlock],
                                  cancellation_token: CancellationToken) -> PynoxCodeResult:
        """Run the blocks in order in the session, stopping at the first that fails."""
        if not self._started:
            raise RuntimeError("PynoxCodeExecutor must be started before it executes code: `await executor.start()` "
                               "or `async with executor:`")
        outputs: list[str] = []
        files: list[Path] = []
        exit_code = 0
        for block in code_blocks:
            if block.language.lower() not in PYTHON:
                outputs.append(f"unknown language {block.language}: PynoxCodeExecutor runs Python code blocks only")
                exit_code = 1
                break
            run = asyncio.ensure_future(self._runner.arun(block.code))
            cancellation_token.link_future(run)
            try:
                result = await run  # a cancel interrupts the step; the session outlives it (Session.arun)
            except _OPERATORS_ERRORS:
                raise
            except PynoxError as exc:  # a refusal or a broken pool: what the model reads, as a failed block
                outputs.append(f"{type(exc).__name__}: {exc}")
                exit_code = 1
                break
            outputs.append(_output(result))
            files += [self._save(image) for image in result.images]
            exit_code = result.exit if result.exit or result.ok else 1
            if exit_code != 0:
                break
        return PynoxCodeResult(exit_code=exit_code, output="\n".join(outputs), output_files=files)

    def _save(self, image: bytes) -> Path:
        path = self._output_dir / f"{uuid.uuid4().hex}.png"
        path.write_bytes(image)
        return path.absolute()

    async def start(self) -> None:
        """Make the executor ready; the session itself opens with the first block."""
        self._started = True

    async def stop(self) -> None:
        """End the session (its variables with it)."""
        await self._runner.aclose()
        self._started = False

    async def restart(self) -> None:
        """A fresh session: nothing of the earlier calls' state is left."""
        await self.stop()
        await self.start()

    def _to_config(self) -> PynoxCodeExecutorConfig:
        if not self._configurable:
            raise TypeError("a PynoxCodeExecutor on a pool of your own, or with host functions, cannot be saved as a "
                            "component: those are live objects")
        requested = self._runner.requested
        return PynoxCodeExecutorConfig(profile=requested.pop("profile", None), grants=requested,
                                       output_dir=str(self._output_dir))

    @classmethod
    def _from_config(cls, config: PynoxCodeExecutorConfig) -> Self:
        return cls(profile=config.profile, output_dir=config.output_dir, **config.grants)
