"""``PynoxSandbox``: strands' ``Sandbox`` interface with Pynox underneath.

``Agent(sandbox=PynoxSandbox(...))`` routes strands' own sandbox-aware tools
here: ``python_repl`` runs its code in a confined Pynox process, and the file
operations (``file_editor``) run as small confined jobs under the same grants,
so the kernel policy decides what they may touch, not this module. Pynox runs
Python only and its code cannot start programs, so shell commands fail with an
error that says so.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import AsyncGenerator, Callable, Mapping
from typing import Any

from strands.sandbox import ExecutionResult, FileInfo, Sandbox, StreamChunk
from strands.sandbox.errors import SandboxPathNotFoundError, SandboxTimeoutError
from strands.types.tools import AgentTool

from pynox import CodeTool, Pool, PynoxError, Result, Session

from ._tool import tool_for

__all__ = ["PynoxSandbox", "UnsupportedOperation"]

_PYTHON = re.compile(r"python(3(\.\d+)*)?")
_OS_ERRORS: dict[str, type[OSError]] = {
    "FileNotFoundError": FileNotFoundError, "PermissionError": PermissionError,
    "IsADirectoryError": IsADirectoryError, "NotADirectoryError": NotADirectoryError,
    "FileExistsError": FileExistsError,
}


class UnsupportedOperation(NotImplementedError):
    """An operation strands' sandbox interface has and Pynox does not offer (shell commands)."""


