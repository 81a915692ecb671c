"""What may cross the host channel: plain JSON values, checked strictly in both directions.

A JSON encoder is lenient where a host function must not be surprised: it
turns bytes into base64 text, sets and tuples into lists, int keys into
strings, NaN and infinities into ``null``, and fails with a raw ``ValueError``
on an integer too long to print. So before anything is sent (by ``pynox_host``
in the job, by the client for a host function's result) the value is walked
and refused unless it is exactly: ``None``, ``bool``, an ``int`` of at most
64 bits, a finite ``float``, a ``str`` that is valid UTF-8, a ``list`` (or
``tuple``, sent as a list) of such values, or a ``dict`` with ``str`` keys;
nested at most :data:`MAX_DEPTH` deep (deeper would overflow a decoder's
stack on the other side).
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["MAX_DEPTH", "NotPlainJSON", "check_plain_json"]

MAX_DEPTH = 64
_INT_RANGE = (-(1 << 63), (1 << 64) - 1)  # what every JSON codec Pynox uses reads back exactly


class NotPlainJSON(ValueError):
    """The value (at ``where``) is not plain JSON; the message says what is wrong."""


def check_plain_json(value: Any, where: str) -> None:
    """Raise :class:`NotPlainJSON` naming the first part of ``value`` that is not plain JSON."""
    pending: list[tuple[Any, str, int]] = [(value, where, 0)]
    while pending:
        item, path, depth = pending.pop()
        if depth > MAX_DEPTH:
            raise NotPlainJSON(f"{path}: nested more than {MAX_DEPTH} levels deep")
        kind = type(item)
        if item is None or kind is bool:
            continue
        if kind is str:
            _utf8(item, path)
            continue
        if kind is int:
            if not _INT_RANGE[0] <= item <= _INT_RANGE[1]:
                raise NotPlainJSON(f"{path}: the integer does not fit in 64 bits; pass it as a string")
            continue
        if kind is float:
            if not math.isfinite(item):
                raise NotPlainJSON(f"{path}: {item!r} is not a JSON number")
            continue
        if kind is list or kind is tuple:
            pending += [(element, f"{path}[{index}]", depth + 1) for index, element in enumerate(item)]
            continue
        if kind is dict:
            for key, element in item.items():
                if type(key) is not str:  # its value is not shown: a message may leave the host
                    raise NotPlainJSON(f"{path}: a key is a {type(key).__name__}, JSON keys are strings")
                _utf8(key, path)
                pending.append((element, f"{path}[{key!r}]", depth + 1))
            continue
        raise NotPlainJSON(f"{path}: a {kind.__name__} is not a JSON value (str, int, float, bool, None, "
                           "list or dict of them)")


def _utf8(text: str, path: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise NotPlainJSON(f"{path}: the text is not valid Unicode ({exc.reason} at {exc.start})") from None
