"""Durations and sizes as people write them: ``"500ms"``, ``"5s"``, ``"2m"``, ``"256m"``, ``"1g"``.

The one place that parses units, for the CLI, the protocol and the config file.
Numbers are accepted as they are: seconds for durations, bytes for sizes.
"""

from __future__ import annotations

import math
import re

from .errors import ConfigError

__all__ = ["format_duration", "format_size", "parse_duration", "parse_size"]

_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_SIZE_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "m": 1 << 20, "mb": 1 << 20,
               "g": 1 << 30, "gb": 1 << 30, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30}
_NUMBER_UNIT = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*")
# Beyond these a value is surely a mistake, and larger numbers overflow rlimits and timers.
_MAX_SECONDS = 7 * 24 * 3600.0
_MAX_BYTES = 1 << 50


def parse_duration(value: str | int | float, what: str = "duration") -> float:
    """Return seconds. ``"500ms"``, ``"5s"``, ``"2m"``, ``"1h"``, or a number of seconds."""
    if isinstance(value, bool):
        raise ConfigError(f"{what}: expected a duration like '5s', got {value!r}")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        match = _NUMBER_UNIT.fullmatch(value)
        unit = match.group(2).lower() if match else ""
        if match is None or unit not in _DURATION_UNITS:
            raise ConfigError(f"{what}: {value!r} is not a duration; write e.g. '500ms', '5s', '2m' or '1h'")
        seconds = float(match.group(1)) * _DURATION_UNITS[unit]
    else:
        raise ConfigError(f"{what}: expected a duration like '5s', got {type(value).__name__}")
    if not math.isfinite(seconds) or seconds <= 0 or seconds > _MAX_SECONDS:
        raise ConfigError(f"{what}: {value!r} must be more than 0 and at most 7 days")
    return seconds


def parse_size(value: str | int | float, what: str = "size") -> int:
    """Return bytes. ``"256m"``, ``"1g"``, ``"64k"``, ``"512mb"``, or a number of bytes."""
    if isinstance(value, bool):
        raise ConfigError(f"{what}: expected a size like '256m', got {value!r}")
    if isinstance(value, int):
        size = value
    elif isinstance(value, float) and value.is_integer():
        size = int(value)
    elif isinstance(value, str):
        match = _NUMBER_UNIT.fullmatch(value)
        unit = match.group(2).lower() if match else ""
        if match is None or unit not in _SIZE_UNITS:
            raise ConfigError(f"{what}: {value!r} is not a size; write e.g. '64k', '256m' or '1g'")
        size = int(float(match.group(1)) * _SIZE_UNITS[unit])
    else:
        raise ConfigError(f"{what}: expected a size like '256m', got {value!r}")
    if size <= 0 or size > _MAX_BYTES:
        raise ConfigError(f"{what}: {value!r} must be more than 0 and at most 1 PiB")
    return size


def format_duration(seconds: float) -> str:
    """The shortest exact spelling of a duration, for messages: ``5s``, ``1.5s``, ``250ms``."""
    if seconds < 1:
        return f"{round(seconds * 1000)}ms"
    return f"{seconds:g}s"


def format_size(size: int) -> str:
    """A size for messages: ``256m``, ``1g``, ``1536k`` or plain bytes."""
    for suffix, factor in (("g", 1 << 30), ("m", 1 << 20), ("k", 1 << 10)):
        if size % factor == 0:
            return f"{size // factor}{suffix}"
    return f"{size} bytes"
