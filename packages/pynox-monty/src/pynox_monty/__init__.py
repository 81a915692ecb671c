"""Pynox for Monty: the model's glue code runs in Monty, the heavy code it hands off runs in Pynox.

    with pynox.Pool() as pool, pydantic_monty.Monty() as monty, monty.checkout() as session:
        session.feed_run(agent_code, external_lookup=pynox_monty.external_lookup(pool, allow_write=[work_dir]))

``run_python(code, timeout=None)`` inside Monty returns ``{"exit", "stdout", "stderr", "error", "truncated"}``;
the host fixes what the code may touch. Nothing starts at import.
"""

from __future__ import annotations

from ._bridge import external_lookup, python_function

__all__ = ["external_lookup", "python_function"]