class PynoxSandbox(Sandbox):
    """Run strands' code and file operations in Pynox.

    Arguments as for :func:`pynox_strands.python_tool`. The sandbox also vends that tool, named
    ``run_python`` with Pynox's docstring, to every agent it is given to (an agent that already has a
    tool of that name keeps its own); ``vend_tool=False`` vends nothing, for agents that use
    ``python_repl``. ``session=True`` runs every piece of code in one Pynox session (file operations
    always run as separate jobs); :meth:`aclose` or :meth:`close` ends it.
    """

    def __init__(self, pool: Pool | None = None, *, profile: str | None = None, session: bool | Session = False,
                 functions: Mapping[str, Callable[..., Any]] | None = None, vend_tool: bool = True,
                 **grants: Any) -> None:
        self._runner = CodeTool(pool, profile=profile, session=session, functions=functions, **grants)
        self._vend_tool = vend_tool

    def get_tools(self) -> list[AgentTool]:
        # The sandbox's session is shared with its python_repl, and the sandbox belongs to one agent.
        return [tool_for(self._runner, per_agent=False)] if self._vend_tool else []

    async def aclose(self) -> None:
        """End the session this sandbox owns, if one was started."""
        await self._runner.aclose()

    def close(self) -> None:
        """:meth:`aclose` for synchronous code."""
        self._runner.close()

    # -- execution ------------------------------------------------------------------------------------
    async def execute_streaming(self, command: str, *, timeout: float | None = None, cwd: str | None = None,
                                env: dict[str, str] | None = None,
                                **kwargs: Any) -> AsyncGenerator[StreamChunk | ExecutionResult, None]:
        """Always fails: Pynox runs Python code, and that code cannot start programs or shells."""
        raise UnsupportedOperation("PynoxSandbox cannot run shell commands: Pynox runs Python code only, and that "
                                   "code may not start programs. Use the run_python (or python_repl) tool to do "
                                   "this in Python.")
        yield  # pragma: no cover  # makes this an async generator, as the interface declares

    async def execute_code_streaming(self, code: str, language: str, *, timeout: float | None = None,
                                     cwd: str | None = None, env: dict[str, str] | None = None,
                                     **kwargs: Any) -> AsyncGenerator[StreamChunk | ExecutionResult, None]:
        """Run Python ``code`` in Pynox. ``timeout`` may shorten the host's limit, never extend it.

        The code's output arrives whole when it ends (Pynox does not stream). ``stderr`` carries the
        traceback and then Pynox's account of the failure with its hint, written for the model.
        Raises :class:`strands.sandbox.errors.SandboxTimeoutError` when the time limit stopped it.
        """
        if not _PYTHON.fullmatch(language):
            raise UnsupportedOperation(f"PynoxSandbox runs Python only: language {language!r} is not available")
        _no_cwd(cwd)
        if timeout is not None and timeout <= 0:
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout}")
        try:
            result = await self._runner.arun(code, timeout=timeout, env=env)
        except PynoxError as exc:  # a refusal or a broken pool: strands' tools report it to the model
            raise RuntimeError(f"{type(exc).__name__}: {exc}") from exc
        stderr = _stderr(result)
        if result.timed_out:
            limit = min(timeout, self._runner.grants.timeout) if timeout is not None else self._runner.grants.timeout
            raise SandboxTimeoutError(limit, result.stdout, stderr)
        if result.stdout:
            yield StreamChunk(result.stdout, "stdout")
        if stderr:
            yield StreamChunk(stderr, "stderr")
        yield ExecutionResult(exit_code=result.exit, stdout=result.stdout, stderr=stderr)

    # -- files: each operation is a confined job under the sandbox's grants -----------------------------
    async def _file_job(self, path: str, body: str) -> Result:
        code = f"import base64, json, os, sys\npath = {path!r}\n{body}"
        try:
            result = await self._runner.arun(code, fresh=True)
        except PynoxError as exc:
            raise OSError(f"{type(exc).__name__}: {exc}") from exc
        if result.error is not None:
            kind = _OS_ERRORS.get(result.error.get("type", ""), OSError)
            raise kind(result.error_text)
        if not result.ok or result.stdout_truncated:
            raise OSError(f"{path}: " + (result.error_text if not result.ok else
                                         "too large to pass through the sandbox's max_output"))
        return result

    async def read_file(self, path: str, **kwargs: Any) -> bytes:
        result = await self._file_job(path, "with open(path, 'rb') as f:\n"
                                            "    sys.stdout.write(base64.b64encode(f.read()).decode())")
        return base64.b64decode(result.stdout)

    async def write_file(self, path: str, content: bytes, **kwargs: Any) -> None:
        encoded = base64.b64encode(content).decode()
        await self._file_job(path, "parent = os.path.dirname(path)\n"
                                   "if parent:\n    os.makedirs(parent, exist_ok=True)\n"
                                   f"with open(path, 'wb') as f:\n    f.write(base64.b64decode({encoded!r}))")

    async def remove_file(self, path: str, **kwargs: Any) -> None:
        await self._file_job(path, "os.remove(path)")

    async def list_files(self, path: str, **kwargs: Any) -> list[FileInfo]:
        try:
            result = await self._file_job(path, _LIST)
        except (FileNotFoundError, NotADirectoryError) as exc:
            raise SandboxPathNotFoundError(path) from exc
        return [FileInfo(name=name, is_dir=is_dir, size=size) for name, is_dir, size in json.loads(result.stdout)]


_LIST = """\
entries = []
with os.scandir(path) as scan:
    for entry in sorted(scan, key=lambda e: e.name):
        try:
            entries.append([entry.name, entry.is_dir(), entry.stat().st_size])
        except OSError:
            entries.append([entry.name, None, None])
print(json.dumps(entries))"""


def _no_cwd(cwd: str | None) -> None:
    if cwd is not None:
        raise UnsupportedOperation("PynoxSandbox runs code in the pool's working directory; a per-call cwd is "
                                   "not supported (use paths relative to it, or absolute paths)")


def _stderr(result: Result) -> str:
    """The code's stderr, then, if anything went wrong, Pynox's text for it (error, hint, notes)."""
    if result.ok and not result.truncated and not result.session_ended:
        return result.stderr
    notes = result.notes(source_line=False)  # the traceback above shows the line
    lines = result.stderr.rstrip().splitlines()
    if lines and notes.startswith(lines[-1]):
        lines.pop()  # the traceback's last line, which the notes repeat with the file and line
    return "\n".join([*lines, notes]) + "\n"
