"""Host functions, answered in the caller's process for a job on any node.

A :class:`~pynox_ray.messages.HostCall` from a node is checked and run by the core's own
``answer_call`` (signature binding, strict conversion, the 1 MB result, what an exception may tell the job),
exactly as a local ``pynox.Pool`` answers one; each call runs on a thread of its own, so a slow function
holds up neither other calls nor the run's stream. ``async def`` functions are awaited on the caller's loop
(``arun``) or on the pool's :class:`pynox.transport.HostLoop` (``run`` from a thread).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Mapping
from typing import Any

from pynox.transport import HostErrors, answer_call, awaiting_on

from .messages import HostCall

__all__ = ["answer"]

HostFunction = Callable[..., Any]


def answer(call: HostCall, functions: Mapping[str, HostFunction] | None, host_errors: HostErrors,
           loop: asyncio.AbstractEventLoop | Callable[[], asyncio.AbstractEventLoop],
           send: Callable[[dict[str, Any]], None]) -> None:
    """Run ``call`` on a thread and ``send`` its answer (``{"result": ...}`` or ``{"error": ...}``)."""

    def work() -> None:
        function = functions.get(call.function) if functions else None
        send(answer_call(call.function, function, call.args, call.kwargs, host_errors=host_errors,
                         run_awaitable=awaiting_on(loop)))

    threading.Thread(target=work, name="pynox-ray-host-call", daemon=True).start()
