"""Code that breaks what its child reports with still gets one honest result: its own outcome, or an error that says
what it broke; never exit 125 (a setup failure's) or 1 with no error, never a timeout for code that ended.

The child writes its report after the code, in the same process: the code may have closed or replaced the report
descriptor (3) or a session's control channel (5), kept a copy of its stdout, or replaced what the report is made
with (``os.write``, ``msgspec``, builtins, ``traceback``'s functions, ``sys.stdout``). Each case is a real confined
job in a real pool; its control is the same code without the breakage, or the result a plain raise gets.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.harness.job_code import each_copy_of
from tests.pool.pool_driver import PoolProcess, new_id, pool_process

pytestmark = pytest.mark.timeout(240)

_FAR = "30s"  # a deadline no case may need: waiting for it would show


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PoolProcess]:
    with pool_process("--workers=1", cwd=tmp_path_factory.mktemp("machinery")) as shared:
        yield shared


def _raised(result: dict[str, Any], error_type: str) -> None:
    assert result["exit"] == 1 and result["error"] is not None, result
    assert result["error"]["type"] == error_type, result


# -- the report descriptor (3) ------------------------------------------------------------------------------------

@pytest.mark.parametrize("breakage", [
    "os.close(3)",
    "os.dup2(os.open('/dev/null', os.O_WRONLY), 3)",  # another file at its number
    "os.close(3)\nheld = open('/dev/null', 'w')",  # the number taken again by the code's own file
])
def test_code_that_closes_or_replaces_its_report_descriptor_gets_its_own_error(pool: PoolProcess,
                                                                                breakage: str) -> None:
    result = pool.run(f"import os\n{breakage}\nprint('ran')\nraise ValueError('its own')", timeout=_FAR)
    _raised(result, "ValueError")
    assert result["error"]["message"] == "its own" and result["error"]["line"] is not None, result
    assert result["stdout"] == "ran\n", result
    # Control: a value it returns comes too (the report carries it).
    value = pool.run(f"import os\n{breakage}\n6 * 7", return_value=True, timeout=_FAR)
    assert (value["exit"], value["error"], value["return_value"]) == (0, None, "42"), value


def test_a_step_that_closes_its_report_descriptor_keeps_its_session(pool: PoolProcess) -> None:
    name = new_id("report-closed")
    assert pool.run("kept = 'yes'", session=name)["exit"] == 0
    for step in ("import os\nos.close(3)\nraise KeyError('k')", "import os\nos.close(3)\nprint(kept)"):
        result = pool.run(step, session=name, timeout=_FAR)
        assert result["session_ended"] is False, result
    assert result["exit"] == 0 and result["stdout"] == "yes\n", result
    pool.run(session=name, close=True)


# -- descriptor 5: a session's control channel, and a copy of an output ---------------------------------------------

def test_a_job_that_keeps_a_copy_of_its_stdout_is_answered_at_its_end(pool: PoolProcess) -> None:
    """Its copy held the stdout pipe open while the process was stopped at its end: the result waited for the
    deadline and said TimeoutError."""
    for copy in ("os.dup2(1, 5)", "kept = os.dup(1)", "os.dup2(3, 40)"):
        start = time.monotonic()
        result = pool.run(f"import os\n{copy}\nprint('ran')", timeout=_FAR)
        took = time.monotonic() - start
        assert (result["exit"], result["error"], result["stdout"]) == (0, None, "ran\n"), result
        assert took < 10, f"{copy}: answered after {took:.1f} s"


@pytest.mark.parametrize("breakage", [
    "os.dup2(1, 5)", "os.dup2(os.open('/dev/null', os.O_RDWR), 5)", "os.close(5)", "os.dup2(3, 5)",
])
def test_a_step_that_replaces_its_control_channel_keeps_its_session(pool: PoolProcess, breakage: str) -> None:
    """The session ended with the step's process, as if it had succeeded (exit 0, no error), and the next step was
    answered as a new session's."""
    name = new_id("control")
    assert pool.run("kept = 'yes'", session=name)["exit"] == 0
    result = pool.run(f"import os\n{breakage}\nprint('ran')", session=name, timeout=_FAR)
    assert (result["exit"], result["error"], result["session_ended"]) == (0, None, False), result
    after = pool.run("print(kept)", session=name, timeout=_FAR)
    assert (after["exit"], after["stdout"], after["session_ended"], after["step"]) == (0, "yes\n", False, 3), after
    pool.run(session=name, close=True)


