"""The kernel's half that runs inside the confined session: IPython's own shell, bound to ``__main__``.

Everything here runs after confinement, next to the notebook's code, so the kernel trusts none of it:
it reads back one JSON value per cell (decoded and bounded in ``_outputs.py``), and the verdict on how
the cell ended is the pool's (the step's result). IPython is here for what a notebook expects of its
shell and nothing else: magics, ``_``/``Out``/``In``, the display formatter and the display hook. A
magic that would start a process fails as any process does in a Pynox job (seccomp refuses it); the
kernel refuses those cells before they are sent, with a clearer message.

The kernel sends each cell as a session step whose code is one call, ``run(...)``. A cell that raised
is raised again here, its traceback starting at the cell's own frames, so that the pool's report
describes it (type, message and the hint for a refused path or socket) as for any job; IPython's
formatted traceback for the notebook, and what the cell displayed before it raised, are kept for
:func:`failed`, which the kernel asks for next.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import IPython
from IPython.core.displayhook import DisplayHook
from IPython.core.displaypub import DisplayPublisher
from IPython.core.interactiveshell import InteractiveShell

__all__ = ["failed", "run"]

# What one cell displayed, in order: nbformat outputs (display_data, execute_result).
_outputs: list[dict[str, Any]] = []
_IPYTHON_FILE: str = IPython.__file__ or ""
_traceback: list[str] = []


class _Publisher(DisplayPublisher):
    """``display()``: each bundle kept, in order, as a ``display_data`` output."""

    def publish(self, data: dict[str, Any], metadata: dict[str, Any] | None = None, *args: Any,
                **kwargs: Any) -> None:
        sys.stdout.flush()  # what was printed before it comes before it
        _outputs.append({"output_type": "display_data", "data": data, "metadata": metadata or {}})

    def clear_output(self, wait: bool = False) -> None:
        _outputs.clear()  # a cell that clears its output keeps only what it displays afterwards


class _Hook(DisplayHook):
    """The cell's trailing value: an ``execute_result`` with its count, and ``_``/``Out`` as IPython keeps them."""

    def write_output_prompt(self) -> None:
        pass

    def write_format_data(self, format_dict: dict[str, Any], md_dict: dict[str, Any] | None = None) -> None:
        _outputs.append({"output_type": "execute_result", "data": format_dict, "metadata": md_dict or {},
                         "execution_count": self.prompt_count})

    def finish_displayhook(self) -> None:
        sys.stdout.flush()
        self._is_active = False


class _Shell(InteractiveShell):
    displayhook_class = _Hook
    display_pub_class = _Publisher

    def _showtraceback(self, etype: Any, evalue: Any, stb: list[str]) -> None:
        # Not printed: the kernel sends it as the cell's error, with the pool's hint.
        _traceback[:] = stb

    def enable_gui(self, gui: str | None = None) -> None:
        # No event loop integration in a job (%matplotlib inline needs none and does not call this).
        if gui not in (None, "inline"):
            raise RuntimeError(f"GUI event loops ({gui}) do not run in a Pynox kernel; use %matplotlib inline")


_shell: _Shell | None = None


def _get_shell() -> _Shell:
    global _shell
    if _shell is None:
        main = sys.modules["__main__"]
        # No history file and no cache of compiled cells on disk: the session's state is its memory.
        os.environ.setdefault("MPLBACKEND", "module://matplotlib_inline.backend_inline")
        _shell = _Shell.instance(user_module=main, user_ns=main.__dict__)
        if _shell.history_manager is not None:
            _shell.history_manager.enabled = False
        _shell.colors = "nocolor"
    return _shell


def run(cell: str, execution_count: int, *, silent: bool = False, store_history: bool = True) -> str:
    """Run one cell; its outputs as JSON. A cell that raised raises that again (see the module's doc)."""
    shell = _get_shell()
    _outputs.clear()
    _traceback.clear()
    shell.execution_count = execution_count
    result = shell.run_cell(cell, store_history=store_history, silent=silent)
    error = result.error_before_exec or result.error_in_exec
    if error is not None:
        raise error.with_traceback(_from_cell(error.__traceback__))
    return json.dumps(_outputs, default=repr)


def failed() -> str:
    """The last cell that raised: what it displayed first, and IPython's traceback of it (without colours)."""
    return json.dumps({"outputs": _outputs, "traceback": _traceback}, default=repr)


def _from_cell(tb: Any) -> Any:
    """The traceback from the cell's own first frame on: IPython's and this module's frames left out."""
    ipython = os.path.dirname(_IPYTHON_FILE) + os.sep
    start = tb
    while start is not None:
        filename = start.tb_frame.f_code.co_filename
        if not (filename == __file__ or filename.startswith(ipython)):
            return start
        start = start.tb_next
    return tb
