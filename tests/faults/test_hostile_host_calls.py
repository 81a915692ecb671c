"""The host channel under attack: a job can neither hang, starve nor flood the application.

Frames are forged the way a hostile job would: written straight onto its channel descriptor (4),
past everything ``pynox_host`` checks. After each attack an innocent job on the same single worker
still gets its answer within a second, and the host side (the calls it saw, the bytes it received)
shows the harm did not happen.
"""

from __future__ import annotations

import functools
import re
import stat
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import pynox
import pynox.client.pool
from tests.pool.pool_driver import PoolProcess, pool_process

pytestmark = pytest.mark.timeout(120)

_FORGE = """
import os, struct
def forge(payload):
    os.write(4, struct.pack('!I', len(payload)) + payload)
"""


def _innocent_job_is_answered_at_once(pool: PoolProcess) -> None:
    start = time.monotonic()
    assert pool.run("print('innocent')", wait=5)["stdout"] == "innocent\n"
    assert time.monotonic() - start < 1.0, "the pool was slow to serve an innocent job after the attack"


# -- a frame the pool cannot read condemns its job, never the worker -------------------------------------

_DEEP = _FORGE + "forge(b'{\"function\":\"f\",\"args\":' + b'[' * 3000 + b']' * 3000 + b',\"kwargs\":{}}')\n" \
                 "import time\ntime.sleep(20)"


def test_a_frame_nested_too_deeply_kills_its_job_and_the_worker_goes_on(tmp_path: Path) -> None:
    with pool_process("--workers=1", cwd=tmp_path) as pool:
        result = pool.run(_DEEP, functions=["f"], wait=10)
        assert result["error"]["type"] == "PoolWorkerError" and "nested too deeply" in result["error"]["message"]
        assert pool.calls(result["id"]) == []  # the client never saw it
        _innocent_job_is_answered_at_once(pool)


def test_the_same_frame_from_a_session_step_ends_that_session_only(tmp_path: Path) -> None:
    with pool_process("--workers=1", "--max-sessions=1", cwd=tmp_path) as pool:
        assert pool.run("x = 1", session="hostile", functions=["f"])["exit"] == 0
        result = pool.run(_DEEP, session="hostile", wait=10)
        assert result["error"]["type"] == "PoolWorkerError" and result["session_ended"] is True, result
        # Its max_sessions slot is free again, and other work goes on.
        assert pool.run("print('other')", session="another")["stdout"] == "other\n"
        _innocent_job_is_answered_at_once(pool)


def test_pynox_host_refuses_deep_values_before_any_call() -> None:
    seen: list[object] = []
    code = ("import sys\nsys.setrecursionlimit(50000)\nfrom pynox_host import f, HostError\nx = []\n"
            "for _ in range(3000):\n    x = [x]\ntry:\n    f(x)\nexcept HostError as e:\n    print(e)")
    with pynox.Pool(workers=1) as pool:
        result = pool.run(code, functions={"f": seen.append})
    assert "nested more than 64 levels" in result.stdout, result.text
    assert seen == []


# -- the pool bounds what one job asks of the host -------------------------------------------------------


def test_forged_calls_beyond_the_in_flight_cap_never_reach_the_host() -> None:
    started: list[float] = []
    lock = threading.Lock()

    def slow(value: int) -> int:
        with lock:
            started.append(time.monotonic())
        time.sleep(0.5)
        return value

    flood = _FORGE + ("import json\nfor i in range(200):\n"
                      "    forge(json.dumps({'function': 'slow', 'args': [i], 'kwargs': {}}).encode())\n"
                      "import time\ntime.sleep(0.3)")
    with pynox.Pool(workers=2) as pool:
        attacker = threading.Thread(target=pool.run, args=(flood,), kwargs={"functions": {"slow": slow}})
        attacker.start()
        time.sleep(0.2)
        # Another job's call is answered while the flood is capped.
        begin = time.monotonic()
        other = pool.run("from pynox_host import echo\nprint(echo('mine'))", functions={"echo": lambda v: v})
        assert other.stdout == "mine\n" and time.monotonic() - begin < 2.0
        attacker.join(20)
        ended = time.monotonic()
        time.sleep(1.0)  # room for a call that would start late
    assert 1 <= len(started) <= 8, f"{len(started)} forged calls ran in the host"
    assert all(when < ended for when in started), "a host call started after its job had ended"


