"""pynox-monty against the real pool and real Monty workers: glue code in Monty, heavy code in Pynox."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pydantic_monty
import pytest

import pynox
from pynox_monty import external_lookup, python_function

pytestmark = pytest.mark.timeout(90)

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def pool() -> Iterator[pynox.Pool]:
    with pynox.Pool(workers=2) as pool:
        yield pool


@pytest.fixture(scope="module")
def monty() -> Iterator[pydantic_monty.Monty]:
    with pydantic_monty.Monty() as monty:
        yield monty


def feed(monty: pydantic_monty.Monty, code: str, lookup: dict[str, Any]) -> Any:
    with monty.checkout(script_name="agent.py") as session:
        return session.feed_run(code, external_lookup=lookup)


def test_example_prints_the_mean_and_the_stored_json() -> None:
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "monty_bridge.py")], capture_output=True,
                          text=True, timeout=120, check=False, env={**os.environ, "PYTHONWARNINGS": "error"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["mean: 13", 'stored: {"mean": 13, "count": 3}']


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


def test_readme_example_runs(tmp_path: Path) -> None:
    readme = ROOT / "packages" / "pynox-monty" / "README.md"
    script = tmp_path / "readme_example.py"
    script.write_text(readme.read_text().split("```python\n", 1)[1].split("```", 1)[0])
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, check=False,
                          cwd=tmp_path, env={**os.environ, "PYTHONWARNINGS": "error"})
    assert done.returncode == 0, done.stderr
