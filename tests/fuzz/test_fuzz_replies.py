"""Fuzzed host-call replies and duplicate ids against one real pool.

* A reply with no call pending (unknown, huge, negative or mistyped ``call_id``, any body) is a
  ``RequestError`` with a null id, and nothing else happens.
* A fuzzed reply to a call that is pending: a well-formed one is delivered exactly (the job prints
  what it received), a malformed one is refused and the call stays pending until a good reply
  comes, which a second, late reply to the same call then cannot change.
* Duplicate ids: the pool does not refuse them (ids are the client's), but every line gets its own
  single answer and results are never mixed.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pynox.protocol import LineError, Reply, parse_line
from tests.pool.pool_driver import PoolProcess, same_id

from .feeder import FED, WAIT, Feeder, _new_id, check
from .oracle import NO_CALL_PENDING, expect

pytestmark = pytest.mark.timeout(600)

HUGE = 10**400
scalars = (st.none() | st.booleans() | st.integers(min_value=-HUGE, max_value=HUGE)
           | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=30))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                      | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=10)
call_ids = (st.integers(min_value=-HUGE, max_value=HUGE) | st.floats(allow_nan=False, allow_infinity=False)
            | st.text(max_size=10) | st.none() | st.booleans() | st.lists(st.integers(), max_size=2))
bodies = st.fixed_dictionaries({}, optional={"result": values, "error": values | st.text(max_size=60),
                                             "extra": values})
RECEIVE = ("import json\nfrom pynox_host import HostError, f\ntry:\n    value = f()\nexcept HostError as exc:\n"
           "    print('HostError:', exc)\nelse:\n    print(json.dumps(value, sort_keys=True))\n")


@pytest.fixture(scope="module")
def feeder(pool: PoolProcess) -> Feeder:
    return Feeder(pool, "replies")


@given(call_ids, bodies, st.dictionaries(st.sampled_from(["id", "code", "stats", "replies"]), values, max_size=1))
@settings(settings.get_profile("pynox-fuzz"))
def test_a_reply_without_a_pending_call(feeder: Feeder, call_id: Any, body: dict[str, Any],
                                        beside: dict[str, Any]) -> None:
    line = json.dumps({"reply": {"call_id": call_id, **body}, **beside}).encode()
    (answer,) = feeder.feed([line])
    if isinstance(call_id, int) and not isinstance(call_id, bool) and not beside and "extra" not in body \
            and expect(line).message is None:
        assert NO_CALL_PENDING in answer["error"]["message"]


def _as_received(body: dict[str, Any]) -> str:
    """What the job prints for a reply the pool delivered: the error wins, else the result (null if none)."""
    if body.get("error") is not None:
        return f"HostError: {body['error']}\n"
    return json.dumps(json.loads(json.dumps(body.get("result"))), sort_keys=True) + "\n"


@given(bodies, st.sampled_from(["call_id", "string_call_id", "float_call_id"]))
@settings(settings.get_profile("pynox-fuzz"))
def test_a_fuzzed_reply_to_a_pending_call(feeder: Feeder, body: dict[str, Any], shape: str) -> None:
    pool = feeder.pool
    start = len(pool.messages)
    job = _new_id("job")
    pool.send({"id": job, "functions": ["f"], "code": RECEIVE, "timeout": "60s"})
    call = pool.wait_for(lambda m: m.get("event") == "call" and m.get("id") == job, timeout=WAIT, start=start)
    call_id = {"call_id": call["call_id"], "string_call_id": str(call["call_id"]),
               "float_call_id": float(call["call_id"])}[shape]
    line = json.dumps({"reply": {"call_id": call_id, **body}}).encode()
    try:
        parsed = parse_line(line)
    except LineError:
        parsed = None
    delivered = isinstance(parsed, Reply) and parsed.reply.call_id == call["call_id"]
    sent = len(pool.messages)
    pool.send(line + b"\n")
    FED["replies"] += 1
    answers = feeder.barrier(sent, {job})  # everything but the job's own lines
    if delivered:
        assert answers == [], answers
    else:  # refused: the call is still pending, and a good reply gets through
        assert len(answers) == 1, answers
        if parsed is None:  # not a valid reply: refused by the parser, with its message
            check(answers[0], expect(line), line)
        else:  # a valid reply to another call id: nothing pending under it
            assert NO_CALL_PENDING in answers[0]["error"]["message"], answers
        pool.reply(call["call_id"], result="fallback")
    result = pool.wait_for(lambda m: m.get("id") == job and "exit" in m, timeout=WAIT, start=start)
    assert result["exit"] == 0, result
    assert result["stdout"] == (_as_received(body) if delivered else '"fallback"\n'), (body, result)
    # Now nothing is pending: one more reply to the same call is refused, and changes nothing.
    late = feeder.feed([json.dumps({"reply": {"call_id": call["call_id"], "result": 1}}).encode()])
    assert NO_CALL_PENDING in late[0]["error"]["message"]
    assert len(pool.responses(job)) == 1


@given(st.lists(st.sampled_from(["job", "refused", "stats", "crash"]), min_size=2, max_size=6),
       st.one_of(st.text(max_size=12), st.integers(), st.floats(allow_nan=False, allow_infinity=False)))
@settings(settings.get_profile("pynox-fuzz"))
def test_duplicate_ids_each_line_gets_its_own_answer(feeder: Feeder, kinds: list[str], request_id: Any) -> None:
    pool = feeder.pool
    start = len(pool.messages)
    lines: list[dict[str, Any]] = []
    for index, kind in enumerate(kinds):
        line: dict[str, Any] = {"id": request_id}
        if kind == "job":
            line["code"] = f"print({index})"
        elif kind == "refused":
            line.update(code="print(1)", bogus=index)
        elif kind == "stats":
            line["stats"] = True
        else:
            line["code"] = "import os\nos.abort()"
        lines.append(line)
    pool.send(b"".join(json.dumps(line).encode() + b"\n" for line in lines))
    FED["replies"] += len(lines)

    def mine() -> list[dict[str, Any]]:
        return [m for m in pool.messages[start:] if same_id(m.get("id"), request_id) and m.get("event") != "call"]

    pool.wait_for(lambda m: len(mine()) >= len(lines), timeout=WAIT, start=start)
    answers = feeder.barrier(start)
    assert len(mine()) == len(lines) == len(answers), answers
    got = sorted(a.get("stdout", "stats") if a.get("event") != "stats" else "stats" for a in mine())
    wanted = sorted({"job": f"{i}\n", "refused": "", "stats": "stats", "crash": ""}[k] for i, k in enumerate(kinds))
    assert got == wanted, (kinds, mine())
    errors = sorted(a["error"]["type"] for a in mine() if a.get("error"))
    assert errors == sorted({"refused": "RequestError", "crash": "SignalError"}[k] for k in kinds
                            if k in ("refused", "crash"))
