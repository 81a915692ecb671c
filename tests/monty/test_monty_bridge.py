"""pynox-monty against the real pool and real Monty workers: glue code in Monty, heavy code in Pynox."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pydantic_monty
import pytest

import pynox
from pynox_monty import external_lookup, python_function

from .glue import ROOT, feed

pytestmark = pytest.mark.timeout(90)


def test_example_prints_the_mean_the_stored_json_and_the_means_computed_at_once() -> None:
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "monty_bridge.py")], capture_output=True,
                          text=True, timeout=120, check=False, env={**os.environ, "PYTHONWARNINGS": "error"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["mean: 13", 'stored: {"mean": 13, "count": 3}',
                                        "means, computed at once: [13, 4]"]


def test_example_writes_only_where_the_host_granted(tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        import monty_bridge  # pyright: ignore[reportMissingImports]
    finally:
        sys.path.remove(str(ROOT / "examples"))
    assert monty_bridge.run_agent(tmp_path) == 13
    assert [p.name for p in tmp_path.iterdir()] == ["stats.json"]


def test_read_outside_the_grant_is_data_with_the_hint(pool: pynox.Pool, monty: pydantic_monty.Monty,
                                                      tmp_path: Path) -> None:
    lookup = external_lookup(pool, allow_read=[tmp_path])
    job = feed(monty, "run_python(\"print(open('/etc/passwd').read())\")", lookup)
    assert set(job) == {"exit", "stdout", "stderr", "error", "truncated"}
    assert job["exit"] != 0 and job["stdout"] == "" and "root:" not in job["stderr"]
    assert job["error"]["type"] == "PermissionError" and job["error"]["file"] == "heavy.py"
    assert job["error"]["line"] == 1 and job["error"]["path"] == "/etc/passwd"
    assert 'allow_read=["/etc/passwd"]' in job["error"]["hint"]


def test_glue_code_can_branch_and_its_error_names_the_pynox_type_and_line(pool: pynox.Pool,
                                                                         monty: pydantic_monty.Monty) -> None:
    lookup = external_lookup(pool)
    glue = (
        "job = run_python('x = 1\\nopen(\"/etc/shadow\")')\n"
        "if job['exit'] != 0:\n"
        "    error = job['error']\n"
        "    raise RuntimeError(f\"{error['type']} at line {error['line']}: {error['message']}\")\n"
    )
    with pytest.raises(pydantic_monty.MontyRuntimeError) as caught:
        feed(monty, glue, lookup)
    assert "RuntimeError: PermissionError at line 2: [Errno 13] Permission denied: '/etc/shadow'" in str(caught.value)


def test_timeout_above_the_hosts_is_clamped(pool: pynox.Pool, monty: pydantic_monty.Monty) -> None:
    lookup = {"run_python": python_function(pool, timeout="1s")}
    started = time.monotonic()
    job = feed(monty, "run_python('while True:\\n    pass', timeout='60s')", lookup)
    assert time.monotonic() - started < 10
    assert job["exit"] == 124 and job["error"]["type"] == "TimeoutError"
    assert "1s" in job["error"]["message"]
    # A shorter one is the glue code's to choose.
    started = time.monotonic()
    job = feed(monty, "run_python('while True:\\n    pass', timeout=0.3)", lookup)
    assert job["exit"] == 124 and "300ms" in job["error"]["message"] and time.monotonic() - started < 5
    # The docstring the model may read says so.
    assert "Each call may run for 1s; `timeout` can only shorten that." in (lookup["run_python"].__doc__ or "")


# Glue code that does what a timeout's hint says: retries with the longer timeout the hint proposes, until
# it proposes none. Following a hint that proposes one the host would cut back, it never stops by itself.
FOLLOWS_THE_HINT = """
import re
timeout = None
attempts = 0
while attempts < 3:
    attempts += 1
    job = run_python('while True:\\n    pass', timeout=timeout)
    proposed = re.search(r'timeout="([^"]+)"', job['error']['hint'] or '')
    if job['exit'] != 124 or proposed is None:
        break
    timeout = proposed.group(1)
