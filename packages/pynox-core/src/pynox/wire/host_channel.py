"""The host channel: its two frames and its bounds, shared by the job's ``pynox_host``, the pool's relay and
the client.

Both directions are typed frames (length-prefixed JSON, see :mod:`.frames`): the job sends a
:class:`HostCall`, the pool answers it with a :class:`HostAnswer` carrying the same ``tag``. Each side
encodes a frame once and decodes it once, straight into its struct.

The pool enforces the bounds (a job can write any frame); ``pynox_host`` checks them
only to give the model a clear error sooner, and the client to refuse an
answer the pool would refuse.
"""

from __future__ import annotations

from typing import Any

import msgspec

from .frames import HEADER

__all__ = ["MAX_ANSWER", "MAX_IN_FLIGHT", "MAX_PAYLOAD", "PIP_FUNCTION", "HostAnswer", "HostCall", "encode_frame",
           "tag_size"]

# The pool's own host function in a session opened with pip_install: a `%pip install NAME` line of a step
# calls it, and the pool (never the client) installs NAME for the session (see pynox.server.packages). A
# leading underscore: no declared host function can have this name.
PIP_FUNCTION = "_pynox_pip"

MAX_PAYLOAD = 1_000_000  # bytes of JSON each way
MAX_IN_FLIGHT = 8  # calls of one job waiting for the host at once (the pool refuses more)
MAX_ANSWER = MAX_PAYLOAD + 4096  # the answer wraps the result in a small object


class HostCall(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Job -> pool: one call of a declared function. ``tag`` is the job's own number for the call, echoed in
    its answer (calls from threads overlap). Fields are written in this order: the frame is ``{"tag":N,``
    and then exactly the arguments' object that the 1 MB limit measures (:func:`tag_size`)."""

    tag: int = 0
    function: str
    args: list[Any]
    kwargs: dict[str, Any]


class HostAnswer(msgspec.Struct, forbid_unknown_fields=True):
    """Pool -> job: the answer to the call ``tag``: its ``result`` (any JSON value, null included) or its
    ``error`` (a message for the model); exactly one of them is set."""

    tag: int
    result: Any = msgspec.UNSET
    error: str | msgspec.UnsetType = msgspec.UNSET


_encoder = msgspec.json.Encoder()


def encode_frame(message: HostCall | HostAnswer) -> bytearray:
    """``message`` as one frame: the header and the JSON, encoded once into one buffer."""
    buffer = bytearray(HEADER.size)
    _encoder.encode_into(message, buffer, HEADER.size)
    HEADER.pack_into(buffer, 0, len(buffer) - HEADER.size)
    return buffer


def tag_size(tag: int) -> int:
    """Bytes of ``"tag":N,`` in an encoded call frame: what its arguments' size leaves out."""
    return len(b'"tag":,') + len(str(tag))
