"""The client misbehaves: it closes stdin mid-stream, dies, or stops reading the pool's stdout for seconds.

* EOF drains: every accepted request is answered, then the pool exits 0, without waiting out the
  timeout of a job whose host call can no longer be answered.
* Death: the pool and every process below it are gone within a second, busy or blocked.
* A stalled reader: the pool blocks (intake, workers, writers) with bounded memory, and once the
  client reads again every request gets its one answer.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.harness.clients import owning_client, wait_for_jobs
from tests.pool import pool_driver as driver

pytestmark = pytest.mark.timeout(120)

HOST_WAIT = "60s"  # the timeout of jobs whose host call is never answered: far beyond any deadline below


@pytest.mark.parametrize("last", ["complete", "cut"])
def test_stdin_closed_mid_stream_drains_every_accepted_request_and_exits_0(tmp_path: Path, last: str) -> None:
    with driver.PoolProcess("--workers=2", cwd=tmp_path) as pool:
        jobs = [pool.submit(code=f"import time\ntime.sleep(0.3)\nprint({i})") for i in range(6)]
        assert pool.run("x = 5", session="nb")["exit"] == 0
        step = pool.submit(session="nb", code="import time\ntime.sleep(0.3)\nprint(x)")
        waiting = pool.submit(functions=["lookup"], timeout=HOST_WAIT,
                              code="from pynox_host import lookup\nprint(lookup('k'))")
        pool.wait_for(lambda m: m.get("event") == "call" and m.get("id") == waiting)
        # The stream ends in the middle of it: a last line without its newline, or cut inside the JSON.
        pool.send(b'{"id": "tail", "code": "print(\'tail\')"}' if last == "complete" else b'{"id": "tail", "co')
        started = time.monotonic()
        pool.close_stdin()
        assert pool.wait_exit() == 0
        # Finding 3: a job waiting for a host reply after EOF waited out its whole timeout (60s here).
        assert time.monotonic() - started < 15
        for index, request_id in enumerate(jobs):
            assert [r["stdout"] for r in pool.responses(request_id)] == [f"{index}\n"]
        assert [r["stdout"] for r in pool.responses(step)] == ["5\n"]
        (host_result,) = pool.responses(waiting)
        assert host_result["error"]["type"] == "HostError", host_result
        assert "input has ended" in host_result["error"]["message"]
        if last == "complete":
            assert [r["stdout"] for r in pool.responses("tail")] == ["tail\n"]
        else:
            (cut,) = [m for m in pool.responses(None) if m.get("event") != "ready"]
            assert cut["error"]["type"] == "RequestError" and "not valid JSON" in cut["error"]["message"]


def test_after_sigterm_host_calls_are_still_answered_while_the_pool_drains(tmp_path: Path) -> None:
    """A stop signal does not end the client: the pool reads on through its drain, replies included, so a
    job waiting for one finishes as it would have."""
    with driver.PoolProcess("--workers=1", cwd=tmp_path) as pool:
        waiting = pool.submit(functions=["lookup"], timeout=HOST_WAIT,
                              code="from pynox_host import lookup\nprint(lookup(1))\nprint(lookup(2))")
        first = pool.wait_for(lambda m: m.get("event") == "call" and m.get("id") == waiting)
        pool.proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        pool.reply(first["call_id"], result="one")
        second = pool.wait_for(lambda m: m.get("event") == "call" and m.get("id") == waiting
                               and m["call_id"] != first["call_id"])
        pool.reply(second["call_id"], result="two")
        assert pool.result(waiting)["stdout"] == "one\ntwo\n"
        assert pool.wait_exit() == 0


def test_a_host_call_left_unanswered_after_sigterm_ends_at_the_drain_deadline(tmp_path: Path) -> None:
    with driver.PoolProcess("--workers=1", "--drain-timeout=1s", cwd=tmp_path) as pool:
        waiting = pool.submit(functions=["lookup"], timeout=HOST_WAIT,
                              code="from pynox_host import lookup\nprint(lookup(1))")
        pool.wait_for(lambda m: m.get("event") == "call" and m.get("id") == waiting)
        started = time.monotonic()
        pool.proc.send_signal(signal.SIGTERM)
        assert pool.wait_exit() == 75  # the drain was cut short
        assert time.monotonic() - started < 10
        (result,) = pool.responses(waiting)
        assert result["error"]["type"] == "CancelledError" and "drain deadline" in result["error"]["message"]


_CLIENT = """
import json, subprocess, sys, time
pool = subprocess.Popen(sys.argv[2:], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
ready = pool.stdout.readline()
lines = [
    {"id": "long-1", "code": "import time\\ntime.sleep(60)"},
    {"id": "host", "functions": ["f"], "code": "from pynox_host import f\\nf()"},
    {"id": "step", "session": "nb", "open": True, "code": "import time\\ntime.sleep(60)"},
]
if sys.argv[1] == "blocked":  # results the client will never read: the pool blocks writing them
    lines += [{"id": f"big-{i}", "code": "print('x' * 300000)"} for i in range(8)]
for line in lines:
    pool.stdin.write(json.dumps(line).encode() + b"\\n")
pool.stdin.flush()
print(json.dumps({"pool": pool.pid, "ready": json.loads(ready)}), flush=True)
time.sleep(120)
"""


@pytest.mark.parametrize("state", ["busy", "blocked"])
def test_when_the_client_dies_the_pool_and_every_child_exit_within_a_second(tmp_path: Path, state: str) -> None:
    with owning_client(_CLIENT, state, *driver.POOL, "--workers=2", cwd=tmp_path) as (client, pool_pid):
        wait_for_jobs(pool_pid, 3, 15, "the long job, the host job and the session step")
        if state == "blocked":
            time.sleep(1)  # the big results fill the pipe the client does not read
        family = [pool_pid, *driver.descendants(pool_pid)]
        os.kill(client.pid, signal.SIGKILL)
        client.wait(10)
        assert driver.wait_gone(family, 1.0) == [], "the pool or its processes outlived their client by over a second"
    driver.assert_no_leftovers()


def _stall(pool: driver.PoolProcess, seconds: float, tmp_path: Path) -> tuple[int, int]:
    """Read nothing for ``seconds``; returns the pool's peak RSS meanwhile and how many big jobs ran."""
    peak = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        peak = max(peak, driver.rss_kb(pool.pid))
        time.sleep(0.05)
    return peak, len(list((tmp_path / "marks").iterdir()))


def test_a_client_that_stops_reading_for_seconds_blocks_the_pool_with_bounded_memory(tmp_path: Path) -> None:
    (tmp_path / "marks").mkdir()
    size, count = 200_000, 40
    code = "import sys\nopen('marks/' + sys.argv[1], 'w')\nsys.stdout.write('x' * {size})"
    host_code = "from pynox_host import echo\nprint(echo({n}))"
    echo: dict[str, Any] = {"echo": lambda value: value}
    with driver.pool_process("--workers=2", cwd=tmp_path) as pool:
        for n in range(6):  # the allocator has seen results, calls and session steps of these sizes
            assert len(pool.run(code.format(size=size), args=[f"warm-{n}"], allow_write=["marks"])["stdout"]) == size
            assert pool.run(host_code.format(n=n), host=echo)["stdout"] == f"{n}\n"
        assert pool.run("x = 3", session="nb")["exit"] == 0
        time.sleep(0.5)
        baseline = driver.rss_kb(pool.pid)
        warm = len(list((tmp_path / "marks").iterdir()))

        # Plain jobs, written as fast as the pipe takes them, and session steps beside them.
        pool.pause_reading()
        requests: list[dict[str, Any]] = [
            {"id": driver.new_id("bp"), "code": code.format(size=size), "args": [f"bp-{i}"], "allow_write": ["marks"]}
            for i in range(count)]
        requests[5:5] = [{"id": driver.new_id("bp-step"), "session": "nb", "code": "print(x)"} for _ in range(3)]
        sender = threading.Thread(target=lambda: [pool.send(r) for r in requests], daemon=True)
        sender.start()
        peak, ran = _stall(pool, 5, tmp_path)
        pool.resume_reading()
        sender.join(60)
        assert not sender.is_alive(), "the pool never took the rest of the requests"
        # Two workers blocked on results the pipe cannot take, and a queue of four: a few jobs, not forty.
        assert ran - warm <= 8, f"{ran - warm} jobs ran while nobody read the results"

        # Host calls while nobody reads: within the 3 x workers jobs the protocol asks a client to keep in
        # flight when it serves host functions, they wait for the client, then complete.
        pool.pause_reading()
        for n in range(6):
            host_id = driver.new_id("bp-host")
            pool.handle_calls(host_id, echo)
            requests.append({"id": host_id, "functions": ["echo"], "code": host_code.format(n=n), "timeout": "60s"})
            pool.send(requests[-1])
        host_peak, _ = _stall(pool, 3, tmp_path)
        pool.resume_reading()

        for request in requests:
            result = pool.result(request["id"], timeout=60)
            assert result["exit"] == 0, result
        pool.quiet_for(lambda m: False, 0.3)
        for request in requests:
            assert len(pool.responses(request["id"])) == 1, request["id"]
        grown = max(peak, host_peak) - baseline
        assert grown < 16 * 1024, f"the pool grew by {grown} KiB while its client did not read"
