"""pynox.units: durations and sizes as people write them, the one parser for CLI, protocol and config."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pynox.errors import ConfigError
from pynox.units import format_duration, format_size, parse_duration, parse_size

pytestmark = pytest.mark.pure

WEEK = 7 * 24 * 3600
PIB = 1 << 50


# --- durations -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("value", "seconds"), [
    ("500ms", 0.5), ("1ms", 0.001), ("1.5ms", 0.0015),
    ("5s", 5.0), ("0.25s", 0.25), ("1.5s", 1.5),
    ("2m", 120.0), ("1.5m", 90.0),
    ("1h", 3600.0), ("0.5h", 1800.0),
    ("5S", 5.0), ("2M", 120.0), ("500MS", 0.5), ("1H", 3600.0),
    (" 5s ", 5.0), ("5 s", 5.0), ("\t5s\n", 5.0),
    ("168h", float(WEEK)), (f"{WEEK}s", float(WEEK)),
    ("7d", float(WEEK)), ("1d", 86400.0), ("0.5d", 43200.0), ("2D", 172800.0),  # the docs' "at most 7 days"
    (5, 5.0), (0.25, 0.25), (1, 1.0), (WEEK, float(WEEK)), (1e-3, 0.001),
])
def test_parse_duration(value: str | int | float, seconds: float) -> None:
    result = parse_duration(value)
    assert result == pytest.approx(seconds, rel=1e-12)
    assert type(result) is float


@pytest.mark.parametrize("value", [
    # no unit in a string, or an unknown unit
    "", " ", "5", "1.5", "s", "ms", "5x", "5sec", "5 secs", "5us", "5ns", "1w", "5ss",
    # not a plain decimal
    "1e3s", "1_000s", "0x10s", ".5s", "5.s", "+5s", "five s", "5s5", "5s 2m", "∞s", "nans", "infs",
    "\u0665s",  # Arabic-Indic digit five: not an ASCII digit
    # not more than zero
    "0s", "0ms", "0.0s", "-5s", "-1ms", 0, 0.0, -0.0, -1, -0.5,
    # over a week
    f"{WEEK + 1}s", "169h", "10081m", "8d", "7.01d", WEEK + 1, WEEK + 0.001, 1e300,
    # not finite
    math.nan, math.inf, -math.inf,
    # wrong types, bool included
    True, False, None, [], ["5s"], {}, b"5s", object(),
])
def test_parse_duration_refuses(value: object) -> None:
    with pytest.raises(ConfigError):
        parse_duration(value)  # type: ignore[arg-type]


def test_parse_duration_refuses_an_int_too_large_for_a_float() -> None:
    with pytest.raises(ConfigError):
        parse_duration(10 ** 400)


def test_a_duration_rounding_to_zero_is_still_refused() -> None:
    # Rounded below the smallest positive float, this is not more than zero.
    with pytest.raises(ConfigError):
        parse_duration("0." + "0" * 400 + "1s")


def test_the_field_name_leads_the_message() -> None:
    with pytest.raises(ConfigError, match=r"^timeout: '5x' is not a duration"):
        parse_duration("5x", "timeout")
    with pytest.raises(ConfigError, match=r"^session_idle: .* more than 0"):
        parse_duration(0, "session_idle")
    with pytest.raises(ConfigError, match=r"^timeout: expected a duration like '5s', got True"):
        parse_duration(True, "timeout")
    with pytest.raises(ConfigError, match=r"^memory: '1t' is not a size"):
        parse_size("1t", "memory")
    with pytest.raises(ConfigError, match=r"^max_output: .* more than 0"):
        parse_size(0, "max_output")
    with pytest.raises(ConfigError, match=r"^memory: expected a size like '256m', got False"):
        parse_size(False, "memory")


def test_default_field_names() -> None:
    with pytest.raises(ConfigError, match=r"^duration: "):
        parse_duration("x")
    with pytest.raises(ConfigError, match=r"^size: "):
        parse_size("x")


# --- sizes -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("value", "size"), [
    ("1024", 1024), ("1", 1), (" 7 ", 7),
    ("10b", 10), ("10B", 10),
    ("64k", 64 << 10), ("64K", 64 << 10), ("64kb", 64 << 10), ("64KB", 64 << 10), ("64kib", 64 << 10),
    ("64KiB", 64 << 10),
    ("256m", 256 << 20), ("256M", 256 << 20), ("256mb", 256 << 20), ("256MiB", 256 << 20),
    ("1g", 1 << 30), ("1G", 1 << 30), ("1gb", 1 << 30), ("1GiB", 1 << 30),
    ("1.5k", 1536), ("0.5m", 512 << 10), ("1.5g", 3 << 29), ("1 g", 1 << 30),
    ("1048576g", PIB), (str(PIB), PIB),
    (1, 1), (65536, 65536), (PIB, PIB), (2.0, 2), (1e6, 1_000_000),
])
def test_parse_size(value: str | int | float, size: int) -> None:
    result = parse_size(value)
    assert result == size
    assert type(result) is int


@pytest.mark.parametrize("value", [
    # unknown units or not a plain decimal
    "", "k", "1t", "1tb", "1p", "1kbit", "1 kilobyte", "1e3", "1e3k", "1_024", "0x400", ".5k", "+1k",
    "1k1", "1 k b", "nan", "inf",
    # not more than zero, including fractions that round down to nothing
    "0", "0k", "0.0g", "0.4", "0.999", "-1", "-1k", 0, -1, -1024, 0.0, -2.0,
    # over a pebibyte
    "1048577g", str(PIB + 1), PIB + 1, 10 ** 400, 1e300,
    # fractions of a byte as a number, and non-finite numbers
    1.5, 0.5, math.nan, math.inf, -math.inf,
    # wrong types, bool included
    True, False, None, [], {}, b"1k", object(),
])
def test_parse_size_refuses(value: object) -> None:
    with pytest.raises(ConfigError):
        parse_size(value)  # type: ignore[arg-type]


def test_parse_size_refuses_a_string_too_large_for_a_float() -> None:
    with pytest.raises(ConfigError):
        parse_size("9" * 400)


def test_fractional_bytes_in_a_string_are_truncated() -> None:
    # Documented behaviour, pinned so a change is deliberate: "1.5" bytes is one byte.
    assert parse_size("1.5") == 1
    assert parse_size("1.0001k") == 1024


# --- formatting ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("seconds", "text"), [
    (5.0, "5s"), (1.5, "1.5s"), (30.0, "30s"), (1.0, "1s"), (0.25, "250ms"), (0.5, "500ms"),
    (0.001, "1ms"), (3600.0, "3600s"), (float(WEEK), "604800s"),
])
def test_format_duration(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


@pytest.mark.parametrize(("size", "text"), [
    (256 << 20, "256m"), (1 << 30, "1g"), (3 << 30, "3g"), (1536 << 10, "1536k"), (1 << 10, "1k"),
    (1536, "1536 bytes"), (1, "1 bytes"), (1000, "1000 bytes"), (PIB, "1048576g"),
])
def test_format_size(size: int, text: str) -> None:
    assert format_size(size) == text


@given(st.integers(min_value=1, max_value=PIB >> 10))
def test_sizes_in_whole_kibibytes_round_trip(kib: int) -> None:
    size = kib << 10
    assert parse_size(format_size(size)) == size


@given(st.integers(min_value=1, max_value=999_999))
def test_whole_millisecond_durations_under_1000s_round_trip(ms: int) -> None:
    seconds = ms / 1000
    assert parse_duration(format_duration(seconds)) == pytest.approx(seconds, rel=1e-9)


@pytest.mark.parametrize("seconds", [1000.001, 30.0000001, 0.0004])
def test_format_duration_is_exact(seconds: float) -> None:
    assert parse_duration(format_duration(seconds)) == seconds


@given(st.one_of(st.text(max_size=30), st.integers(), st.floats(allow_nan=True, allow_infinity=True),
                 st.booleans(), st.none()))
def test_parse_duration_returns_seconds_or_raises_config_error(value: object) -> None:
    try:
        seconds = parse_duration(value)  # type: ignore[arg-type]
    except ConfigError:
        return
    assert 0 < seconds <= WEEK


@given(st.one_of(st.text(max_size=30), st.integers(), st.floats(allow_nan=True, allow_infinity=True),
                 st.booleans(), st.none()))
def test_parse_size_returns_bytes_or_raises_config_error(value: object) -> None:
    try:
        size = parse_size(value)  # type: ignore[arg-type]
    except ConfigError:
        return
    assert 0 < size <= PIB
    assert type(size) is int
