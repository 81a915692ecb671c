"""Pynox for Monty: the model's glue code runs in Monty, the heavy code it hands off runs in Pynox.

    with pynox.Pool() as pool, pydantic_monty.Monty() as monty:
        lookup = pynox_monty.external_lookup(pool, allow_write=[work_dir])
        with monty.checkout(type_check=True, type_check_stubs=pynox_monty.type_stubs(lookup)) as session:
            session.feed_run(agent_code, external_lookup=lookup)

``run_python(code, timeout=None)`` inside Monty returns ``{"exit", "stdout", "stderr", "error", "truncated"}``;
the host fixes what the code may touch. Under ``AsyncMonty``, :func:`async_external_lookup` gives an
``async def run_python`` the glue code awaits. Nothing starts at import.
"""

from __future__ import annotations

from ._bridge import async_external_lookup, async_python_function, external_lookup, python_function
from ._stubs import type_stubs

__all__ = ["async_external_lookup", "async_python_function", "external_lookup", "python_function", "type_stubs"]
