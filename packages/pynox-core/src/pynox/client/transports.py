"""What ``Pool`` runs over: a transport carries the protocol's lines to a pool and its answers back.

``Pool`` and ``Session`` are the client: validation, the request's typed grants, the session rules (open
and reopen, ``session_reopened``), host functions, patience, cancel and the lifecycle. Whatever carries
their lines is a transport, with this interface, and three exist:

| transport | made by | carries the lines to |
| --- | --- | --- |
| ``_Process`` (``pool.py``) | ``Pool()`` | the pipes of a ``pynox pool`` the client starts |
| ``Connection`` (``connect.py``) | ``Pool(connect="unix:PATH")`` | a listening pool's socket |
| ``RayFleet`` (``pynox_ray.fleet``) | ``pynox_ray.RayPool()`` | one ``pynox pool`` per node of a Ray cluster |

A transport writes each request line (``write_line``; a host call's reply and a cancel as structs through
``write``) and hands each decoded answer to ``on_line``; its first line (``ready``) is the pool's ready event,
or why it could not start. ``dead`` says the next call must open a new one; ``on_exit`` is called once
when it is gone, and every run sent through it then fails.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable
from typing import Any, Protocol

from ..protocol import Answer, Reply, Request

__all__ = ["Transport", "TransportFactory"]


class Transport(Protocol):
    """One way to a pool, as ``Pool`` uses it."""

    ready: concurrent.futures.Future[bytes]  # the pool's first line: its ready event, or a start_error
    dead: bool  # the next call opens a new transport
    hung: str | None  # why the client stopped it, when it did
    last_heard: float  # time.monotonic() of its last line: a transport silent past a run's patience is hung

    def write(self, message: Request | Reply) -> None: ...

    def write_line(self, line: bytes) -> None: ...

    def stop_hung(self, why: str) -> None: ...

    def forget_after_fork(self) -> None: ...

    def describe_exit(self) -> str: ...

    def close(self, timeout: float) -> None: ...


# How a Pool opens one: given where its answers go (a decoded line, a line it cannot read, its end).
TransportFactory = Callable[[Callable[[Answer], None], Callable[[bytes, str], None], Callable[[Any], None]],
                            Transport]
