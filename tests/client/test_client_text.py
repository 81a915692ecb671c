"""``Result.text``, what the model reads: output, stderr, the trailing value, the failing line.

Real runs through the Python client; each text is checked for what must be there and what must not
(a traceback said twice, a location said twice, a hint lost).
"""

from __future__ import annotations

import pytest

from pynox import Pool
from tests.harness.fixtures import shared_pool

pytestmark = pytest.mark.timeout(90)


pool = shared_pool(workers=2)


def test_stderr_comes_after_the_output_marked_as_such(pool: Pool) -> None:
    text = pool.run("import logging, warnings\nlogging.warning('low disk')\nwarnings.warn('careful')\n"
                    "print('done')").text
    output, _, stderr = text.partition("\n[stderr]\n")
    assert output == "done"
    assert "WARNING:root:low disk" in stderr and "UserWarning: careful" in stderr


def test_code_that_only_logs_shows_its_log(pool: Pool) -> None:
    text = pool.run("import logging\nlogging.warning('only logs')").text
    assert text == "[stderr]\nWARNING:root:only logs"


def test_the_traceback_is_not_repeated_but_earlier_stderr_is_kept(pool: Pool) -> None:
    code = ("import logging\ntry:\n    1 / 0\nexcept ZeroDivisionError:\n    logging.exception('handled')\n"
            "def f():\n    raise ValueError('inner')\ntry:\n    f()\nexcept ValueError:\n    raise KeyError('outer')")
    result = pool.run(code)
    assert result.stderr.count("Traceback (most recent call last):") == 3  # the logged one, then the chain
    text = result.text
    assert text.count("Traceback (most recent call last):") == 1  # the logged one only
    assert "ERROR:root:handled" in text and "ZeroDivisionError" in text
    assert "During handling" not in text and "ValueError: inner" not in text
    assert text.endswith("KeyError: 'outer' (agent.py:11)\n    raise KeyError('outer')")


def test_an_exit_message_is_said_once(pool: Pool) -> None:
    text = pool.run("import sys\nprint('first', file=sys.stderr)\nsys.exit('giving up')").text
    assert text == "[stderr]\nfirst\nThe code exited with status 1. giving up"


def test_long_stderr_shows_its_end(pool: Pool) -> None:
    text = pool.run("import sys\nfor i in range(2000):\n    print(f'line {i}', file=sys.stderr)").text
    assert "line 1999" in text and "line 0\n" not in text
    assert "[the last 4000 of " in text


def test_the_trailing_value_is_shown_after_the_output(pool: Pool) -> None:
    result = pool.run("print('rows: 3')\ntotal = 21\ntotal * 2")
    assert result.return_value == "42"
    assert result.text == "rows: 3\nOut: 42"
    assert pool.run("total = 21\ntotal * 2", return_value=False).return_value is None
    assert pool.run("print(42)").text == "42"  # print() last: not shown twice


def test_a_session_shows_values_like_notebook_cells(pool: Pool) -> None:
    with pool.session() as session:
        assert session.run("x = 6 * 7").text.startswith("(The code ran without printing anything")
        assert session.run("x").text == "Out: 42"


def test_the_failing_line_is_shown_under_the_error(pool: Pool) -> None:
    assert pool.run("d = {}\nd['k']").text == "KeyError: 'k' (agent.py:2)\n    d['k']"


def test_a_syntax_error_shows_its_line_and_caret_and_its_location_once(pool: Pool) -> None:
    text = pool.run("x = (1,\n").text
    assert text == "SyntaxError: '(' was never closed (agent.py:1)\n    x = (1,\n        ^"
    assert "line 1)" not in text


def test_a_hint_still_follows(pool: Pool) -> None:
    text = pool.run("open('/etc/passwd').read()").text
    first, source, hint = text.split("\n")
    assert first.startswith("PermissionError") and source == "    open('/etc/passwd').read()"
    assert hint.startswith("Hint: /etc/passwd is outside the paths")
