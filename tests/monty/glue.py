"""Helpers of the Monty suite: feeding glue code to a Monty session, and the Monty document's glue code."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pydantic_monty

ROOT = Path(__file__).resolve().parents[2]


def feed(monty: pydantic_monty.Monty, code: str, lookup: dict[str, Any], **checkout: Any) -> Any:
    """Run glue code in a fresh Monty session (``checkout``: type_check, type_check_stubs, ...)."""
    with monty.checkout(script_name="agent.py", **checkout) as session:
        return session.feed_run(code, external_lookup=lookup)


def spec_glue(work_dir: Path | str) -> str:
    """The glue code of the Monty document (examples/monty_bridge.py holds it), writing into ``work_dir``."""
    example = (ROOT / "examples" / "monty_bridge.py").read_text()
    return example.split('AGENT_CODE = """', 1)[1].split('"""', 1)[0].replace("{work_dir}", str(work_dir))