def test_forged_large_frames_are_capped_in_bytes(tmp_path: Path) -> None:
    big = "[" + ",".join(["{}"] * 330_000) + "]"  # about 1 MB of JSON, about 24 MB once decoded
    flood = _FORGE + (f"payload = ('{{\"function\":\"f\",\"args\":[' + {big!r} + '],\"kwargs\":{{}}}}').encode()\n"
                      "for _ in range(40):\n    forge(payload)\nimport time\ntime.sleep(0.5)")
    with pool_process("--workers=1", cwd=tmp_path) as pool:
        # Nobody answers its calls, so its writes block until its deadline: 10 s, with room for a loaded machine
        # to kill and report it (at the default 30 s deadline the wait of 30 s lost that race under load).
        request_id = pool.submit(code=flood, functions=["f"], timeout="10s")
        pool.result(request_id, timeout=60)
        events = pool.calls(request_id)
        _innocent_job_is_answered_at_once(pool)
    assert 1 <= len(events) <= 2, f"the host received {len(events)} large calls of one job"


# -- results and errors that would not fit ---------------------------------------------------------------


def test_a_host_result_over_the_limit_is_a_host_error_at_once() -> None:
    with pynox.Pool(workers=1) as pool:
        start = time.monotonic()
        result = pool.run("from pynox_host import big, HostError\ntry:\n    big()\nexcept HostError as e:\n"
                          "    print(e)", functions={"big": lambda: "x" * 1_100_000}, timeout="30s")
    assert "more than the 1 MB limit" in result.stdout, result.text
    assert time.monotonic() - start < 10


def test_a_reply_line_over_1_mib_fails_its_call_at_once(tmp_path: Path) -> None:
    with pool_process("--workers=1", cwd=tmp_path) as pool:
        request_id = pool.submit(code="from pynox_host import f, HostError\ntry:\n    f()\nexcept HostError as e:\n"
                                      "    print(e)", functions=["f"], timeout="30s")
        call = pool.wait_for(lambda m: m.get("event") == "call" and m.get("id") == request_id)
        start = time.monotonic()
        pool.reply(call["call_id"], result="x" * (1 << 21))
        result = pool.result(request_id, timeout=10)
        assert time.monotonic() - start < 5
        assert "exceeds the pool's 1 MiB line limit" in result["stdout"], result
        _innocent_job_is_answered_at_once(pool)


# -- only plain JSON crosses, both ways --------------------------------------------------------------------

_NOT_JSON = ["float('nan')", "float('inf')", "1e308 * 10", "b'x'", "{1, 2}", "{1: 2}", "10 ** 4400", "'\\ud800'",
             "(lambda: 0)"]


def test_values_that_are_not_plain_json_never_reach_the_host() -> None:
    seen: list[object] = []
    code = ("from pynox_host import f, HostError\n"
            f"for value in [{', '.join(_NOT_JSON)}]:\n"
            "    try:\n        f(value)\n        print('sent')\n    except HostError as e:\n        print('refused')")
    with pynox.Pool(workers=1) as pool:
        result = pool.run(code, functions={"f": seen.append})
    assert result.stdout == "refused\n" * len(_NOT_JSON), result.text
    assert seen == []


@pytest.mark.parametrize("value", [b"bytes", {1, 2}, float("nan"), {1: "int key"}, 10**30])
def test_a_host_result_that_is_not_plain_json_is_a_host_error(value: object) -> None:
    with pynox.Pool(workers=1) as pool:
        result = pool.run("from pynox_host import f, HostError\ntry:\n    f()\nexcept HostError as e:\n    print(e)",
                          functions={"f": lambda: value})
    assert "returned a value that is not plain JSON" in result.stdout, result.text


# -- arguments are checked against the signature --------------------------------------------------------


def test_arguments_are_checked_against_the_annotations_before_the_call() -> None:
    seen: list[tuple[Any, ...]] = []

    def search(query: str, limit: int = 5) -> list[str]:
        seen.append((query, limit))
        return [query] * limit

    calls = ["{'a': 1}", "['x']", "'x', limit='9'", "'x', limit=True", "'x', limit=2.5", "'x', 1, 2",
             "'x', size=3"]
    code = "from pynox_host import search, HostError\n" + "".join(
        f"try:\n    search({args})\n    print('called')\nexcept HostError as e:\n    print(e)\n" for args in calls)
    code += "print(search('ok', limit=2))"
    with pynox.Pool(workers=1) as pool:
        result = pool.run(code, functions={"search": search})
    lines = result.stdout.splitlines()
    assert len(lines) == len(calls) + 1, result.text
    for line in lines[:2]:
        assert line.startswith("search(): argument 'query'"), line
    for line in lines[2:5]:
        assert line.startswith("search(): argument 'limit'"), line
    assert "too many positional arguments" in lines[5] and "unexpected keyword argument 'size'" in lines[6]
    assert lines[-1] == "['ok', 'ok']"
    assert seen == [("ok", 2)]  # only the valid call reached the function


def test_keywords_bound_with_partial_cannot_be_overridden_or_seen() -> None:
    seen: list[str] = []

    def orders(query: str, tenant: str) -> list[str]:
        """Orders matching the query."""
        seen.append(tenant)
        return [f"{tenant}:{query}"]

    bound = functools.partial(orders, tenant="acme")
    with pynox.Pool(workers=1) as pool:
        result = pool.run("from pynox_host import orders, HostError\nprint(orders('x'))\ntry:\n"
                          "    orders('x', tenant='other-customer')\nexcept HostError as e:\n    print(e)",
                          functions={"orders": bound})
        doc = pool.tool(functions={"orders": bound}).__doc__ or ""
    assert result.stdout.splitlines() == ["['acme:x']", "orders(): tenant is fixed by the host and cannot be passed"]
    assert seen == ["acme"]
    assert "- orders(query: str) -> list[str]" in doc and "tenant" not in doc


def test_keywords_bound_with_partial_stay_fixed_behind_a_decorator() -> None:
    seen: list[str] = []

    def fetch(url: str, *, token: str) -> str:
        seen.append(token)
        return url

    def logged(function: Any) -> Any:
        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return function(*args, **kwargs)

        return wrapper

    wrapped = logged(functools.partial(fetch, token="HOST-SECRET-TOKEN"))
    with pynox.Pool(workers=1) as pool:
        result = pool.run("from pynox_host import fetch, HostError\nprint(fetch('u'))\ntry:\n"
                          "    fetch('u', token='attacker')\nexcept HostError as e:\n    print(e)",
                          functions={"fetch": wrapped})
        doc = pool.tool(functions={"fetch": wrapped}).__doc__ or ""
    assert result.stdout.splitlines() == ["u", "fetch(): token is fixed by the host and cannot be passed"]
    assert seen == ["HOST-SECRET-TOKEN"] and "HOST-SECRET-TOKEN" not in doc
    assert not re.search(r"\btoken\b", doc)  # as a word: the importable list may name asttokens


# -- the client never waits for ever ----------------------------------------------------------------------

_SILENT_POOL = """
import json, sys, time
print(json.dumps({"event": "ready", "workers": 1, "runtime": "pynox", "preloaded_modules": []}), flush=True)
for line in sys.stdin:
    pass  # accepts every request and answers none
"""


def test_a_run_gives_up_when_the_pool_never_answers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "silent_pool.py").write_text(_SILENT_POOL)
    fake = tmp_path / "silent-pynox"
    fake.write_text(f"#!/bin/sh\nexec {sys.executable} {tmp_path / 'silent_pool.py'} \"$@\"\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setattr(pynox.client.pool, "_ANSWER_MARGIN", 1.0)  # three timeouts of 0.5 s, plus one second
    with pynox.Pool(workers=1, binary=fake) as pool:
        start = time.monotonic()
        first = pool._process
        # A pool that wrote nothing since the run was sent is hung: stopped, and replaced at the next call.
        with pytest.raises(pynox.PoolError, match="answered nothing"):
            pool.run("print(1)", timeout="0.5s")
        assert time.monotonic() - start < 5
        assert first is not None and first.dead
        session = pool.session(timeout="0.2s")
        with pytest.raises(pynox.PoolError, match="answered nothing"):
            session.run("x = 1")
        assert pool._process is not first
        pool.close(timeout=1)

