"""The job's relay in C (server/_relay.c) against its Python fallback (server/capture.py, ``$PYNOX_NATIVE=0``):
the same jobs run on a pool of each, and every field of their results is the same, but those that measure
time or a process (durations, CPU, pids, memory figures).

The control: each pool says which path it takes (``pynox check``'s ``relay`` fact, from a template started under
the same variable), so the two sides below are the two paths. Each case also checks its own rule from outside
(a cap, a drained flood, a deadline met), so a path that broke it would fail here even if both broke it alike.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from .pool_driver import PoolProcess, own_commands_env, pool_process

pytestmark = pytest.mark.timeout(300)

# What measures time or a process: never the same twice, on either path.
_MEASURED = {"duration_ms", "duration_us", "queue_us", "cpu_ms", "max_rss_kb", "memory_peak_kb", "id"}
_FLOOD = 16 << 20


def _comparable(result: dict[str, Any]) -> dict[str, Any]:
    def strip(value: Any) -> Any:  # a JSON value
        if isinstance(value, dict):
            return {key: strip(item) for key, item in value.items() if key not in _MEASURED}
        if isinstance(value, list):
            return [strip(item) for item in value]
        return value
    kept: dict[str, Any] = strip(result)
    return kept


@pytest.fixture(scope="module")
def pools(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, PoolProcess]]:
    with pool_process("--workers=1", cwd=tmp_path_factory.mktemp("python"),
                      env={**os.environ, "PYNOX_NATIVE": "0"}) as python, \
            pool_process("--workers=1", cwd=tmp_path_factory.mktemp("native"),
                         env={**os.environ, "PYNOX_NATIVE": "1"}) as native:
        yield {"python": python, "native": native}


@pytest.mark.parametrize("native", ["0", "1"])
def test_each_pool_takes_its_path(native: str) -> None:
    done = subprocess.run([sys.executable, "-m", "pynox", "check", "--json"], capture_output=True, text=True,
                          env={**own_commands_env(), "PYNOX_NATIVE": native}, timeout=120, check=False)
    relay = json.loads(done.stdout)["facts"]["relay"]
    assert relay == ("native" if native == "1" else "python ($PYNOX_NATIVE=0)"), relay


def _both(pools: dict[str, PoolProcess], code: str | None = None, **fields: Any) -> dict[str, Any]:
    """The job on both paths; its Python path's result, once the native one is found the same."""
    python = pools["python"].run(code, **fields)
    native = pools["native"].run(code, **fields)
    assert _comparable(native) == _comparable(python)
    return python


_CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "print": ("print(1)", {}),
    "both streams past the cap": (
        "import sys\nfor i in range(300):\n    print(i, 'x' * 50)\n    print(i, 'y' * 70, file=sys.stderr)",
        {"max_output": "4k"}),
    "a write past the cap in one chunk": ("import sys\nsys.stdout.write('a' * 70000)\nprint('tail')",
                                          {"max_output": "64k"}),
    "stderr only, exit status": ("import sys\nprint('bad', file=sys.stderr)\nraise SystemExit(3)", {}),
    "an exception, its report": ("def f():\n    return 1 / 0\nprint('before')\nf()", {"name": "cell.py"}),
    "a trailing value": ("x = 40\nx + 2", {"return_value": True}),
    "display frames": (
        "from pynox_display import HTML\ndisplay('before')\ndisplay(HTML('x' * 50000))\ndisplay('after')\n7",
        {"max_output": "10k", "return_value": True}),
    "forged display frames": (
        "import os, struct\nos.write(10, struct.pack('!I', 1 << 30) + b'x' * 70000)\nos.close(10)\nprint('on')",
        {}),
    "the report closed early": ("import os\nos.close(1)\nos.close(2)\nimport time\ntime.sleep(0.05)", {}),
    # Written on the report's descriptor by the job: past the report's limit (emptied, then what follows kept), and
    # a short forged one before the job's own.
    "a report past its limit": ("import os\nfor _ in range(40):\n    os.write(3, b'r' * 65536)\nprint('ok')",
                                {"max_output": "64k"}),
    "a forged report": ("import os\nos.write(3, b'{\"shape\": \"exited\", \"exit\": 9')\nprint('ok')", {}),
    "a memory verdict": ("b = bytearray(200 << 20)\nprint(len(b))", {"memory": "64m"}),
    "a timeout": ("import sys\nprint('started', flush=True)\nwhile True:\n    pass", {"timeout": "1s"}),
}


