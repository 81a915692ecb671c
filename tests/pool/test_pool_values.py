"""What a result says of the code beyond its output: the trailing value, and where an exception came from.

Through the real pool, on the wire: ``return_value`` only when asked, ``error.traceback`` for the job's
own exceptions only.
"""

from __future__ import annotations

import pytest

from .pool_driver import PoolProcess

pytestmark = pytest.mark.timeout(90)


def test_a_trailing_expression_is_reported_only_when_asked(pool: PoolProcess) -> None:
    asked = pool.run("x = 6 * 7\nx", return_value=True)
    assert asked["return_value"] == "42" and asked["stdout"] == ""
    assert "return_value" not in pool.run("x = 6 * 7\nx"), "the spec's result has no such field by default"


@pytest.mark.parametrize(("code", "expected"), [
    ("print(6 * 7)", None),  # print() returns None: the output is not shown twice
    ("x = 1", None),  # the last statement is no expression
    ("None", None),
    ("'a' + 'b'", "'ab'"),
    ("import datetime\ndatetime.date(2026, 12, 1)", "datetime.date(2026, 12, 1)"),
    ("if True:\n    y = 2\ny * 3", "6"),
])
def test_the_value_is_repr_of_the_last_expression(pool: PoolProcess, code: str, expected: str | None) -> None:
    result = pool.run(code, return_value=True)
    assert result["exit"] == 0, result
    assert result["return_value"] == expected


def test_the_trailing_expression_runs_once(pool: PoolProcess) -> None:
    result = pool.run("calls = []\ndef f():\n    calls.append(1)\n    return len(calls)\nf()", return_value=True)
    assert result["return_value"] == "1"


def test_top_level_await_runs_and_its_value_is_reported(pool: PoolProcess) -> None:
    code = ("import asyncio\nasync def double(x):\n    await asyncio.sleep(0.01)\n    return 2 * x\n"
            "a, b = await asyncio.gather(double(1), double(2))\n{'a': a, 'b': b}")
    result = pool.run(code, return_value=True)
    assert result["exit"] == 0, result
    assert result["return_value"] == "{'a': 2, 'b': 4}"


def test_a_value_is_capped_like_output(pool: PoolProcess) -> None:
    result = pool.run("'x' * 10_000", return_value=True, max_output=100)
    assert result["return_value"].startswith("'xxx") and "more characters" in result["return_value"]
    assert len(result["return_value"].encode()) < 200


def test_a_broken_repr_does_not_fail_the_code(pool: PoolProcess) -> None:
    code = "class Odd:\n    def __repr__(self):\n        raise RuntimeError('no')\nOdd()"
    result = pool.run(code, return_value=True)
    assert result["exit"] == 0 and "repr() raised RuntimeError" in result["return_value"]


@pytest.mark.parametrize(("code", "kind", "message"), [
    # JSON's UTF-8 cannot carry a lone surrogate: the report is written with it escaped, as stderr writes it.
    ("raise ValueError('\\udc80')", "ValueError", "\\udc80"),
    ("class Odd(Exception):\n    def __str__(self):\n        return '\\ud800!'\nraise Odd()", "Odd", "\\ud800!"),
    # The job's own __str__ failing: what Python's traceback prints for it.
    ("class Odd(Exception):\n    def __str__(self):\n        raise RuntimeError('no')\nraise Odd()", "Odd",
     "<exception str() failed>"),
    # ... with an exception that is not an Exception: still the code's own error, not Pynox's (it ended with 125).
    ("class Odd(Exception):\n    def __str__(self):\n        raise KeyboardInterrupt\nraise Odd()", "Odd",
     "<exception str() failed>"),
    ("class Odd(Exception):\n    def __str__(self):\n        raise SystemExit(3)\nraise Odd()", "Odd",
     "<exception str() failed>"),
    # Standard exceptions the code made itself, with fields of types Python never gives them.
    ("raise SyntaxError('m', ('agent.py', 'one', 'two', 5))", "SyntaxError", "m"),
    ("error = SyntaxError('m')\nerror.filename, error.lineno, error.text = 'agent.py', 1, 5\nraise error",
     "SyntaxError", "m"),
    ("raise ModuleNotFoundError('m', name=5)", "ModuleNotFoundError", "m"),
    # A metaclass's own __name__, and text that is a str of the code's own kind.
    ("class Meta(type):\n    @property\n    def __name__(cls):\n        raise RuntimeError('no')\n"
     "class Odd(Exception, metaclass=Meta):\n    pass\nraise Odd('m')", "Odd", "m"),
    ("class Text(str):\n    def __len__(self):\n        raise KeyboardInterrupt\n"
     "class Odd(Exception):\n    def __str__(self):\n        return Text('m')\nraise Odd()", "Odd", "m"),
])
def test_an_exception_that_resists_description_is_still_reported(pool: PoolProcess, code: str, kind: str,
                                                                   message: str) -> None:
    result = pool.run(code)
    assert result["exit"] == 1, result  # the code's own end, not the setup's (125)
    assert (result["error"]["type"], result["error"]["message"]) == (kind, message), result


