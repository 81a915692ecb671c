"""Output as it happens, the client's half: the typed events a run's callback gets, and the iterator.

A run given ``on_output`` (or iterated with ``stream``) asks the pool for ``"stream": true``; the pool
then sends its stdout and stderr in chunks and each display output as it comes, before the result
(see docs/protocol.md). Each event is decoded once, in protocol.py, and becomes here what the caller
gets: :class:`StreamText` for text, :class:`~pynox.client.result.Output` for a display output. A
callback runs on the caller's own thread (``run``) or event loop (``arun``), in the order the pool sent
the events, and always before the run returns its result.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

from ..protocol import DisplayEvent, StreamEvent
from .result import Output, Result

__all__ = ["OutputCallback", "OutputEvent", "StreamText", "event_of", "iterate", "wait_with_events"]

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StreamText:
    """A chunk of what the code wrote, as it wrote it: ``name`` is "stdout" or "stderr"."""

    name: Literal["stdout", "stderr"]
    text: str


OutputEvent = StreamText | Output
OutputCallback = Callable[[OutputEvent], Any]


def event_of(message: StreamEvent | DisplayEvent) -> OutputEvent:
    if isinstance(message, StreamEvent):
        return StreamText(name=message.name, text=message.text)
    return Output(output_type="display_data", data=message.data, metadata=message.metadata)


_DONE = object()


def wait_with_events(future: concurrent.futures.Future[Any], events: queue.SimpleQueue[Any],
                     callback: OutputCallback, patience: float, abandon: Callable[[], BaseException]) -> Any:
    """Wait for ``future`` as ``run`` does, calling ``callback`` on this thread with each event as it comes.
    The reader thread puts every event before it completes the future, so all come before the answer."""
    future.add_done_callback(lambda _: events.put(_DONE))
    deadline = time.monotonic() + patience
    while True:
        try:
            item = events.get(timeout=max(deadline - time.monotonic(), 0))
        except queue.Empty:
            raise abandon() from None
        if item is _DONE:
            return future.result()
        call(callback, item)


def call(callback: OutputCallback, event: OutputEvent) -> None:
    """A callback that raises costs its own event, never the run (whose result still comes)."""
    try:
        callback(event)
    except Exception:
        _log.exception("pynox: an on_output callback raised")


async def iterate(run: Callable[[OutputCallback], Awaitable[Result]]) -> AsyncIterator[OutputEvent | Result]:
    """Each event of ``run`` as it comes, then its :class:`Result`. Leaving the loop early cancels the run."""
    events: asyncio.Queue[OutputEvent] = asyncio.Queue()
    task = asyncio.ensure_future(run(events.put_nowait))
    try:
        while True:
            getter = asyncio.ensure_future(events.get())
            done, _ = await asyncio.wait({getter, task}, return_when=asyncio.FIRST_COMPLETED)
            if getter in done:
                yield getter.result()
                continue
            getter.cancel()
            while not events.empty():
                yield events.get_nowait()
            yield task.result()
            return
    finally:
        if not task.done():
            task.cancel()
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass
