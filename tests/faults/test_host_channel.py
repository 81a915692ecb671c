"""A job that abuses its host-call channel harms only itself: it cannot outlive its deadline or stall the pool.

The job's end of the channel is descriptor 4; these jobs write frames on it
directly, as a compromised or buggy job could, instead of going through
``pynox_host``.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from tests.pool.pool_driver import PoolProcess, pool_process

pytestmark = pytest.mark.timeout(120)

_FRAMES = """
import json, os, socket, struct, time
channel = socket.socket(fileno=4)
def frame(function):
    payload = json.dumps({'function': function, 'args': [], 'kwargs': {}}).encode()
    return struct.pack('!I', len(payload)) + payload
"""


def _timed_run(pool: PoolProcess, code: str, wait: float, **fields: object) -> tuple[dict[str, object], float]:
    started = time.monotonic()
    result = pool.run(code, wait=wait, **fields)
    return result, time.monotonic() - started


def test_a_job_that_never_reads_the_answers_to_its_forged_calls_still_ends(tmp_path: Path) -> None:
    """Finding 5: the worker wrote each answer to an undeclared-name call itself, blocking up to 5s once the
    channel was full; the job's deadline, checked by that same worker, was never enforced (2s ran for minutes)."""
    code = _FRAMES + "burst = frame('undeclared') * 100\nwhile True:\n    channel.sendall(burst)"
    with pool_process("--workers=1", cwd=tmp_path) as pool:
        result, took = _timed_run(pool, code, 60, functions=["search"], timeout="2s")
        error = result["error"]
        assert isinstance(error, dict) and error["type"] in ("PoolWorkerError", "TimeoutError"), result
        assert took < 30, f"a job with a 2s timeout ran {took:.0f}s"
        assert pool.run("print('next')")["stdout"] == "next\n"


def test_a_job_that_never_reads_its_answers_cannot_stall_the_pool(tmp_path: Path) -> None:
    """Finding 5, the other side: intake wrote the client's replies itself, 5s per reply such a job ignored,
    and every other request waited meanwhile."""
    code = _FRAMES + "channel.sendall(frame('search') * 6)\ntime.sleep(60)"
    big = "x" * 900_000
    with pool_process("--workers=2", cwd=tmp_path) as pool:
        request_id = pool.submit(code=code, functions=["search"], timeout="60s")

        def answer_all() -> None:
            answered = 0
            end = time.monotonic() + 30
            while answered < 6 and time.monotonic() < end:
                for call in pool.calls(request_id)[answered:]:
                    pool.reply(call["call_id"], result=big)
                    answered += 1
                time.sleep(0.01)

        replier = threading.Thread(target=answer_all, daemon=True)
        started = time.monotonic()
        replier.start()
        pool.wait_for(lambda m: m.get("event") == "call" and m.get("id") == request_id)
        for _ in range(3):
            asked = time.monotonic()
            pool.stats()
            assert pool.run("print('served')")["stdout"] == "served\n"
            assert time.monotonic() - asked < 3, "the pool stalled behind a job that does not read"
        result = pool.result(request_id, timeout=60)
        assert time.monotonic() - started < 30, "the job that does not read lived until its deadline"
        assert result["error"]["type"] == "PoolWorkerError", result
        assert "does not read" in result["error"]["message"] or "did not read" in result["error"]["message"]
        replier.join(30)


def test_a_job_that_breaks_the_protocol_at_once_is_killed_at_once(tmp_path: Path) -> None:
    """Finding 6: garbage on the channel seen before the template's Started frame (a prepared child runs at
    once) meant a kill with no pidfd to send it to: the job lived until its deadline. Repeated, since it is a race.
    """
    code = "import os\nos.write(4, b'\\x00\\x00\\x00\\x05hello')\nimport time\ntime.sleep(60)"
    with pool_process("--workers=2", cwd=tmp_path) as pool:
        ids = [pool.submit(code=code, functions=["search"], timeout="60s") for _ in range(200)]
        started = time.monotonic()
        for request_id in ids:
            result = pool.result(request_id, timeout=60)
            assert result["error"]["type"] == "PoolWorkerError" and "killed" in result["error"]["message"], result
        assert time.monotonic() - started < 30, "a job that broke the protocol lived on"
        assert pool.run("print('next')")["stdout"] == "next\n"


@pytest.mark.parametrize("names", [("search", "secret"), ("secret", "search")])
def test_a_call_frame_with_a_duplicated_function_key_reaches_the_client_only_as_the_name_checked(
        tmp_path: Path, names: tuple[str, str]) -> None:
    """The review of typed frames: a forged frame naming a declared function and, under the same key again, an
    undeclared one is one call of the name the pool checked (the last), never the other. Control: the
    declared name alone, last, is called."""
    first, last = names
    frame = b'{"tag":1,"function":"' + first.encode() + b'","function":"' + last.encode() + b'","args":[],"kwargs":{}}'
    code = (_FRAMES + f"payload = {frame!r}\nchannel.sendall(struct.pack('!I', len(payload)) + payload)\n"
            "size = struct.unpack('!I', channel.recv(4, socket.MSG_WAITALL))[0]\n"
            "print(json.loads(channel.recv(size, socket.MSG_WAITALL)))\n")
    called: list[str] = []

    def search() -> str:
        called.append("search")
        return "found"

    def secret() -> str:
        called.append("secret")
        return "leaked"

    with pool_process("--workers=1", cwd=tmp_path) as pool:
        request_id = pool.submit({"search": search, "secret": secret}, code=code, functions=["search"])
        result = pool.result(request_id)
        assert [call["function"] for call in pool.calls(request_id)] == (["search"] if last == "search" else [])
    assert called == (["search"] if last == "search" else []), called
    expected = ("{'tag': 1, 'result': 'found'}" if last == "search" else
                "{'tag': 1, 'error': \"no host function named 'secret' was declared for this task\"}")
    assert result["stdout"] == expected + "\n", result