@pytest.mark.parametrize("case", list(_CASES))
def test_the_same_job_gives_the_same_result_on_both_paths(pools: dict[str, PoolProcess], case: str) -> None:
    code, fields = _CASES[case]
    result = _both(pools, code, **fields)
    if case == "both streams past the cap":  # the rule itself, from outside: kept to the cap, every byte counted
        assert result["stdout_truncated"] and result["stderr_truncated"], result
        assert len(result["stdout"]) == 4096 and result["usage"]["stdout_bytes"] == sum(
            len(f"{i} {'x' * 50}\n") for i in range(300)), result["usage"]
    if case == "a memory verdict":
        assert result["error"]["type"] == "MemoryError", result
    if case == "a timeout":
        assert result["error"]["type"] == "TimeoutError" and result["stdout"] == "started\n", result


def test_a_flood_is_drained_and_truncated(pools: dict[str, PoolProcess]) -> None:
    """16 MiB on stdout: every byte read (the job is not blocked on a full pipe: it ends on its own), 1 MiB
    kept."""
    code = f"import sys\nsys.stdout.write('z' * {_FLOOD})\nsys.stdout.flush()\nprint('done', file=sys.stderr)"
    result = _both(pools, code, max_output="1m", timeout="20s")
    assert result["exit"] == 0 and result["error"] is None, result
    assert result["stdout_truncated"] and len(result["stdout"]) == 1 << 20, len(result["stdout"])
    assert result["usage"]["stdout_bytes"] == _FLOOD and result["stderr"] == "done\n", result["usage"]


@pytest.mark.parametrize("side", ["python", "native"])
def test_a_job_that_never_closes_its_pipes_meets_its_deadline(pools: dict[str, PoolProcess], side: str) -> None:
    """Writing without end, its pipes never closed: killed at its deadline, answered within the grace."""
    code = "import sys\nwhile True:\n    sys.stdout.write('w' * 65536)\n    sys.stderr.write('e')"
    began = time.monotonic()
    result = pools[side].run(code, timeout="1s", max_output="8k")
    took = time.monotonic() - began
    assert result["error"]["type"] == "TimeoutError" and result["stdout_truncated"], result
    assert result["usage"]["stdout_bytes"] > 65536, result["usage"]
    assert 1.0 <= took < 6.0, took


@pytest.mark.parametrize("side", ["python", "native"])
def test_a_cancel_kills_a_running_job(pools: dict[str, PoolProcess], side: str) -> None:
    pool = pools[side]
    job = pool.submit(code="import time\nprint('up', flush=True)\ntime.sleep(30)\nprint('never')")
    time.sleep(0.5)
    assert pool.result(pool.submit(cancel=job))["cancelled"] == job
    result = pool.result(job)
    assert result["error"]["type"] == "CancelledError" and "never" not in result["stdout"], result
    assert result["stdout"] == "up\n", result


def test_host_calls_on_both_paths(pools: dict[str, PoolProcess]) -> None:
    code = "from pynox_host import add\nprint(add(1, 2))\nprint(add(40, 2))"
    results = {side: pool.run(code, host={"add": lambda a, b: a + b}) for side, pool in pools.items()}
    assert _comparable(results["native"]) == _comparable(results["python"])
    assert results["native"]["stdout"] == "3\n42\n" and results["native"]["usage"]["host_calls"] == 2


def test_session_steps_on_both_paths(pools: dict[str, PoolProcess]) -> None:
    steps = ["x = 1\nprint('one')", "display(x)\nx + 1", "import sys\nprint('err', file=sys.stderr)\nx += 1",
             "print(undefined)", "print(x)"]
    seen: dict[str, list[dict[str, Any]]] = {}
    for side, pool in pools.items():
        seen[side] = [pool.run(step, session=f"relay-{side}", return_value=True) for step in steps]
        pool.run(session=f"relay-{side}", close=True)
    for python, native in zip(seen["python"], seen["native"], strict=True):
        assert {**_comparable(native), "session": ""} == {**_comparable(python), "session": ""}
    assert seen["native"][-1]["stdout"] == "2\n" and seen["native"][3]["error"]["type"] == "NameError"
