"""The descriptor audit of a pool process: a ``sitecustomize`` (this directory on the pool's PYTHONPATH) that
follows, per descriptor number, who opened and who closed it, and writes every close of a number its closer no
longer owns (closed twice, a raw close under a live socket, a socket collected open) with the stacks of the
events before it. A test starts its pool with :func:`audited` as its environment, and asserts :func:`reports` is
empty. The templates (started with ``-I`` and an environment of their own) are not audited."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["audited", "audited_pids", "reports"]

_HERE = Path(__file__).parent


def audited(directory: Path) -> dict[str, str]:
    """This environment, with the audit on for a ``pynox pool`` started in it; its reports go to ``directory``."""
    path = os.pathsep.join([str(_HERE), *filter(None, [os.environ.get("PYTHONPATH")])])
    return {**os.environ, "PYTHONPATH": path, "PYNOX_FD_AUDIT": str(directory)}


def audited_pids(directory: Path) -> list[int]:
    """The processes the audit was installed in (a test's control: without it, no report proves nothing)."""
    return sorted(int(name.removesuffix(".on")) for name in os.listdir(directory) if name.endswith(".on"))


def reports(directory: Path) -> list[str]:
    """Every report written to ``directory`` (one per bad close), each with its stacks."""
    found: list[str] = []
    for name in sorted(name for name in os.listdir(directory) if name.endswith(".txt")):
        text = "\n" + (directory / name).read_text()
        found += ["=== " + part.rstrip() for part in text.split("\n=== ")[1:]]
    return found