def test_a_step_that_closes_every_copy_of_its_control_channel_ends_its_session_saying_so(pool: PoolProcess) -> None:
    name = new_id("control-gone")
    assert pool.run("kept = 'yes'", session=name)["exit"] == 0
    code = each_copy_of(5, "_os.dup2(_os.open('/dev/null', _os.O_RDWR), _fd)") + "print('ran')"
    result = pool.run(code, session=name, timeout=_FAR)
    _raised(result, "OSError")
    assert "control channel (descriptor 5)" in result["error"]["message"], result
    assert result["stdout"] == "ran\n", result
    again = pool.run("print('kept' in globals())", session=name, timeout=_FAR)
    assert again["stdout"] == "False\n", again  # a new process: the session ended with the step
    pool.run(session=name, close=True)


# -- what the report is made with ----------------------------------------------------------------------------------

# Each replaces something the child's report is made or sent with, then raises (or not): before, each ended the
# job with exit 125 and no error.
BREAKAGES = [
    "import msgspec\nmsgspec.json.encode = None",
    "import sys\nsys.modules.pop('msgspec')",
    "import os\nos.write = None",
    "import os\nos.closerange = None",
    "import os\nos.kill = os._exit = None",
    "import signal\nsignal.SIGSTOP = None",
    "import builtins\nbuiltins.isinstance = None",
    "import builtins\nbuiltins.len = None",
    "import builtins\nbuiltins.type = None",
    "import builtins\nbuiltins.BaseException = None",
    "import traceback\ntraceback.walk_tb = traceback.extract_tb = None",
    "import linecache\nlinecache.getline = None",
    "import sys\nsys.modules['pynox.job.execute'].Report = None",
]


@pytest.mark.parametrize("breakage", BREAKAGES)
def test_code_that_replaces_what_its_report_is_made_with_gets_an_honest_result(pool: PoolProcess,
                                                                                breakage: str) -> None:
    ran = pool.run(f"{breakage}\nprint('ran')", timeout=_FAR)
    assert ran["stdout"] == "ran\n", ran
    assert ran["exit"] in (0, 1) and (ran["exit"] == 0) == (ran["error"] is None), ran
    raised = pool.run(f"{breakage}\n1 / 0", timeout=_FAR)
    assert raised["exit"] == 1 and raised["error"] is not None, raised
    # Its own error, described (or, where describing it was broken, named with a message that says so); or, where
    # the report itself could not be made, the error that broke it.
    assert raised["error"]["type"] in ("ZeroDivisionError", "TypeError"), raised
    if raised["error"]["type"] == "TypeError":
        assert "could not report how the code ended" in raised["error"]["message"], raised


def test_a_session_step_that_replaces_builtins_keeps_its_session(pool: PoolProcess) -> None:
    name = new_id("builtins")
    assert pool.run("kept = 'yes'", session=name)["exit"] == 0
    result = pool.run("import builtins\nbuiltins.BaseException = None\n1 / 0", session=name, timeout=_FAR)
    _raised(result, "ZeroDivisionError")
    assert result["session_ended"] is False, result
    pool.run(session=name, close=True)


def test_a_first_session_step_that_replaces_what_its_end_uses_keeps_its_session(pool: PoolProcess) -> None:
    """The first step's end quiets its display channel and copies its pipes after the step's code ran: with the
    module's own names, looked up then (``os.open``), the next step found the session's process gone (exit 125)."""
    name = new_id("first-end")
    first = pool.run("import os\nos.open = None\nkept = 'yes'", session=name, timeout=_FAR)
    assert (first["exit"], first["error"], first["session_ended"]) == (0, None, False), first
    after = pool.run("print(kept)", session=name, timeout=_FAR)
    assert (after["exit"], after["stdout"], after["session_ended"], after["step"]) == (0, "yes\n", False, 2), after
    pool.run(session=name, close=True)


# -- a deep chain of exceptions ------------------------------------------------------------------------------------

_CHAIN = ("e = ValueError(0)\nfor i in range({n}):\n    try:\n        raise e\n    except ValueError:\n"
          "        try:\n            raise ValueError(i)\n        except ValueError as x:\n            e = x\nraise e")


def test_a_deep_chain_of_exceptions_is_printed_bounded(pool: PoolProcess) -> None:
    """Python prints every exception of a chain: 10,000 of them made a traceback of megabytes, which the pool
    then searched in quadratic time for where it begins."""
    result = pool.run(_CHAIN.format(n=10_000), timeout=_FAR)
    _raised(result, "ValueError")
    assert result["error"]["message"] == "9999", result
    assert len(result["stderr"]) < 64 << 10 and not result["stderr_truncated"], len(result["stderr"])
    assert result["stderr"].startswith("... (9937 earlier exceptions of this chain are not shown)\n"), \
        result["stderr"][:200]
    assert result["stderr"].rstrip().endswith("ValueError: 9999"), result["stderr"][-200:]
    # Control: a short chain is printed whole, as Python prints it.
    short = pool.run(_CHAIN.format(n=3), timeout=_FAR)
    assert short["stderr"].count("During handling of the above exception") == 3, short["stderr"]
    assert short["traceback_at"] == 0, short
