"""``PynoxSandbox``: strands' ``Sandbox`` interface with Pynox underneath.

``Agent(sandbox=PynoxSandbox(...))`` routes strands' sandbox-aware tools here:
``python_repl`` runs its code in a confined Pynox process, and the file
operations (``file_editor``) run as small confined jobs under the same grants,
so the kernel policy decides what they may touch, not this module. A directory
the code may not list shows the grants inside it, so a directory or a file
granted on its own can be found from its parent (strands' editor looks there
first); a refused operation is an error about the path the caller gave, with
the hint the job's denial carried, never a line of the script that ran it. The
tools the sandbox vends, with descriptions true under it, are ``_vended``'s.
Pynox runs Python only and its code cannot start programs, so shell commands
fail with an error that says so.
"""

from __future__ import annotations

import base64
import json
import os
import re
from collections.abc import AsyncGenerator, Callable, Collection, Mapping
from typing import Any, Unpack

from strands.sandbox import ExecutionResult, FileInfo, Sandbox, StreamChunk
from strands.sandbox.errors import SandboxPathNotFoundError, SandboxTimeoutError
from strands.types.tools import AgentTool

from pynox import CodeTool, Grants, Pool, PynoxError, Result, Session, check_grants

from ._errors import DeniedPath, UnsupportedOperation
from ._vended import VENDABLE, vended_tool

__all__ = ["PynoxSandbox"]

_PYTHON = re.compile(r"python(3(\.\d+)*)?")
_OS_ERRORS: dict[str, type[OSError]] = {
    "FileNotFoundError": FileNotFoundError, "IsADirectoryError": IsADirectoryError,
    "NotADirectoryError": NotADirectoryError, "FileExistsError": FileExistsError,
}


class PynoxSandbox(Sandbox):
    """Run strands' code and file operations in Pynox.

    Arguments as for :func:`pynox_strands.python_tool`. ``vend`` names the tools the sandbox gives every
    agent it is given to (an agent that already has a tool of that name keeps its own, as strands
    decides): ``run_python`` (Pynox's tool and docstring; the default), and ``python_repl`` and
    ``file_editor``, strands' own tools bound to this sandbox with descriptions that say what is true
    under it (what may be read and written, whether variables persist), not what strands' stock
    instances say of another sandbox. ``vend_tool=False`` is the older spelling of ``vend=()``.
    ``session=True`` runs every piece of code in one Pynox session (file operations always run as
    separate jobs); :meth:`aclose` or :meth:`close` ends it.
    """

    def __init__(self, pool: Pool | None = None, *, profile: str | None = None, session: bool | Session = False,
                 functions: Mapping[str, Callable[..., Any]] | None = None, vend: Collection[str] | None = None,
                 vend_tool: bool = True, **grants: Unpack[Grants]) -> None:
        check_grants("PynoxSandbox()", grants)
        self._vend = _vend_names(vend, vend_tool)
        self._runner = CodeTool(pool, profile=profile, session=session, functions=functions, **grants)

    def get_tools(self) -> list[AgentTool]:
        # The sandbox's session is shared by its tools, and the sandbox belongs to one agent.
        return [vended_tool(name, self, self._runner) for name in self._vend]

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
    async def _file_job(self, verb: str, path: str, body: str) -> Result:
        code = f"import base64, json, os, stat, sys\npath = {path!r}\n{body}"
        try:
            result = await self._runner.arun(code, fresh=True)
        except PynoxError as exc:
            raise OSError(f"Cannot {verb} {path}: {type(exc).__name__}: {exc}") from exc
        if result.error is not None:
            raise _file_error(verb, path, result.error)
        if not result.ok or result.stdout_truncated:
            raise OSError(f"Cannot {verb} {path}: " + (result.error_text if not result.ok else
                                                        "too large to pass through the sandbox's max_output"))
        return result

    async def read_file(self, path: str, **kwargs: Any) -> bytes:
        result = await self._file_job("read", path, "with open(path, 'rb') as f:\n"
                                                    "    sys.stdout.write(base64.b64encode(f.read()).decode())")
        return base64.b64decode(result.stdout)

    async def write_file(self, path: str, content: bytes, **kwargs: Any) -> None:
        encoded = base64.b64encode(content).decode()
        await self._file_job("write", path, f"content = base64.b64decode({encoded!r})\n{_WRITE}")

    async def remove_file(self, path: str, **kwargs: Any) -> None:
        await self._file_job("remove", path, "os.remove(path)")

    async def list_files(self, path: str, **kwargs: Any) -> list[FileInfo]:
        """The directory's entries; for one the kernel will not let the code list, the entries the
        grants make visible in it (a granted file or directory inside it, or the way down to one),
        so a directory or a file granted on its own can be found from its parent, as strands'
        ``file_editor`` does before it touches a path. Nothing else of such a directory shows."""
        visible = sorted(_visible_in(path, self._runner.grants.read).items())
        try:
            result = await self._file_job("list", path, f"visible = {visible!r}\n{_LIST}")
        except (FileNotFoundError, NotADirectoryError) as exc:
            raise SandboxPathNotFoundError(path) from exc
        return [FileInfo(name=name, is_dir=is_dir, size=size) for name, is_dir, size in json.loads(result.stdout)]

    async def check_readable(self, path: str) -> None:
        """Raise :class:`DeniedPath` if ``path`` exists and the code may not read it, or, for a directory,
        list it or see a grant inside it. The kernel decides, in a confined job; a missing path passes."""
        visible = bool(_visible_in(path, self._runner.grants.read))
        await self._file_job("read", path, f"visible = {visible!r}\n{_OPEN_FOR_READING}")


