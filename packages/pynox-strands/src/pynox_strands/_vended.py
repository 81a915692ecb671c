"""The tools a ``PynoxSandbox`` vends: Pynox's ``run_python``, and strands' ``python_repl`` and
``file_editor`` with descriptions that are true under Pynox.

strands' stock ``python_repl`` and ``file_editor`` are module-level instances whose descriptions were
written for a sandbox with a writable working directory and fresh interpreters. A sandbox cannot
change them: ``Sandbox.get_tools`` never sees the agent's registry, and changing the shared instance's
spec would change it for every agent in the process. strands' own sandboxes (Docker, SSH) vend tools
made by ``make_python_repl`` and ``make_file_editor``, bound to themselves, with descriptions of their
own; so does this module, under the stock names. An agent that is also given a stock instance keeps
that one (strands skips a vended tool whose name is taken), with its untrue description.

``file_editor`` is strands' own editor behind a thin layer that keeps its errors about the path the
model gave: strands lists a path's parent before it touches the path, and a denial of that listing
would otherwise name a directory the model never mentioned.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from strands import ToolContext, tool
from strands.types.tools import AgentTool
from strands.vended_tools.file_editor import make_file_editor
from strands.vended_tools.python_repl import make_python_repl

from pynox import CodeTool

from ._errors import DeniedPath
from ._tool import tool_for

if TYPE_CHECKING:
    from ._sandbox import PynoxSandbox

__all__ = ["VENDABLE", "file_editor_description", "python_repl_description", "vended_tool"]

VENDABLE = ("run_python", "python_repl", "file_editor")
_READS_FIRST = frozenset({"view", "str_replace", "insert"})  # file_editor commands that read the path first


def vended_tool(name: str, sandbox: PynoxSandbox, runner: CodeTool) -> AgentTool:
    """The tool called ``name`` (one of :data:`VENDABLE`) over ``sandbox``, whose code runs by ``runner``."""
    if name == "run_python":
        # The sandbox's session is shared with its python_repl, and the sandbox belongs to one agent.
        return tool_for(runner)
    if name == "python_repl":
        return make_python_repl(sandbox=sandbox, description=python_repl_description(runner))
    return _file_editor(sandbox, file_editor_description(runner))


def python_repl_description(runner: CodeTool) -> str:
    """What ``python_repl`` does under ``runner``: its lifetime, where files may be written, its grants."""
    grants = runner.grants
    if runner.uses_session:
        lifetime = ("Calls share one Python process, like notebook cells: variables, imports and definitions "
                    "persist across calls. If a call times out or crashes, the process is replaced and they are "
                    "lost (the error says so).")
        keep = "keep what later calls need in variables"
    else:
        lifetime = ("Each call runs in a fresh interpreter; variables, imports, and definitions do not persist "
                    "across calls.")
        keep = "print what later calls need"
    if grants.write:
        files = (f"Files can be written only under {', '.join(grants.write)}; they are the host's own files and "
                 "stay after the call. Writing anywhere else is denied.")
    else:
        files = f"Writing files is denied everywhere, so nothing can be saved to disk: {keep}."
    return (f"Executes Python code in a Pynox sandbox (kernel-confined) and returns output (stdout), error "
            f"(stderr: the traceback, then what went wrong, with a hint when the sandbox refused something), "
            f"and exit_code (non-zero means the code failed). {lifetime} {files} stdin is not available "
            f"(input() fails). Use print() to surface values. The timeout argument can shorten the time limit "
            f"below, never extend it.\n\n{runner.description.rules}")


def file_editor_description(runner: CodeTool) -> str:
    """What ``file_editor`` may view and change under ``runner``'s grants."""
    grants = runner.grants
    runtime = "the Python standard library and installed packages"
    view = f"It can view {', '.join(grants.read)} (and {runtime})" if grants.read else f"It can view only {runtime}"
    change = (f"It can create or edit files only under {', '.join(grants.write)}." if grants.write
              else "It can create or edit nothing: every file is read-only here.")
    return ("Filesystem editor for viewing, creating, and editing files: view (a file with line numbers, or a "
            "part of it with view_range; a directory's entries two levels deep), create, str_replace and "
            "insert. Paths must be absolute. The files are the host's own, seen through a Pynox sandbox. "
            f"{view}; everything else is denied. {change} {runner.description.closing}")


def _file_editor(sandbox: PynoxSandbox, description: str) -> AgentTool:
    editor = make_file_editor(sandbox=sandbox)

    async def file_editor(command: Literal["view", "create", "str_replace", "insert"], path: str,
                          tool_context: ToolContext, file_text: str | None = None,
                          view_range: list[int] | None = None, old_str: str | None = None,
                          new_str: str | None = None, insert_line: int | None = None) -> str:
        """Filesystem editor for viewing, creating, and editing files.

        Args:
            command: The operation to perform: `view`, `create`, `str_replace`, `insert`.
            path: Absolute path to the file or directory.
            tool_context: Injected by the framework. Not user-facing.
            file_text: Content for new file (required for create command).
            view_range: Line range to view [start, end]. 1-indexed. End can be -1 for end of file.
            old_str: Exact string to find and replace (required for str_replace command).
            new_str: Replacement string (for str_replace and insert commands).
            insert_line: Line number where text should be inserted (0-indexed, required for insert command).
        """
        asked = path.rstrip("/\\")  # as strands' editor takes it
        try:
            if command in _READS_FIRST and asked.startswith("/") and ".." not in asked.split("/"):
                # A path the code may not read is denied as itself, before strands' editor looks for it
                # in a listing of its directory, which shows only what the grants make visible.
                await sandbox.check_readable(asked)
            text: str = await editor(command=command, path=path, tool_context=tool_context, file_text=file_text,
                                     view_range=view_range, old_str=old_str, new_str=new_str,
                                     insert_line=insert_line)
            return text
        except DeniedPath as denied:
            if denied.path != asked:  # strands listed the path's directory first, and that was refused
                denied = DeniedPath(asked, command, f"its directory {denied.path} may not be listed", denied.hint)
            raise PermissionError(str(denied)) from None  # the model reads the type: the one it knows

    return tool(name="file_editor", description=description, context="tool_context")(file_editor)
