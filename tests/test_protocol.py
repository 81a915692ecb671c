"""pynox.protocol.parse_line: one JSON Lines message in, a Request or Reply out, or a LineError.

Pure tests, no processes. A refusal must carry the request's id whenever the line
was a JSON object with a usable id, so the pool can answer the right client request.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pynox.protocol import (
    MAX_LINE,
    LineError,
    Reply,
    ReplyBody,
    Request,
    encode,
    parse_line,
    refusal,
    request_id_from_head,
    session_refusal,
)

pytestmark = pytest.mark.pure


def line(obj: Any) -> bytes:
    return json.dumps(obj).encode()


def refused(raw: bytes) -> LineError:
    with pytest.raises(LineError) as info:
        parse_line(raw)
    return info.value


# --- code and script ---------------------------------------------------------------------------------


def test_code_request() -> None:
    request = parse_line(line({"id": "task-1", "code": "print(1)", "name": "step.py", "allow_write": ["out"]}))
    assert request == Request(id="task-1", code="print(1)", name="step.py", allow_write=["out"])


def test_script_request_with_every_grant_field() -> None:
    fields = {"id": "task-2", "script": "app.py", "args": ["one"], "allow_read": ["data"], "package_dirs": [],
              "env": {"KEY": "value"}, "allow_network": False, "timeout": "5s", "memory": "512m",
              "max_output": 65536, "max_file_size": "1m", "profile": "analysis", "functions": ["search"],
              "session": None}
    request = parse_line(line(fields))
    assert isinstance(request, Request)
    assert msgspec.structs.asdict(request) == {**{f: None for f in Request.__struct_fields__}, **fields}


@pytest.mark.parametrize("fields", [{}, {"session": "s"}, {"code": "1", "script": "a.py"}, {"code": None},
                                    {"script": None, "code": None}, {"name": "a.py"}, {"args": []}])
def test_exactly_one_of_code_and_script(fields: dict[str, Any]) -> None:
    error = refused(line({"id": "x", **fields}))
    assert error.request_id == "x"
    assert "exactly one of code and script" in str(error)


def test_empty_code_is_still_code() -> None:
    assert parse_line(line({"code": ""})) == Request(code="")


@pytest.mark.parametrize("name", ["", "a\0b"])
def test_a_name_must_be_a_non_empty_file_name_without_nul(name: str) -> None:
    error = refused(line({"id": 4, "code": "1", "name": name}))
    assert error.request_id == 4 and "name" in str(error)


def test_nul_inside_code_is_data_not_a_protocol_error() -> None:
    # Escaped NUL is a valid JSON string; compiling it is the job's business.
    assert parse_line(line({"code": "a\0b"})) == Request(code="a\0b")


# --- unknown fields and wrong types ------------------------------------------------------------------


@pytest.mark.parametrize("request_id", ["task-9", 9, 9.5, -3, 0, "", 2 ** 70])
def test_unknown_field_is_refused_with_the_id_recovered(request_id: str | int | float) -> None:
    error = refused(line({"id": request_id, "code": "1", "preload": ["pandas"]}))
    assert error.request_id == request_id
    assert type(error.request_id) is type(request_id)
    assert "preload" in str(error)


@pytest.mark.parametrize(("field", "value"), [
    ("code", 1), ("code", ["print(1)"]), ("script", True), ("name", 3), ("args", "one"), ("args", [1]),
    ("allow_read", "data"), ("allow_read", [None]), ("allow_write", {"a": 1}), ("allow_network", "false"),
    ("allow_network", 0), ("env", {"A": 1}), ("env", ["A=1"]), ("timeout", [5]), ("timeout", True),
    ("memory", {"g": 1}), ("max_output", False), ("max_file_size", [1]),
    ("package_dirs", "x"), ("profile", 1), ("functions", "search"), ("session", 7), ("close", "yes"),
    ("stats", 1),
])
def test_wrong_types_are_refused_naming_the_field(field: str, value: Any) -> None:
    error = refused(line({"id": "t", "code": "1", field: value}))
    assert error.request_id == "t"
    assert field in str(error), str(error)


@pytest.mark.parametrize("bad_id", [True, False, [1], {"a": 1}])
def test_an_unusable_id_is_refused_and_not_echoed(bad_id: Any) -> None:
    error = refused(line({"id": bad_id, "code": "1"}))
    assert error.request_id is None
    assert "id" in str(error)


@pytest.mark.parametrize("request_id", ["task-1", "", "ü-é", 7, 0, -1, 2 ** 63, 2 ** 70, 1.5, -0.25, 1e300])
def test_ids_are_echoed_as_given(request_id: str | int | float) -> None:
    request = parse_line(line({"id": request_id, "code": "1"}))
    assert isinstance(request, Request)
    assert request.id == request_id and type(request.id) is type(request_id)
    # and survive the trip back out in a result
    echoed = json.loads(encode(refusal(request.id, "no")))["id"]
    assert echoed == request_id and type(echoed) is type(request_id)


def test_a_missing_or_null_id_is_none() -> None:
    assert parse_line(line({"code": "1"})).id is None  # type: ignore[union-attr]
    assert parse_line(line({"id": None, "code": "1"})).id is None  # type: ignore[union-attr]


# --- not a JSON object -------------------------------------------------------------------------------


@pytest.mark.parametrize("raw", [b"[]", b'[{"id": 1, "code": "1"}]', b"1", b'"code"', b"null", b"true", b"1.5"])
def test_non_object_json_is_refused(raw: bytes) -> None:
    error = refused(raw)
    assert error.request_id is None
    assert "JSON object" in str(error)


@pytest.mark.parametrize("raw", [b"", b" ", b"{", b'{"id": 1, "code": "1"', b"{'id': 1}", b'{"id": 1,}',
                                 b"NaN", b'{"id": NaN, "code": "1"}', b'{"code": "1"} {"code": "2"}',
                                 b'{"code": "1"}\n{"code": "2"}', b'{"id": 1e400, "code": "1"}'])
def test_invalid_json_is_refused(raw: bytes) -> None:
    error = refused(raw)
    assert error.request_id is None
    assert "not valid JSON" in str(error)


@pytest.mark.parametrize("raw", [b'{"code": "\xff"}', b'{"code": "\xc3"}', b'{"code": "\xed\xa0\x80"}',
                                 b'\xff{"code": "1"}', b'{"code": "1"}\xfe', b'{"c\xffde": "1"}'])
def test_invalid_utf8_is_refused(raw: bytes) -> None:
    error = refused(raw)
    assert error.request_id is None
    assert "not valid JSON" in str(error)


@pytest.mark.parametrize("raw", [b'{"code": "1"}\x00', b'\x00{"code": "1"}', b'{"code": "a\x00b"}',
                                 b'{"id": 1,\x00"code": "1"}'])
def test_raw_nul_bytes_are_refused(raw: bytes) -> None:
    refused(raw)


@pytest.mark.parametrize("depth", [1, 10, 100])
def test_shallow_unclosed_nesting_is_invalid_json(depth: int) -> None:
    assert refused(b"[" * depth).request_id is None


_DEEP = [
    pytest.param(b"[" * 1000, id="1000 open brackets"),
    pytest.param(b"[" * MAX_LINE, id="a full line of open brackets"),
    pytest.param(b'{"a":' * 5000, id="5000 open objects"),
    pytest.param(b'{"id":"t","code":"1","env":' + b"[" * 5000 + b"]" * 5000 + b"}", id="deep valid field"),
    pytest.param(b'{"reply":{"call_id":1,"result":' + b"[" * 5000 + b"]" * 5000 + b"}}", id="deep reply"),
]


@pytest.mark.parametrize("raw", _DEEP)
def test_deep_nesting_is_a_line_error(raw: bytes) -> None:
    refused(raw)


def test_surrounding_whitespace_is_accepted() -> None:
    assert parse_line(b' \t{"code": "1"}\r ') == Request(code="1")


# --- line length -------------------------------------------------------------------------------------


def _line_of(length: int) -> bytes:
    head, tail = b'{"id":1,"code":"', b'"}'
    raw = head + b"x" * (length - len(head) - len(tail)) + tail
    assert len(raw) == length
    return raw


def test_a_line_of_exactly_max_line_bytes_is_parsed() -> None:
    request = parse_line(_line_of(MAX_LINE))
    assert isinstance(request, Request)
    assert request.id == 1 and request.code is not None and len(request.code) == MAX_LINE - 18


def test_a_line_of_max_line_plus_one_is_discarded_unread() -> None:
    error = refused(_line_of(MAX_LINE + 1))
    assert error.request_id is None  # discarded: not even the id is read
    assert "discarded" in str(error) and str(MAX_LINE) in str(error)


def test_an_over_long_line_is_discarded_even_if_it_is_not_json() -> None:
    assert "discarded" in str(refused(b"\xff" * (MAX_LINE + 1)))


def test_max_line_is_one_mebibyte() -> None:
    assert MAX_LINE == 1 << 20


# --- stats and close ---------------------------------------------------------------------------------


def test_stats_request() -> None:
    assert parse_line(line({"id": "s1", "stats": True})) == Request(id="s1", stats=True)
    assert parse_line(line({"stats": True})) == Request(stats=True)


@pytest.mark.parametrize("extra", [{"code": "1"}, {"script": "a.py"}, {"session": "s"}, {"close": True},
                                   {"close": False}, {"allow_read": []}, {"timeout": "1s"}, {"name": "x"}])
def test_a_stats_request_with_extra_fields_is_refused(extra: dict[str, Any]) -> None:
    error = refused(line({"id": "s1", "stats": True, **extra}))
    assert error.request_id == "s1"
    assert "stats" in str(error) and next(iter(extra)) in str(error)


def test_stats_false_is_an_ordinary_request() -> None:
    assert parse_line(line({"code": "1", "stats": False})) == Request(code="1", stats=False)
    assert "exactly one of code and script" in str(refused(line({"stats": False})))


def test_close_request() -> None:
    assert parse_line(line({"id": 3, "session": "notebook-7", "close": True})) == Request(
        id=3, session="notebook-7", close=True)


def test_close_without_a_session_is_refused() -> None:
    error = refused(line({"id": 3, "close": True}))
    assert error.request_id == 3
    assert "session" in str(error)


# --- replies to host-function calls ------------------------------------------------------------------


@pytest.mark.parametrize(("body", "expected"), [
    ({"call_id": 7, "result": ["first hit", "second hit"]}, ReplyBody(call_id=7, result=["first hit", "second hit"])),
    ({"call_id": 7, "error": "backend unavailable"}, ReplyBody(call_id=7, error="backend unavailable")),
    ({"call_id": 0, "result": None}, ReplyBody(call_id=0, result=None)),
    ({"call_id": 1, "result": {"nested": [1, 2.5, True, None, "s"]}},
     ReplyBody(call_id=1, result={"nested": [1, 2.5, True, None, "s"]})),
])
def test_reply_lines_parse_to_reply(body: dict[str, Any], expected: ReplyBody) -> None:
    reply = parse_line(line({"reply": body}))
    assert isinstance(reply, Reply)
    assert reply == Reply(reply=expected)


@pytest.mark.parametrize("raw", [
    {"reply": {"result": 1}},                       # no call_id
    {"reply": {"call_id": "7", "result": 1}},       # call_id not an int
    {"reply": {"call_id": True, "result": 1}},
    {"reply": {"call_id": 1.5, "result": 1}},
    {"reply": {"call_id": 7, "error": 5}},          # error not a string
    {"reply": {"call_id": 7, "value": 1}},          # unknown field in the body
    {"reply": 7},
    {"reply": None},
    {"reply": [7]},
])
def test_bad_replies_are_refused(raw: dict[str, Any]) -> None:
    error = refused(line(raw))
    assert error.request_id is None
    assert "reply" in str(error)


def test_a_reply_with_request_fields_is_refused_with_the_id() -> None:
    error = refused(line({"id": 5, "reply": {"call_id": 1, "result": 2}}))
    assert error.request_id == 5
    assert "id" in str(error)
    assert "code" in str(refused(line({"reply": {"call_id": 1}, "code": "1"})))


# --- property: nothing but a message or a LineError ----------------------------------------------------

_FIELDS = [*Request.__struct_fields__, "reply", "call_id", "result", "error", "preload"]
_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=6,
)
_objects = st.dictionaries(st.sampled_from(_FIELDS) | st.text(max_size=8), _json, max_size=8)


def _must_parse_or_refuse(raw: bytes) -> None:
    try:
        message = parse_line(raw)
    except LineError as exc:
        assert isinstance(str(exc), str)
        assert exc.request_id is None or isinstance(exc.request_id, str | int | float)
        return
    assert isinstance(message, Request | Reply)


@settings(max_examples=500, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=300))
def test_arbitrary_bytes_parse_or_raise_line_error(raw: bytes) -> None:
    _must_parse_or_refuse(raw)


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(_objects)
def test_arbitrary_objects_parse_or_raise_line_error(obj: dict[str, Any]) -> None:
    _must_parse_or_refuse(json.dumps(obj).encode())


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow])
@given(_objects, st.integers(min_value=0, max_value=40), st.binary(min_size=1, max_size=3))
def test_corrupted_objects_parse_or_raise_line_error(obj: dict[str, Any], at: int, junk: bytes) -> None:
    raw = json.dumps(obj).encode()
    at = min(at, len(raw))
    _must_parse_or_refuse(raw[:at] + junk + raw[at:])


@settings(max_examples=100)
@given(st.fixed_dictionaries({"reply": st.fixed_dictionaries({"call_id": st.integers()},
                                                             optional={"result": _json, "error": _json})}))
def test_arbitrary_replies_parse_or_raise_line_error(obj: dict[str, Any]) -> None:
    _must_parse_or_refuse(json.dumps(obj).encode())


def test_a_reply_with_both_result_and_error_is_refused() -> None:
    with pytest.raises(LineError, match="not both"):
        parse_line(b'{"reply": {"call_id": 3, "result": 1, "error": "no"}}')
    assert parse_line(b'{"reply": {"call_id": 3, "result": null}}') == Reply(reply=ReplyBody(call_id=3, result=None))


@pytest.mark.parametrize(("head", "found"), [
    (b'{"id": "task-1", "code": "', "task-1"),
    (b'{"id":"a-7","code":"x', "a-7"),
    (b'  {"id": 42, "code": "', 42),
    (b'{"id": "q\\"uote", "code"', 'q"uote'),
    (encode(Request(id="p-3", code="x" * 300))[:256], "p-3"),  # as the Python client writes it
    (b'{"code": "x", "id": "late"}', None),  # not first: not looked for
    (b'{"id": "cut-off', None),
    (b'{"id": true, "code": "', None),
    (b'{"id": 1.5, "code": "', None),
    (b"garbage", None),
])
def test_the_id_of_an_over_long_line_is_read_from_its_head_only_when_it_comes_first(head: bytes,
                                                                                     found: object) -> None:
    assert request_id_from_head(head) == found


def test_open_needs_a_session() -> None:
    with pytest.raises(LineError, match="open needs the session"):
        parse_line(b'{"id": 1, "code": "x", "open": true}')
    assert parse_line(b'{"id": 1, "session": "s", "code": "x", "open": true}') == Request(
        id=1, session="s", code="x", open=True)


@pytest.mark.parametrize("ended", [True, False])
def test_a_session_refusal_is_a_refusal_that_names_its_session(ended: bool) -> None:
    """Every field of a plain refusal, and the session's: which one, and whether the pool holds it."""
    plain = json.loads(encode(refusal("r", "no")))
    line = json.loads(encode(session_refusal("r", "no", session="notes", session_ended=ended)))
    assert {name: line[name] for name in plain} == plain and plain["refused"] is True
    assert (line["session"], line["session_ended"], line["step"]) == ("notes", ended, None)