_REASONS = {"PermissionError": "permission denied", "FileNotFoundError": "no such file or directory",
            "IsADirectoryError": "it is a directory", "NotADirectoryError": "not a directory",
            "FileExistsError": "it already exists"}


def _file_error(verb: str, path: str, error: Mapping[str, Any]) -> OSError:
    """The failure of a file job, told about the path the caller gave, with the job's hint, and never
    the line of the generated script that met it (that means nothing to the model)."""
    kind = error.get("type", "")
    reason = _REASONS.get(kind) or f"{kind}: {error.get('message', '')}"
    met = error.get("path")
    if isinstance(met, str) and os.path.normpath(met) != os.path.normpath(path):
        reason += f" ({met})"  # what the job met on its way: the directory it had to create, say
    hint = error.get("hint")
    if kind == "PermissionError":
        return DeniedPath(path, verb, reason, hint if isinstance(hint, str) else None)
    return _OS_ERRORS.get(kind, OSError)(f"Cannot {verb} {path}: {reason}." + (f" Hint: {hint}" if hint else ""))


def _visible_in(directory: str, granted: tuple[str, ...]) -> dict[str, str]:
    """The entries of ``directory`` that lead to a granted path: name -> that entry's path."""
    directory = os.path.normpath(os.path.abspath(directory))
    entries: dict[str, str] = {}
    for path in granted:
        if not path.startswith(directory.rstrip("/") + "/"):
            continue
        name = path[len(directory.rstrip("/")) + 1:].split("/")[0]
        entries.setdefault(name, os.path.join(directory, name))
    return entries


# Runs confined: the kernel's verdict on a listing, and stat (which Landlock leaves alone) only of the
# entries the host granted, never of anything else in a directory the code may not read.
_LIST = """\
entries = []
try:
    with os.scandir(path) as scan:
        for entry in sorted(scan, key=lambda e: e.name):
            try:
                entries.append([entry.name, entry.is_dir(), entry.stat().st_size])
            except OSError:
                entries.append([entry.name, None, None])
except PermissionError:
    if not visible:
        raise
    for name, target in visible:
        try:
            info = os.stat(target)
        except OSError:
            continue
        entries.append([name, stat.S_ISDIR(info.st_mode), info.st_size])
print(json.dumps(entries))"""

_OPEN_FOR_READING = """\
if os.path.isdir(path):
    if not visible:
        os.scandir(path).close()
elif os.path.lexists(path):
    open(path, 'rb').close()"""

_WRITE = """\
parent = os.path.dirname(path)
if parent:
    os.makedirs(parent, exist_ok=True)
with open(path, 'wb') as f:
    f.write(content)"""


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


def _vend_names(vend: Collection[str] | None, vend_tool: bool) -> tuple[str, ...]:
    if vend is None:
        return ("run_python",) if vend_tool else ()
    if not vend_tool:
        raise TypeError("vend names the tools to vend: give it alone, without vend_tool=False (vend=() vends none)")
    if isinstance(vend, str):
        raise TypeError(f"vend takes a list of tool names, e.g. vend=[{vend!r}]")
    unknown = [name for name in vend if name not in VENDABLE]
    if unknown:
        raise ValueError(f"PynoxSandbox cannot vend {', '.join(map(str, unknown))}: it vends {', '.join(VENDABLE)}")
    return tuple(dict.fromkeys(vend))
