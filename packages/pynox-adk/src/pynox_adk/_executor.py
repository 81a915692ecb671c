"""``PynoxCodeExecutor``: Google ADK's ``BaseCodeExecutor`` with Pynox underneath.

``LlmAgent(code_executor=PynoxCodeExecutor(...))``: ADK extracts the model's code block, calls
``execute_code`` (in a worker thread), and hands the result back to the model; this runs the code in a
confined Pynox process instead of ADK's own interpreter (``UnsafeLocalCodeExecutor``) or a container.

* ``stateful`` is ADK's option: ``False`` (ADK's default) runs each block in a fresh process;
  ``True`` keeps a Pynox session per ``execution_id``, which ADK sets to the ADK session's id, so
  variables survive between the blocks of one ADK session and never cross to another. :meth:`close`
  ends them (an idle one is also closed by the pool after its ``session_idle``, and the next block
  says its state was lost).
* The result is what ADK expects: ``stdout`` the code's output, ``stderr`` empty for a clean run and
  otherwise the code's stderr then Pynox's account of the failure with its hint (ADK counts a
  non-empty stderr as a failed attempt, for ``error_retry_attempts``), ``exit_code`` the process's.
  Figures the code drew are ``output_files`` (``image/png``), which ADK saves as artifacts.
* ``timeout_seconds``, ADK's per-execution timeout, can only shorten the grants' ``timeout``.
* ``optimize_data_file`` cannot be set, as for ADK's local executor: the data-file preprocessing it
  enables writes files where the code runs.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from google.adk.code_executors import BaseCodeExecutor
from google.adk.code_executors.code_execution_utils import CodeExecutionInput, CodeExecutionResult, File
from pydantic import Field, PrivateAttr
from typing_extensions import override

from pynox import CodeTool, ConfigError, Grants, KernelSupportError, Pool, PynoxError, Result, check_grants

if TYPE_CHECKING:
    from google.adk.agents.invocation_context import InvocationContext

__all__ = ["PynoxCodeExecutor", "execution_result"]

_OPERATORS_ERRORS = (KernelSupportError, ConfigError)  # no model can mend these: they raise
_SESSION_SCOPE = "of this ADK session"


def execution_result(result: Result) -> CodeExecutionResult:
    """ADK's result for a Pynox run: stdout, stderr with Pynox's notes when it failed, figures as PNG files."""
    stderr = result.stderr
    if not result.ok or result.truncated:
        stderr = "\n".join(part for part in (result.stderr_text, result.error_text) if part)
    files = [File(name=f"figure_{n}.png", content=image, mime_type="image/png")
             for n, image in enumerate(result.images, 1)]
    # A session whose process was gone (idle too long) ran this in a new one: the text's first line says so.
    reopened = result.text.partition("\n")[0] + "\n" if result.session_reopened else ""
    stdout = reopened + result.stdout + (f"Out: {result.return_value}\n" if result.return_value is not None else "")
    return CodeExecutionResult(stdout=stdout, stderr=stderr, output_files=files, exit_code=result.exit)


class PynoxCodeExecutor(BaseCodeExecutor):
    """Run ADK's code blocks in Pynox.

    Permissions come from ``profile`` and ``grants`` (allow_read, allow_write, allow_network, allow_hosts, env,
    timeout, memory, max_output, max_file_size, package_dirs), never from the model; ``functions`` are
    host functions the code may call through ``pynox_host``. ``pool=None`` uses the default pool,
    started on the first block (never here). ADK's own fields (``stateful``, ``timeout_seconds``,
    ``error_retry_attempts``, ``code_block_delimiters``, ``execution_result_delimiters``) are keywords too.
    """

    # As ADK's local executor: the data-file preprocessing writes files where the code runs.
    optimize_data_file: bool = Field(default=False, frozen=True, exclude=True)

    _runner: CodeTool = PrivateAttr()
    _sessions: dict[str, CodeTool] = PrivateAttr(default_factory=dict)
    _lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)

    def __init__(self, pool: Pool | None = None, *, profile: str | None = None,
                 functions: Mapping[str, Callable[..., Any]] | None = None, **options: Any) -> None:
        fields = {name: options.pop(name) for name in list(options) if name in type(self).model_fields}
        if fields.get("optimize_data_file"):
            raise ValueError("Cannot set `optimize_data_file=True` in PynoxCodeExecutor: its preprocessing writes "
                             "data files where the code runs")
        grants: Grants = options  # type: ignore[assignment]  # checked on the next line
        check_grants("PynoxCodeExecutor()", grants)
        super().__init__(**fields)
        self._runner = CodeTool(pool, profile=profile, session=bool(self.stateful), functions=functions,
                                session_scope=_SESSION_SCOPE if self.stateful else None, **grants)

    @property
    def runner(self) -> CodeTool:
        """The core tool the code runs through (its grants, its description for an instruction)."""
        return self._runner

    def _for(self, execution_id: str | None) -> CodeTool:
        if not self.stateful or execution_id is None:
            return self._runner if not self.stateful else self._runner.for_run()
        with self._lock:
            runner = self._sessions.get(execution_id)
            if runner is None:
                runner = self._sessions[execution_id] = self._runner.for_run()
        return runner

    @override
    def execute_code(self, invocation_context: InvocationContext,
                     code_execution_input: CodeExecutionInput) -> CodeExecutionResult:
        runner = self._for(code_execution_input.execution_id)
        try:
            result = runner.run(code_execution_input.code, timeout=self.timeout_seconds)
        except _OPERATORS_ERRORS:
            raise
        except PynoxError as exc:  # a refusal or a broken pool: the model reads it as a failed execution
            return CodeExecutionResult(stderr=f"{type(exc).__name__}: {exc}", exit_code=1)
        finally:
            if self.stateful and code_execution_input.execution_id is None:
                runner.close()  # a stateful executor called without an id: nothing to keep the session for
        return execution_result(result)

    def close(self) -> None:
        """End every session this executor keeps (one per ADK session it ran code for)."""
        with self._lock:
            runners, self._sessions = list(self._sessions.values()), {}
        for runner in runners:
            runner.close()