@pytest.mark.parametrize(("code", "kind"), [
    ("raise type('N' * 5_000_000, (Exception,), {})('m')", "N" * 90),  # a class's name is the code's to choose
    ("raise PermissionError(13, 'denied', 'p' * 5_000_000)", "PermissionError"),
    # A line of 700,000 characters, in each of 20 frames.
    ("def f(n):\n    return f(n + 1) if n < 20 else 1 / 0; " + "x = 1; " * 100_000 + "\nf(0)", "ZeroDivisionError"),
])
def test_an_error_too_large_to_report_whole_is_reported_cut(pool: PoolProcess, code: str, kind: str) -> None:
    # Its report was over the pool's bound for one, so the pool took none: exit 1 with no error said.
    result = pool.run(code)
    assert result["exit"] == 1 and result["error"] is not None, result
    assert result["error"]["type"].startswith(kind), result["error"]["type"][:200]
    assert len(str(result["error"])) < 100_000


def test_a_value_whose_repr_holds_a_lone_surrogate_is_reported_escaped(pool: PoolProcess) -> None:
    code = "class Odd:\n    def __repr__(self):\n        return 'a\\udc80b'\nOdd()"
    result = pool.run(code, return_value=True)
    assert result["exit"] == 0 and result["return_value"] == "a\\udc80b", result
    step = pool.run(code, session="surrogate", return_value=True)
    assert step["exit"] == 0 and step["return_value"] == "a\\udc80b", step
    assert pool.run("Odd", session="surrogate", return_value=True)["exit"] == 0, "the session lives on"
    pool.send({"id": "close-surrogate", "session": "surrogate", "close": True})
    pool.result("close-surrogate")


def test_session_steps_report_their_values(pool: PoolProcess) -> None:
    assert pool.run("y = 5", session="values", return_value=True)["return_value"] is None
    assert pool.run("y * 2", session="values", return_value=True)["return_value"] == "10"
    assert "return_value" not in pool.run("y * 3", session="values")
    pool.send({"id": "close-values", "session": "values", "close": True})
    pool.result("close-values")


def test_a_traceback_lists_the_jobs_own_frames_and_counts_the_rest(pool: PoolProcess) -> None:
    code = "import json\ndef parse(text):\n    return json.loads(text)\nparse('{')"
    error = pool.run(code)["error"]
    frames = error["traceback"]
    assert [(f["file"], f["line"], f["source"]) for f in frames[:2]] == [
        ("agent.py", 4, "parse('{')"), ("agent.py", 3, "return json.loads(text)")]
    assert frames[2]["file"] is None and frames[2]["omitted"] >= 2, frames  # json's own frames
    assert len(frames) == 3


def test_an_exit_hook_that_fails_is_reported_as_pythons_exit_reports_it(pool: PoolProcess) -> None:
    # A hook that is a C function has no frame of its own: its traceback was Pynox's frame that ran it.
    code = "import atexit, sys\natexit.register(sys.exit, 7)\natexit.register(int, 'x')\nprint('ran')"
    result = pool.run(code)
    assert (result["exit"], result["error"], result["stdout"]) == (0, None, "ran\n"), result  # as Python exits
    assert result["stderr"] == ("Exception ignored in atexit callback: <class 'int'>\n"
                                "ValueError: invalid literal for int() with base 10: 'x'\n"
                                "Exception ignored in atexit callback: <built-in function exit>\n"
                                "SystemExit: 7\n"), result["stderr"]


def test_a_deep_recursion_keeps_both_ends(pool: PoolProcess) -> None:
    frames = pool.run("def down(n):\n    return down(n + 1)\ndown(0)")["error"]["traceback"]
    assert len(frames) == 21
    assert frames[0]["line"] == 3 and frames[-1]["line"] == 2
    assert frames[10]["omitted"] > 900


def test_a_syntax_error_says_where_once(pool: PoolProcess) -> None:
    error = pool.run("x = (1,\n")["error"]
    assert error["type"] == "SyntaxError" and error["message"] == "'(' was never closed"
    assert (error["file"], error["line"]) == ("agent.py", 1)
    assert error["traceback"] == [{"file": "agent.py", "line": 1, "source": "x = (1,", "column": 5, "omitted": 0}]


def test_the_pools_own_errors_have_no_traceback(pool: PoolProcess) -> None:
    result = pool.run("while True:\n    pass", timeout="300ms")
    assert result["error"]["type"] == "TimeoutError" and result["error"]["traceback"] is None
