"""Fuzzed request lines against one real pool: every line gets its one clear answer and the pool keeps serving.

Inputs: random bytes (invalid UTF-8, NUL, control characters), random JSON of
every type, objects built from the real field names with values of any type,
huge numbers, deep nesting, valid requests mangled (truncated, bytes inserted
or dropped), invalid UTF-8 and NUL inside otherwise valid requests, and lines
of 1 MiB plus or minus a few bytes. The oracle (``oracle.py``) says what each
line must get; after each input a normal job must still run (``feeder.py``);
when the module's pool exits, its stderr must be empty.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from pynox.protocol import MAX_LINE, Request
from tests.pool.pool_driver import PoolProcess

from .feeder import Feeder
from .oracle import expect

pytestmark = pytest.mark.timeout(600)

HUGE = 10**400
FIELDS = [*Request.__struct_fields__, "reply", "timout", ""]

scalars = (st.none() | st.booleans() | st.integers() | st.integers(min_value=-HUGE, max_value=HUGE)
           | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=40)
           | st.sampled_from(["", "\x00", "5s", "1e400", "256m", "-1", "0", "ms", "\ud7ff", "print(1)"]))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                      | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)
objects = st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=10), values, max_size=6)
# Numbers as text, including what Python's json would never write.
raw_numbers = st.sampled_from(["1e400", "-1e400", "1E-400", "-0", "0.0e0", "9" * 500, "-" + "9" * 5000,
                               "1.7976931348623157e308", "4.9e-324", "00", "1.", ".5", "+1", "0x10", "NaN",
                               "Infinity", "-Infinity"])


def _line(value: Any) -> bytes:
    return json.dumps(value).encode()


def _no_request(lines: list[bytes]) -> list[bytes]:
    """Many lines in one write must be answered at once: no line may be a job that runs."""
    assume(all(expect(line).kind != "request" for line in lines))
    return lines


@pytest.fixture(scope="module")
def feeder(pool: PoolProcess) -> Feeder:
    return Feeder(pool, "lines")


@given(st.lists(st.binary(max_size=400).map(lambda raw: raw.replace(b"\n", b"")), min_size=1, max_size=6))
@settings(settings.get_profile("pynox-fuzz"))
def test_random_bytes(feeder: Feeder, lines: list[bytes]) -> None:
    feeder.feed(_no_request(lines))


@given(st.lists(values.map(_line), min_size=1, max_size=6))
@settings(settings.get_profile("pynox-fuzz"))
def test_random_json_values(feeder: Feeder, lines: list[bytes]) -> None:
    feeder.feed(_no_request(lines))


@given(objects)
@settings(settings.get_profile("pynox-fuzz"))
def test_objects_with_real_field_names_and_values_of_any_type(feeder: Feeder, obj: dict[str, Any]) -> None:
    feeder.feed([_line(obj)])


@given(st.sampled_from(FIELDS), raw_numbers, st.sampled_from(["print(1)", None]))
@settings(settings.get_profile("pynox-fuzz"))
def test_huge_and_odd_numbers_in_every_field(feeder: Feeder, name: str, number: str, code: str | None) -> None:
    head = f'{{"code": {json.dumps(code)}, ' if code is not None and name != "code" else "{"
    feeder.feed([f'{head}"{name}": {number}}}'.encode()])


@st.composite
def _nested(draw: st.DrawFn) -> bytes:
    depth = draw(st.integers(min_value=1, max_value=MAX_LINE // 8))
    opening, closing = draw(st.sampled_from([("[", "]"), ('{"a":', "}"), ('{"reply":', "}")]))
    core = opening * depth + "1" + closing * depth
    where = draw(st.sampled_from(["alone", "args", "env", "id", "reply"]))
    wrapped = {
        "alone": core,
        "args": f'{{"id": "deep", "code": "print(1)", "args": {core}}}',
        "env": f'{{"id": "deep", "code": "print(1)", "env": {{"A": {core}}}}}',
        "id": f'{{"id": {core}, "code": "print(1)"}}',
        "reply": f'{{"reply": {{"call_id": 1, "result": {core}}}}}',
    }[where]
    return wrapped.encode()


@given(_nested())
@settings(settings.get_profile("pynox-fuzz"))
def test_deep_nesting(feeder: Feeder, line: bytes) -> None:
    feeder.feed([line])


_VALID = [
    {"id": "v", "code": "print(1)"},
    {"id": 7, "code": "print(1)", "args": ["a", "b"], "env": {"K": "v"}, "timeout": "5s", "max_output": 4096},
    {"id": 1.5, "stats": True},
    {"reply": {"call_id": 3, "result": {"a": [1, 2]}}},
    {"id": "c", "session": "nb", "close": True},
]


@st.composite
def _mangled(draw: st.DrawFn) -> bytes:
    line = bytearray(_line(draw(st.sampled_from(_VALID))))
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        at = draw(st.integers(min_value=0, max_value=len(line)))
        action = draw(st.sampled_from(["cut", "insert", "drop", "replace"]))
        if action == "cut":
            del line[at:]
        elif action == "insert":
            line[at:at] = draw(st.binary(min_size=1, max_size=4) | st.sampled_from(
                [b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x00", b"\\u0000", b"\\ud800", b"\\", b'"', b"\r", b"\x0b"]))
        elif action == "drop" and line:
            del line[at:at + draw(st.integers(min_value=1, max_value=3))]
        elif line:
            line[min(at, len(line) - 1)] = draw(st.integers(min_value=0, max_value=255))
    return bytes(line).replace(b"\n", b"")


@given(_mangled())
@settings(settings.get_profile("pynox-fuzz"))
def test_valid_requests_mangled(feeder: Feeder, line: bytes) -> None:
    feeder.feed([line])


@given(st.sampled_from(["code", "name", "args", "env-key", "env-value", "session", "id", "profile", "functions"]),
       st.sampled_from(["\x00", "a\x00b", "\ud800", "\udfff", "\ufffe", "\u2028", "\x7f", "é" * 3]),
       st.booleans())
@settings(settings.get_profile("pynox-fuzz"))
def test_nul_and_unpaired_surrogates_in_every_string(feeder: Feeder, where: str, text: str, raw: bool) -> None:
    request: dict[str, Any] = {"id": "s", "code": "print(1)"}
    if where == "args":
        request["args"] = [text]
    elif where == "env-key":
        request["env"] = {text: "v"}
    elif where == "env-value":
        request["env"] = {"K": text}
    elif where == "functions":
        request["functions"] = [text]
    else:
        request[where] = text
    line = json.dumps(request, ensure_ascii=not raw).encode("utf-8", "surrogatepass")
    feeder.feed([line])


@given(st.integers(min_value=-3, max_value=3), st.sampled_from(["request", "garbage", "multibyte", "blank"]))
@settings(settings.get_profile("pynox-fuzz"), max_examples=28)
def test_lines_of_one_mib_plus_or_minus_a_few_bytes(feeder: Feeder, offset: int, content: str) -> None:
    size = MAX_LINE + offset
    if content == "garbage":
        line = b"x" * size
    elif content == "blank":
        line = b" " * size
    else:
        filler = "é" if content == "multibyte" else "a"
        head = '{"id": "mib", "code": "x = \''
        tail = "'\"}"
        room = size - len(head) - len(tail)
        body = filler * (room // len(filler.encode()))
        line = (head + body + tail).encode()
        line = line[:-len(tail)] + b" " * (size - len(line)) + line[-len(tail):]  # spaces inside the string
    assert len(line) == size
    answers = feeder.feed([line])
    if size > MAX_LINE:
        assert "exceeds the 1 MiB limit" in answers[0]["error"]["message"]
