"""``tool()``: the ``run_python(code: str) -> str`` function a model calls, with a docstring written for it.

The function is a real ``def`` (frameworks inspect its signature and reject
callable objects and partials), its only parameter is the code, and its
docstring tells the model exactly what it may touch. It is a
:class:`~pynox.CodeTool` seen as a plain function: permissions are fixed by the
host when the tool is made; the model can only ask for more.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ..grant_types import Grants, check_grants
from .code_tool import CodeTool
from .host_functions import HostErrors
from .runner import Runner

__all__ = ["make_tool"]

HostFunction = Callable[..., Any]


def make_tool(pool: Runner | None, *, profile: str | None, session: bool,
              functions: Mapping[str, HostFunction] | None, grants: Grants,
              host_errors: HostErrors | None = None) -> Callable[[str], str]:
    """Build ``run_python`` on ``pool`` (``None``: the default pool, started on the first call)."""
    owner = "pynox.tool()" if pool is None else f"{type(pool).__name__}.tool()"
    if "pool" in grants:  # else CodeTool's own parameter collides: "got multiple values for argument 'pool'"
        raise TypeError(f"{owner} takes no pool: it runs on {'the default pool' if pool is None else 'its own'}; "
                        "for another pool call that pool's .tool(...), or pynox.CodeTool(pool, ...)")
    check_grants(owner, grants)
    tool = CodeTool(pool, profile=profile, session=session, functions=functions, host_errors=host_errors,
                    **grants)

    def run_python(code: str) -> str:
        return tool.text(code)

    run_python.__doc__ = tool.doc
    # Real types, not the strings `from __future__ import annotations` leaves: frameworks inspect them.
    run_python.__annotations__ = {"code": str, "return": str}
    # A session tool's state lives until closed; the object itself, for whoever wants its parts.
    run_python.close = tool.close  # type: ignore[attr-defined]
    run_python.code_tool = tool  # type: ignore[attr-defined]
    return run_python
