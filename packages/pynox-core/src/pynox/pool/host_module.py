"""``pynox_host`` inside a confined job: the declared host functions, and nothing else.

Each function sends one call frame on the job's channel descriptor and blocks
until the pool answers with the host's result or error. The pool checks the
name again (a forged frame naming an undeclared function gets an error and
never reaches the client), counts calls and enforces the size limits; the
checks here only give the model a clear error sooner.
"""

from __future__ import annotations

import socket
import sys
import threading
import types
from typing import Any

import msgspec

from .frames import HEADER, pack, recv_exact
from .host_values import NotPlainJSON, check_plain_json

__all__ = ["MAX_PAYLOAD", "install_host_module"]

MAX_PAYLOAD = 1_000_000  # bytes of JSON each way
_MAX_ANSWER = MAX_PAYLOAD + 4096  # the answer wraps the result in a small object


class HostError(Exception):
    """Raised in the job when a host function failed, or a call could not be made."""


# The model imports it from pynox_host: tracebacks should name it so, not this module.
HostError.__module__ = "pynox_host"


def install_host_module(functions: list[str], channel_fd: int) -> None:
    """Create ``pynox_host`` with one callable per declared name; importing anything else fails."""
    sock = socket.socket(fileno=channel_fd)
    lock = threading.Lock()  # one call in flight per job: the channel carries no call ids

    def call(function: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        try:
            check_plain_json(list(args), "args")
            check_plain_json(kwargs, "kwargs")
            payload = msgspec.json.encode({"function": function, "args": args, "kwargs": kwargs})
        except (NotPlainJSON, TypeError, msgspec.EncodeError) as exc:
            raise HostError(f"{function}(): arguments must be plain JSON values: {exc}") from None
        if len(payload) > MAX_PAYLOAD:
            raise HostError(f"{function}(): arguments of {len(payload)} bytes exceed the 1 MB limit; "
                            "pass less data or write it to a granted file")
        with lock:
            try:
                sock.sendall(pack(payload))
                answer = _receive(sock)
            except OSError as exc:
                raise HostError(f"{function}(): the host channel failed: {exc}") from None
        if "error" in answer:
            raise HostError(str(answer["error"]))
        return answer.get("result")

    module = types.ModuleType("pynox_host", "Functions of the host application, callable from this job.")
    module.HostError = HostError  # type: ignore[attr-defined]
    for name in functions:
        setattr(module, name, _bind(call, name))
    module.__all__ = [*functions, "HostError"]  # type: ignore[attr-defined]
    sys.modules["pynox_host"] = module


def _bind(call: Any, name: str) -> Any:
    def host_function(*args: Any, **kwargs: Any) -> Any:
        return call(name, args, kwargs)

    host_function.__name__ = host_function.__qualname__ = name
    host_function.__doc__ = f"Call the host function {name!r}; it runs in the host application, not here."
    return host_function


def _receive(sock: socket.socket) -> dict[str, Any]:
    try:
        header = recv_exact(sock, HEADER.size, closed="the pool closed the channel")
        (size,) = HEADER.unpack(header)
        if size > _MAX_ANSWER:
            raise OSError(f"answer of {size} bytes is too large")
        answer = msgspec.json.decode(recv_exact(sock, size, closed="the pool closed the channel"))
    except EOFError as exc:
        raise OSError(str(exc)) from None
    if not isinstance(answer, dict):
        raise OSError("malformed answer")
    return answer


