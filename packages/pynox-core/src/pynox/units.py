"""Durations and sizes as people write them: ``"500ms"``, ``"5s"``, ``"2m"``, ``"256m"``, ``"1g"``.

The one place that parses units, for the CLI, the protocol and the config file.
Numbers are accepted as they are: seconds for durations, bytes for sizes.
"""

from __future__ import annotations

import math
import re

from .errors import ConfigError, quoted

__all__ = ["format_duration", "format_size", "parse_duration", "parse_size"]

_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_SIZE_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "m": 1 << 20, "mb": 1 << 20,
               "g": 1 << 30, "gb": 1 << 30, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30}
_NUMBER_UNIT = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*")
# Beyond these a value is surely a mistake, and larger numbers overflow rlimits and timers.
_MAX_SECONDS = 7 * 24 * 3600.0
_MAX_BYTES = 1 << 50


def parse_duration(value: str | int | float, what: str = "duration") -> float:
    """Return seconds. ``"500ms"``, ``"5s"``, ``"2m"``, ``"1h"``, ``"7d"``, or a number of seconds."""
    if isinstance(value, bool):
        raise ConfigError(f"{what}: expected a duration like '5s', got {quoted(value)}")
    if isinstance(value, int | float):
        # An int beyond float range is simply too long; float() would raise OverflowError.
        seconds = float(value) if abs(value) <= _MAX_SECONDS else math.inf
    elif isinstance(value, str):
        match = _NUMBER_UNIT.fullmatch(value)
        unit = match.group(2).lower() if match else ""
        if match is None or unit not in _DURATION_UNITS:
            raise ConfigError(f"{what}: {quoted(value)} is not a duration; write e.g. '500ms', '5s', '2m', '1h' "
                              "or '1d'")
        seconds = float(match.group(1)) * _DURATION_UNITS[unit]
    else:
        raise ConfigError(f"{what}: expected a duration like '5s', got {type(value).__name__}")
    if not math.isfinite(seconds) or seconds <= 0 or seconds > _MAX_SECONDS:
        raise ConfigError(f"{what}: {quoted(value)} must be more than 0 and at most 7 days")
    return seconds


def parse_size(value: str | int | float, what: str = "size") -> int:
    """Return bytes. ``"256m"``, ``"1g"``, ``"64k"``, ``"512mb"``, or a number of bytes."""
    if isinstance(value, bool):
        raise ConfigError(f"{what}: expected a size like '256m', got {quoted(value)}")
    if isinstance(value, int):
        size = value
    elif isinstance(value, float) and value.is_integer():
        size = int(value)
    elif isinstance(value, str):
        match = _NUMBER_UNIT.fullmatch(value)
        unit = match.group(2).lower() if match else ""
        if match is None or unit not in _SIZE_UNITS:
            raise ConfigError(f"{what}: {quoted(value)} is not a size; write e.g. '64k', '256m' or '1g'")
        amount = float(match.group(1)) * _SIZE_UNITS[unit]
        # "9" * 400 is inf as a float, and int(inf) raises OverflowError.
        size = int(amount) if amount <= _MAX_BYTES else _MAX_BYTES + 1
    else:
        raise ConfigError(f"{what}: expected a size like '256m', got {quoted(value)}")
    if size <= 0 or size > _MAX_BYTES:
        raise ConfigError(f"{what}: {quoted(value)} must be more than 0 and at most 1 PiB")
    return size


def _exact(number: float) -> str:
    return repr(round(number, 9)).removesuffix(".0")


def format_duration(seconds: float) -> str:
    """An exact spelling of a duration, for messages: ``5s``, ``1.5s``, ``250ms``, ``1000.001s``.

    Exact, so a message never reads "30s exceeds the ceiling of 30s" for 30.0000001s.
    """
    if seconds < 1:
        return f"{_exact(seconds * 1000)}ms"
    return f"{_exact(seconds)}s"


def format_size(size: int) -> str:
    """A size for messages: ``256m``, ``1g``, ``1536k`` or plain bytes."""
    for suffix, factor in (("g", 1 << 30), ("m", 1 << 20), ("k", 1 << 10)):
        if size % factor == 0:
            return f"{size // factor}{suffix}"
    return f"{size} bytes"