[attempts, job['error']['hint']]
"""


def test_glue_code_following_the_timeout_hint_stops_at_the_hosts_limit(pool: pynox.Pool,
                                                                       monty: pydantic_monty.Monty) -> None:
    lookup = {"run_python": python_function(pool, timeout="400ms")}
    attempts, hint = feed(monty, FOLLOWS_THE_HINT, lookup)
    assert attempts == 1, hint
    assert hint == ("The code ran longer than its 400ms limit and was stopped. 400ms is the most the host allows "
                    "a run_python call, and only the host can raise it: a longer `timeout` is cut back to it. "
                    "Make the code faster (check for endless loops or waits), or do less in each call.")


def test_a_timeout_shorter_than_the_hosts_may_be_raised_up_to_it(pool: pynox.Pool,
                                                                 monty: pydantic_monty.Monty) -> None:
    lookup = {"run_python": python_function(pool, timeout="1s")}
    job = feed(monty, "run_python('while True:\\n    pass', timeout=0.3)", lookup)
    assert job["exit"] == 124 and job["error"]["type"] == "TimeoutError"
    assert job["error"]["hint"] == (
        "The code ran longer than the 300ms its `timeout` gave it and was stopped. A run_python call may run "
        "for at most 1s, the host's limit: pass a longer `timeout`, up to 1s, or make the code faster (check "
        "for endless loops or waits).")
    # The code's own TimeoutError is not the pool's timeout: its hint is left alone.
    job = feed(monty, "run_python('raise TimeoutError(\"slow upstream\")')", lookup)
    assert job["exit"] == 1 and job["error"]["type"] == "TimeoutError" and job["error"]["hint"] is None


def _pools_own_answer(request: dict[str, Any]) -> dict[str, Any]:
    """What a ``pynox pool`` process, driven over its JSON Lines, answers to one request."""
    done = subprocess.run([sys.executable, "-m", "pynox", "pool", "--workers=1"], input=json.dumps(request) + "\n",
                          capture_output=True, text=True, timeout=60, check=True)
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert lines[0]["event"] == "ready"
    (answer,) = [line for line in lines if line.get("id") == request["id"]]
    return answer


def test_a_refusal_is_the_pools_own_result_as_the_bridge_shows_any_result(pool: pynox.Pool,
                                                                           monty: pydantic_monty.Monty,
                                                                           tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    wire = _pools_own_answer({"id": "r-1", "code": "print(1)", "allow_read": [str(missing)]})
    assert wire["exit"] == 2 and wire["error"]["type"] == "RequestError"
    job = feed(monty, "run_python('print(1)')", external_lookup(pool, allow_read=[missing]))
    assert job == {"exit": wire["exit"], "stdout": wire["stdout"], "stderr": wire["stderr"], "error": wire["error"],
                   "truncated": wire["stdout_truncated"] or wire["stderr_truncated"]}


def test_bad_arguments_from_the_glue_code_raise_there(pool: pynox.Pool, monty: pydantic_monty.Monty) -> None:
    lookup = external_lookup(pool)
    with pytest.raises(pydantic_monty.MontyRuntimeError, match="ValueError: timeout: 'soon' is not a duration"):
        feed(monty, "run_python('print(1)', timeout='soon')", lookup)
    with pytest.raises(pydantic_monty.MontyRuntimeError, match="TypeError: run_python\\(\\) code must be a str"):
        feed(monty, "run_python(42)", lookup)


def test_bad_grants_raise_in_the_host_and_refusals_are_data(pool: pynox.Pool, monty: pydantic_monty.Monty,
                                                             tmp_path: Path) -> None:
    with pytest.raises(pynox.ConfigError):
        python_function(pool, timeout="soon")
    with pytest.raises(pynox.RequestError, match="unknown profile"):
        python_function(pool, profile="nope")
    lookup = external_lookup(pool, allow_read=[tmp_path / "missing"])
    job = feed(monty, "run_python('print(1)')", lookup)
    assert job["exit"] == 2 and job["error"]["type"] == "RequestError" and "missing" in job["error"]["message"]


def test_many_calls_from_one_session_reuse_one_pool(pool: pynox.Pool, monty: pydantic_monty.Monty) -> None:
    before = pool.stats()
    lookup = external_lookup(pool)
    glue = "total = 0\nfor i in range(8):\n    total += int(run_python(f'print({i} * {i})')['stdout'])\ntotal"
    with monty.checkout(script_name="agent.py") as session:
        assert session.feed_run(glue, external_lookup=lookup) == sum(i * i for i in range(8))
        assert session.feed_run("run_python('print(7)')['stdout']", external_lookup=lookup) == "7\n"
    after = pool.stats()
    assert after["jobs"] - before["jobs"] == 9  # every call on this pool: no pool was started per call
    assert after["uptime_ms"] >= before["uptime_ms"] and after["workers"] == 2


def test_host_functions_serve_both_sandboxes_and_keep_their_error_type(pool: pynox.Pool,
                                                                       monty: pydantic_monty.Monty) -> None:
    class CatalogError(Exception):
        pass

    def price(product: str) -> float:
        if product != "lamp":
            raise CatalogError(f"no product named {product!r}")
        return 25.0

    def quantity(product: str) -> int:
        raise KeyError(product)

    lookup = external_lookup(pool, functions={"price": price, "quantity": quantity})
    glue = (
        "heavy = run_python('from pynox_host import price\\nprint(price(\"lamp\") * 2)')\n"
        "[price('lamp'), heavy['stdout']]"
    )
    assert feed(monty, glue, lookup) == [25.0, "50.0\n"]
    with pytest.raises(pydantic_monty.MontyRuntimeError, match="price\\(\\) failed: CatalogError: no product named"):
        feed(monty, "price('sofa')", lookup)
    with pytest.raises(pydantic_monty.MontyRuntimeError, match="KeyError"):
        feed(monty, "quantity('lamp')", lookup)
    with pytest.raises(ValueError, match="run_python"):
        external_lookup(pool, functions={"run_python": price})


@pytest.mark.parametrize("block", [0, 1])
def test_readme_examples_run(tmp_path: Path, block: int) -> None:
    readme = (ROOT / "packages" / "pynox-monty" / "README.md").read_text()
    blocks = [part.split("```", 1)[0] for part in readme.split("```python\n")[1:]]
    assert len(blocks) == 2
    script = tmp_path / "readme_example.py"
    script.write_text(blocks[block])
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, check=False,
                          cwd=tmp_path, env={**os.environ, "PYTHONWARNINGS": "error"})
    assert done.returncode == 0, done.stderr
