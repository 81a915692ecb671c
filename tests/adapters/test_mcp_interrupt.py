"""An MCP client's cancel of a ``run_python`` call interrupts the session's step, as a notebook's interrupt does.

The MCP SDK's own client starts the real ``pynox-mcp --session`` server; a call given up by its caller (an
anyio cancel scope) makes the client send ``notifications/cancelled``, the server cancels the call's
handler, and the pool interrupts the step (``KeyboardInterrupt``): the session's variables live on. A step
that swallows the interrupt is killed after the grace, and the next call's text says the state is gone.
"""

from __future__ import annotations

import time

import anyio
import mcp_types as types
import pytest
from mcp.client import Client

from .test_mcp import run, text_of, with_client

pytestmark = pytest.mark.timeout(120)


async def _given_up(client: Client, code: str, after: float = 1.5) -> None:
    """Call ``code`` and give the call up (the SDK's client sends notifications/cancelled) after ``after`` s."""
    with anyio.move_on_after(after) as scope:
        await run(client, code)
    assert scope.cancelled_caught, "the call finished before it was given up"


def test_a_cancelled_call_interrupts_the_step_and_the_session_keeps_its_variables(
        earlier_pools: frozenset[int]) -> None:
    async def body(client: Client) -> list[types.CallToolResult]:
        first = await run(client, "x = 41")
        await _given_up(client, "x += 1\nwhile True:\n    pass")
        started = time.monotonic()
        after = await run(client, "print(x)")
        assert time.monotonic() - started < 5  # not held until the step's 30 s timeout
        return [first, after]

    first, after = with_client(["--session"], body)
    assert not first.is_error
    assert not after.is_error and text_of(after) == "42", text_of(after)


def test_a_cancelled_call_that_will_not_stop_is_killed_and_the_next_call_says_the_state_is_gone(
        earlier_pools: frozenset[int]) -> None:
    swallows = "import time\nwhile True:\n    try:\n        time.sleep(10)\n    except KeyboardInterrupt:\n        pass"

    async def body(client: Client) -> types.CallToolResult:
        await run(client, "x = 41")
        await _given_up(client, swallows)
        return await run(client, "print('x' in dir())")

    after = with_client(["--session"], body)
    text = text_of(after)
    assert "earlier process was gone" in text and "cancelled" in text and text.endswith("False"), text
