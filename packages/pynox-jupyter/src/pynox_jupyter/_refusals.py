"""Cells the kernel refuses before they run: shell commands and magics that would start a process.

Inside the session such a cell would fail anyway (seccomp refuses every new process, and IPython would
print an ``OSError`` about it); refusing it here says why, in the cell's error, where a notebook written
for IPython would otherwise die on a bare exception or a ``SyntaxError`` in plain Python. The cell is
read as IPython reads it (its own input transformer), so ``!ls``, ``x = !ls``, ``%%bash`` and ``%sx``
are found wherever they stand, in the body of ``%%time`` or ``%%capture`` too.
"""

from __future__ import annotations

import ast

from IPython.core.inputtransformer2 import TransformerManager

__all__ = ["refusal"]

# Magics that run another program. %run stays: it runs a Python file in the session's own process.
_PROCESS_MAGICS = frozenset({"system", "sx", "sc", "bash", "sh", "script", "perl", "ruby", "python", "python2",
                             "python3", "pypy", "killbgscripts", "edit", "less", "more", "man"})
_INSTALL_MAGICS = frozenset({"pip", "conda", "mamba", "micromamba", "uv"})
_SHELL = ("shell commands (!cmd, %%bash, %sx, %system) do not run in a Pynox kernel: its cells may not "
          "start processes. Do it in Python instead: os.listdir, pathlib, shutil, open()")
_INSTALL = ("%pip and %conda do not install anything in a Pynox kernel: the packages a notebook can import "
            "are the kernel's, chosen by whoever installed it. Ask them for the package")
_transformer = TransformerManager()


def refusal(cell: str) -> str | None:
    """Why the kernel refuses ``cell``, or None to run it."""
    try:
        tree = ast.parse(_transformer.transform_cell(cell))
    except (SyntaxError, ValueError, RecursionError):
        return None  # IPython reports it, when the cell runs, as it would anywhere
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and _on_shell(node.func.value)):
            continue
        method = node.func.attr
        if method in ("system", "getoutput"):
            return _SHELL
        if method in ("run_line_magic", "run_cell_magic") and node.args and isinstance(node.args[0], ast.Constant):
            magic = str(node.args[0].value)
            if magic in _PROCESS_MAGICS:
                return _SHELL
            if magic in _INSTALL_MAGICS:
                return _INSTALL
            body = node.args[2] if method == "run_cell_magic" and len(node.args) > 2 else None
            if isinstance(body, ast.Constant) and isinstance(body.value, str):
                inner = refusal(body.value)  # %%time, %%capture...: their body is a cell too
                if inner is not None:
                    return inner
    return None


def _on_shell(node: ast.expr) -> bool:
    """``get_ipython()``, as IPython's transformer writes a magic's call."""
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "get_ipython"
