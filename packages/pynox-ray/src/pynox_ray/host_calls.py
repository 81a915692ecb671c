"""Host functions, answered in the caller's process for a job on any node.

A :class:`~pynox_ray.messages.HostCall` from a node is checked and run by the core's own
``answer_call`` (signature binding, strict conversion, the 1 MB result, what an exception may tell the job),
exactly as a local ``pynox.Pool`` answers one; each call runs on a thread of its own, so a slow function
holds up neither other calls nor the run's stream. ``async def`` functions are awaited on the caller's loop
(``arun``) or on one loop of the pool's own (``run`` from a thread).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Mapping
from typing import Any

from pynox.host_functions import HostErrors, answer_call

from .messages import HostCall

__all__ = ["HostLoop", "answer"]

HostFunction = Callable[..., Any]


class HostLoop:
    """An event loop on a thread of its own, for async host functions of runs made without one; started on
    first use."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None

    def get(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                threading.Thread(target=self._run, args=(self._loop,), name="pynox-ray-host-loop",
                                 daemon=True).start()
            return self._loop

    @staticmethod
    def _run(loop: asyncio.AbstractEventLoop) -> None:
        try:
            loop.run_forever()
        finally:
            loop.close()

    def close(self) -> None:
        with self._lock:
            loop, self._loop = self._loop, None
        if loop is not None:
            loop.call_soon_threadsafe(loop.stop)


def answer(call: HostCall, functions: Mapping[str, HostFunction] | None, host_errors: HostErrors,
           loop: asyncio.AbstractEventLoop | Callable[[], asyncio.AbstractEventLoop],
           send: Callable[[dict[str, Any]], None]) -> None:
    """Run ``call`` on a thread and ``send`` its answer (``{"result": ...}`` or ``{"error": ...}``)."""

    def run_awaitable(awaitable: Any) -> Any:
        async def wait() -> Any:
            return await awaitable

        target = loop if isinstance(loop, asyncio.AbstractEventLoop) else loop()
        return asyncio.run_coroutine_threadsafe(wait(), target).result()

    def work() -> None:
        function = functions.get(call.function) if functions else None
        send(answer_call(call.function, function, call.args, call.kwargs, host_errors=host_errors,
                         run_awaitable=run_awaitable))

    threading.Thread(target=work, name="pynox-ray-host-call", daemon=True).start()
