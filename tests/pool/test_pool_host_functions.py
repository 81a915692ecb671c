"""Host functions: call events, replies, limits, forged and garbage frames, sessions."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from .pool_driver import PoolProcess, new_id, same_id

pytestmark = pytest.mark.timeout(90)

# Writes one frame on the job's channel descriptor by hand: 4-byte big-endian length, then JSON.
_FORGE = """
import json, os, struct
def frame(payload):
    os.write(4, struct.pack('!I', len(payload)) + payload)
def answer():
    size = struct.unpack('!I', os.read(4, 4))[0]
    data = b''
    while len(data) < size:
        data += os.read(4, size - len(data))
    return json.loads(data)
"""


def _call_of(pool: PoolProcess, request_id: str, timeout: float = 10.0) -> dict[str, Any]:
    return pool.wait_for(lambda m: m.get("event") == "call" and m.get("id") == request_id, timeout)


def test_a_call_event_and_the_reply_value_as_a_python_object(pool: PoolProcess) -> None:
    request_id = new_id("t")
    pool.send({"id": request_id, "functions": ["search"],
               "code": "from pynox_host import search\nhits = search('pynox', limit=2)\n"
                       "print(type(hits).__name__, hits)"})
    call = _call_of(pool, request_id)
    assert set(call) == {"event", "id", "call_id", "function", "args", "kwargs"}
    assert (call["function"], call["args"], call["kwargs"]) == ("search", ["pynox"], {"limit": 2})
    assert isinstance(call["call_id"], int)
    pool.reply(call["call_id"], result={"hits": ["first hit", "second hit"], "n": 2, "more": None, "ok": True})
    result = pool.result(request_id)
    assert result["exit"] == 0, result
    assert result["stdout"] == "dict {'hits': ['first hit', 'second hit'], 'n': 2, 'more': None, 'ok': True}\n"


def test_the_call_event_echoes_the_request_id_as_given(pool: PoolProcess) -> None:
    for request_id in (7001, 7001.5):
        pool.send({"id": request_id, "functions": ["f"], "code": "from pynox_host import f\nprint(f())"})
        call = pool.wait_for(lambda m, i=request_id: m.get("event") == "call" and same_id(m.get("id"), i))
        pool.reply(call["call_id"], result=type(request_id).__name__)
        assert pool.result(request_id)["stdout"] == f"{type(request_id).__name__}\n"


@pytest.mark.parametrize("value", [None, 0, -1.5, "text", [1, [2]], {"nested": {"k": [True, False]}}, ""], ids=repr)
def test_json_values_round_trip(pool: PoolProcess, value: object) -> None:
    result = pool.run("from pynox_host import echo\nimport json\nprint(json.dumps(echo()))",
                      host={"echo": lambda: value})
    assert json.loads(result["stdout"]) == value


def test_an_error_reply_raises_host_error_with_that_text(pool: PoolProcess) -> None:
    def search(query: str) -> None:
        raise RuntimeError("backend unavailable")

    code = ("import pynox_host\nfrom pynox_host import search\ntry:\n    search('q')\n"
            "except pynox_host.HostError as exc:\n    print(type(exc).__name__, str(exc))")
    result = pool.run(code, host={"search": search})
    assert result["stdout"] == "HostError backend unavailable\n", result


def test_an_uncaught_host_error_fails_the_job(pool: PoolProcess) -> None:
    def search() -> None:
        raise RuntimeError("quota exceeded")

    result = pool.run("from pynox_host import search\nsearch()", host={"search": search}, name="task.py")
    assert result["error"]["type"] == "HostError" and result["error"]["message"] == "quota exceeded"
    assert result["error"]["line"] == 2


def test_only_declared_names_exist_in_pynox_host(pool: PoolProcess) -> None:
    result = pool.run("import pynox_host\nprint(sorted(n for n in dir(pynox_host) if not n.startswith('_')))\n"
                      "from pynox_host import undeclared", host={"search": lambda: 1, "fetch": lambda: 2})
    assert result["stdout"] == "['HostError', 'aio', 'fetch', 'search']\n"  # aio: the same, as coroutines
    assert result["error"]["type"] == "ImportError"
    assert pool.run("import pynox_host")["error"]["type"] == "ModuleNotFoundError"


def test_a_thousand_calls_succeed_and_the_1001st_fails(pool: PoolProcess) -> None:
    code = ("from pynox_host import tick, HostError\ndone = 0\ntry:\n    for _ in range(1001):\n"
            "        tick()\n        done += 1\nexcept HostError as exc:\n    print(done, exc)")
    result = pool.run(code, host={"tick": lambda: None}, wait=60)
    done, message = result["stdout"].split(" ", 1)
    assert done == "1000" and "1000" in message, result["stdout"]
    assert len(pool.calls(result["id"])) == 1000


def test_a_2mb_argument_fails_in_the_job_and_nothing_is_sent(pool: PoolProcess) -> None:
    code = ("from pynox_host import store, HostError\ntry:\n    store('x' * 2_000_000)\n"
            "except HostError as exc:\n    print('refused', exc)\nprint(store('y' * 900_000))")
    result = pool.run(code, host={"store": lambda data: len(data)})
    first, second = result["stdout"].splitlines()
    assert first.startswith("refused") and "1 MB" in first, first
    assert second == "900000"
    assert [len(call["args"][0]) for call in pool.calls(result["id"])] == [900_000]


def test_a_result_over_1mb_is_an_error_in_the_job(pool: PoolProcess) -> None:
    code = "from pynox_host import big, HostError\ntry:\n    big()\nexcept HostError as exc:\n    print('refused', exc)"
    result = pool.run(code, host={"big": lambda: "z" * 1_020_000})
    assert result["stdout"].startswith("refused") and "1 MB" in result["stdout"], result
    near = pool.run("from pynox_host import big\nprint(len(big()))", host={"big": lambda: "z" * 990_000})
    assert near["stdout"] == "990000\n"


def test_the_1mb_limit_on_arguments_is_exact(pool: PoolProcess) -> None:
    overhead = len(json.dumps({"function": "f", "args": [""], "kwargs": {}}, separators=(",", ":")))
    code = ("from pynox_host import f, HostError\n"
            f"print(f('a' * {1_000_000 - overhead}))\n"
            f"try:\n    f('a' * {1_000_001 - overhead})\nexcept HostError:\n    print('refused')")
    result = pool.run(code, host={"f": lambda data: len(data)})
    assert result["stdout"] == f"{1_000_000 - overhead}\nrefused\n", result
    assert len(pool.calls(result["id"])) == 1


def test_a_forged_call_over_1mb_never_reaches_the_client(pool: PoolProcess) -> None:
    code = _FORGE + ("frame(json.dumps({'function': 'f', 'args': ['a' * 1_003_000], 'kwargs': {}}).encode())\n"
                     "print(answer())")
    result = pool.run(code, host={"f": lambda data: len(data)})
    assert pool.calls(result["id"]) == []
    assert result["error"]["type"] == "PoolWorkerError" and "killed" in result["error"]["message"], result


@pytest.mark.parametrize("size, delivered", [(1_000_000, True), (1_000_001, False)])
def test_the_1mb_limit_on_results_is_exact(pool: PoolProcess, size: int, delivered: bool) -> None:
    code = "from pynox_host import f, HostError\ntry:\n    print(len(f()))\nexcept HostError as exc:\n    print(exc)"
    result = pool.run(code, host={"f": lambda: "z" * (size - 2)})  # the JSON string's two quotes count
    if delivered:
        assert result["stdout"] == f"{size - 2}\n"
    else:
        assert "1 MB" in result["stdout"], result["stdout"][:200]


def test_an_error_text_over_1mb_is_an_error_and_the_channel_stays_usable(pool: PoolProcess) -> None:
    request_id = new_id("big-error")
    start = len(pool.messages)
    pool.send({"id": request_id, "functions": ["f"],
               "code": "from pynox_host import f, HostError\ntry:\n    f()\nexcept HostError as exc:\n"
                       "    print(len(str(exc)) < 1000, '1 MB' in str(exc))\nprint(f())"})
    for reply in ({"error": "e" * 1_030_000}, {"result": "fine"}):
        call = pool.wait_for(lambda m: m.get("event") == "call" and m.get("id") == request_id, start=start)
        start = pool.index_of(call) + 1
        pool.reply(call["call_id"], **reply)
    result = pool.result(request_id)
    assert result["stdout"] == "True True\nfine\n", result


def test_non_json_arguments_fail_in_the_job(pool: PoolProcess) -> None:
    code = "from pynox_host import f, HostError\ntry:\n    f(object())\nexcept HostError as exc:\n    print('refused')"
    result = pool.run(code, host={"f": lambda x: x})
    assert result["stdout"] == "refused\n"
    assert pool.calls(result["id"]) == []


def test_a_reply_to_an_unknown_call_id_is_a_request_error(pool: PoolProcess) -> None:
    start = len(pool.messages)
    pool.reply(987654321, result=1)
    error = pool.wait_for(lambda m: m.get("id") is None and m.get("error") is not None, start=start)
    assert error["error"]["type"] == "RequestError" and "987654321" in error["error"]["message"]
    assert pool.run("print('still serving')")["stdout"] == "still serving\n"


@pytest.mark.parametrize("body", [{"call_id": "7", "result": 1}, {"result": 1}, {"call_id": 7, "extra": 1},
                                  {"call_id": 7, "error": 5}], ids=["string-id", "no-id", "extra", "error-type"])
def test_a_malformed_reply_is_a_request_error(pool: PoolProcess, body: dict[str, object]) -> None:
    start = len(pool.messages)
    pool.send({"reply": body})
    error = pool.wait_for(lambda m: m.get("id") is None and m.get("error") is not None, start=start)
    assert error["error"]["type"] == "RequestError"


def test_a_forged_call_to_an_undeclared_name_never_reaches_the_client(pool: PoolProcess) -> None:
    code = _FORGE + ("frame(json.dumps({'function': 'delete_everything', 'args': [], 'kwargs': {}}).encode())\n"
                     "print(answer())\nfrom pynox_host import search\nprint(search())")
    result = pool.run(code, host={"search": lambda: "declared"})
    first, second = result["stdout"].splitlines()
    assert "error" in first and "delete_everything" in first, first
    assert second == "declared"
    assert [call["function"] for call in pool.calls(result["id"])] == ["search"]
    assert not any(m.get("function") == "delete_everything" for m in pool.messages)


def test_a_job_without_functions_has_no_channel(pool: PoolProcess) -> None:
    code = _FORGE + "frame(json.dumps({'function': 'search', 'args': [], 'kwargs': {}}).encode())"
    result = pool.run(code)
    assert result["error"]["type"] == "OSError"  # EBADF: descriptor 4 is not open
    assert pool.calls(result["id"]) == []


@pytest.mark.parametrize("garbage", [
    "os.write(4, struct.pack('!I', 5) + b'hello')",
    "os.write(4, struct.pack('!I', 0xFFFFFFFF))",
    "frame(json.dumps({'function': 'search', 'args': {}, 'kwargs': []}).encode())",
    "frame(json.dumps({'function': 'search', 'args': [], 'kwargs': {}, 'extra': 1}).encode())",
], ids=["not-json", "oversized-header", "wrong-shape", "extra-field"])
def test_a_child_that_sends_garbage_is_killed_and_its_result_says_so(pool: PoolProcess, garbage: str) -> None:
    code = _FORGE + garbage + "\nimport time\ntime.sleep(30)\nprint('survived')"
    started = time.monotonic()
    result = pool.run(code, host={"search": lambda: None})
    assert time.monotonic() - started < 10
    assert "survived" not in result["stdout"]
    assert result["exit"] != 0
    assert result["error"]["type"] == "PoolWorkerError", result["error"]
    assert "killed" in result["error"]["message"]
    assert pool.calls(result["id"]) == []
    assert pool.run("print('next')")["stdout"] == "next\n"


def test_an_unanswered_call_is_dropped_at_timeout_and_a_late_reply_is_a_request_error(pool: PoolProcess) -> None:
    request_id = new_id("unanswered")
    started = time.monotonic()
    pool.send({"id": request_id, "functions": ["slow"], "timeout": "1s", "code": "from pynox_host import slow\nslow()"})
    call = _call_of(pool, request_id)
    result = pool.result(request_id)
    # Waiting for the host counts against the task's timeout.
    assert result["exit"] == 124 and result["error"]["type"] == "TimeoutError"
    assert time.monotonic() - started < 5
    start = len(pool.messages)
    pool.reply(call["call_id"], result="too late")
    late = pool.wait_for(lambda m: m.get("id") is None and m.get("error") is not None, start=start)
    assert late["error"]["type"] == "RequestError" and str(call["call_id"]) in late["error"]["message"]
    assert pool.run("print('ok')")["stdout"] == "ok\n"


def test_a_second_reply_to_the_same_call_is_a_request_error(pool: PoolProcess) -> None:
    request_id = new_id("twice")
    pool.send({"id": request_id, "functions": ["f"], "code": "from pynox_host import f\nprint(f())"})
    call = _call_of(pool, request_id)
    pool.reply(call["call_id"], result=1)
    assert pool.result(request_id)["stdout"] == "1\n"
    start = len(pool.messages)
    pool.reply(call["call_id"], result=2)
    late = pool.wait_for(lambda m: m.get("id") is None and m.get("error") is not None, start=start)
    assert late["error"]["type"] == "RequestError"


def test_call_ids_are_unique_across_concurrent_jobs(pool: PoolProcess) -> None:
    ids = [pool.submit(host={"who": lambda i=i: i}, code="from pynox_host import who\nprint(who(), who())")
           for i in range(6)]
    for i, request_id in enumerate(ids):
        assert pool.result(request_id)["stdout"] == f"{i} {i}\n"
    call_ids = [call["call_id"] for request_id in ids for call in pool.calls(request_id)]
    assert len(call_ids) == 12 and len(set(call_ids)) == 12


def test_host_calls_in_a_session(pool: PoolProcess) -> None:
    session = new_id("host-session")
    answers = iter(range(100))
    handlers = {"counter": lambda: next(answers)}
    first = pool.run("from pynox_host import counter\nfirst = counter()", session=session, host=handlers)
    assert first["exit"] == 0, first
    # Later steps declare nothing, and every step can call the functions the first one declared.
    step_id = new_id("step")
    pool.handle_calls(step_id, handlers)
    pool.send({"id": step_id, "session": session, "code": "print(first, counter(), counter())"})
    second = pool.result(step_id)
    assert second["stdout"] == "0 1 2\n", second
    assert [c["id"] for c in pool.calls(step_id)] == [step_id, step_id]
    pool.run(session=session, close=True)


def test_garbage_from_a_session_child_ends_the_session(pool: PoolProcess) -> None:
    session = new_id("garbage-session")
    assert pool.run("x = 1", session=session, host={"f": lambda: 1})["exit"] == 0
    killed = pool.run(_FORGE + "os.write(4, struct.pack('!I', 3) + b'abc')\nimport time\ntime.sleep(30)",
                      session=session)
    assert killed["error"]["type"] == "PoolWorkerError" and "killed" in killed["error"]["message"], killed
    assert killed["session_ended"] is True
    fresh = pool.run("print(x)", session=session)
    assert fresh["error"]["type"] == "NameError" and fresh["step"] == 1
    pool.run(session=session, close=True)


def test_host_call_counts_in_stats(pool: PoolProcess) -> None:
    before = pool.stats()["host_calls"]
    pool.run("from pynox_host import f\nf(); f(); f()", host={"f": lambda: None})
    assert pool.stats()["host_calls"] == before + 3


def test_a_call_still_waiting_when_its_step_ends_fails_in_the_job(pool: PoolProcess) -> None:
    """A session step starts a thread that calls the host and ends before the host answers (the test never
    replies). The pool drops the call at the step's end, so the job is told: at its next step the thread has
    a HostError saying why, rather than waiting for ever. A late reply is then a RequestError (control: the
    call did reach the client)."""
    session = new_id("background")
    first_id = pool.submit(session=session, functions=["slow"], code=(
        "import threading\nfrom pynox_host import slow, HostError\noutcome = []\n"
        "def call():\n    try:\n        outcome.append(repr(slow()))\n"
        "    except HostError as exc:\n        outcome.append(f'HostError: {exc}')\n"
        # The step gives the thread a moment to send its call before the step ends (it never returns: nobody
        # answers). Ending at once, the step could stop the process before the thread's call left it, and the
        # call event never came (seen once at load 15).
        "caller = threading.Thread(target=call)\ncaller.start()\ncaller.join(2.0)\n"))
    call = _call_of(pool, first_id)
    assert pool.result(first_id)["exit"] == 0
    second = pool.run("caller.join(10)\nprint(caller.is_alive(), outcome)", session=session)
    assert second["stdout"].startswith("False ['HostError: "), second
    assert "ended" in second["stdout"], second
    start = len(pool.messages)
    pool.reply(call["call_id"], result="too late")
    late = pool.wait_for(lambda m: m.get("id") is None and m.get("error") is not None, start=start)
    assert late["error"]["type"] == "RequestError", late
    pool.run(session=session, close=True)
