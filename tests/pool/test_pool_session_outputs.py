"""A session step's outputs: the step is over at its report, whatever still holds its stdout, stderr or report."""

from __future__ import annotations

from typing import Any

import pytest

from tests.harness.job_code import each_copy_of

from .pool_driver import PoolProcess, new_id

pytestmark = pytest.mark.timeout(120)

# Code that keeps a copy of its stdout past its end: each once held the step open until its deadline.
_KEEPS = {
    "a copy of descriptor 1": "import os\nkeep = os.dup(1)\nprint('a')",
    "stdout on a copy": "import os, sys\nsys.stdout = os.fdopen(os.dup(1), 'w')\nprint('a', flush=True)",
    "a copy of every output": "import os\nkeep = [os.dup(fd) for fd in (1, 2, 3)]\nprint('a')",
}


def _ok(result: dict[str, Any]) -> dict[str, Any]:
    assert result["exit"] == 0 and result["error"] is None, result
    assert result["session_ended"] is False, result
    return result


@pytest.mark.parametrize("first", [True, False], ids=["first step", "later step"])
@pytest.mark.parametrize("code", list(_KEEPS.values()), ids=list(_KEEPS))
def test_a_step_that_keeps_a_copy_of_its_outputs_ends_at_its_report(pool: PoolProcess, code: str,
                                                                    first: bool) -> None:
    """Its code is over at once: its result comes then, not as a TimeoutError at its deadline, and the session
    goes on."""
    name = new_id("keeps")
    try:
        if not first:
            _ok(pool.run("x = 1", session=name))
        kept = _ok(pool.run(code, session=name, timeout="8s"))
        assert kept["stdout"] == "a\n", kept
        assert _ok(pool.run("import os\nos.write(1, b'next\\n')", session=name))["stdout"] == "next\n"
    finally:
        pool.run(session=name, close=True)


def test_a_step_whose_stdout_is_a_copy_writes_there_in_later_steps(pool: PoolProcess) -> None:
    """The session's pipes are its own for its life: ``sys.stdout`` put on a copy of descriptor 1 by one step
    still reaches the pool in the steps after it (it was written into a pipe nobody read, and lost)."""
    name = new_id("stdout-copy")
    try:
        _ok(pool.run("import os, sys\nsys.stdout = os.fdopen(os.dup(1), 'w')", session=name))
        for word in ("b", "c"):
            assert _ok(pool.run(f"print({word!r})", session=name))["stdout"] == f"{word}\n"
    finally:
        pool.run(session=name, close=True)


# A thread that writes numbered lines on a copy of stdout and shows numbered bundles, across the ends of the
# steps it runs in, until the event is set; then the steps join it.
_WRITER = ("import os, threading, time\nout = os.fdopen(os.dup(1), 'w', buffering=1)\nstop = threading.Event()\n"
           "def write():\n    n = 0\n    while not stop.is_set():\n        n += 1\n"
           "        print(f'line {n}', file=out)\n        display({'text/plain': f'shown {n}'}, raw=True)\n"
           "        time.sleep(0.001)\n    print(f'last {n}', file=out)\n"
           "writer = threading.Thread(target=write)\nwriter.start()\ntime.sleep(0.02)")


def test_what_a_thread_writes_after_its_step_ends_is_read_with_the_next_step_never_lost(pool: PoolProcess) -> None:
    """ipykernel's rule: output goes to the step running when the pool reads it. A thread a step left running
    writes on across the steps' ends (between steps the process is stopped): every line and every bundle it
    wrote reaches exactly one step's result, in order, none lost, none twice."""
    name = new_id("leftover")
    try:
        results = [_ok(pool.run(_WRITER, session=name, max_output=8 << 20))]
        results += [_ok(pool.run("time.sleep(0.03)", session=name, max_output=8 << 20)) for _ in range(8)]
        results.append(_ok(pool.run("stop.set()\nwriter.join()", session=name, max_output=8 << 20)))
        lines = "".join(result["stdout"] for result in results).splitlines()
        shown = [output["data"]["text/plain"] for result in results for output in result.get("outputs", [])]
        last = int(lines[-1].removeprefix("last "))
        assert lines == [f"line {n}" for n in range(1, last + 1)] + [f"last {last}"], lines
        assert shown == [f"shown {n}" for n in range(1, last + 1)], shown
        assert sum(1 for result in results[1:-1] if result["stdout"]) >= 4, "the thread wrote in the later steps"
    finally:
        pool.run(session=name, close=True)


@pytest.mark.parametrize("code", [
    "import os\nos.close(1)",
    "import os\nos.dup2(os.open('/dev/null', os.O_WRONLY), 1)\nos.dup2(os.open('/dev/null', os.O_WRONLY), 2)",
    "import os\nos.close(3)\nos.close(2)",
], ids=["closes stdout", "replaces stdout and stderr", "closes the report and stderr"])
def test_a_step_that_closes_or_replaces_its_outputs_leaves_the_next_step_its_own(pool: PoolProcess,
                                                                                 code: str) -> None:
    name = new_id("outputs")
    try:
        _ok(pool.run("x = 1", session=name))
        _ok(pool.run(code, session=name))
        after = _ok(pool.run("import sys\nprint(x)\nprint('e', file=sys.stderr)\ndisplay('d')", session=name))
        assert (after["stdout"], after["stderr"]) == ("1\n", "e\n"), after
        assert [output["data"]["text/plain"] for output in after.get("outputs", [])] == ["'d'"], after
    finally:
        pool.run(session=name, close=True)


@pytest.mark.parametrize("code", [
    "import os\nos.closerange(16, 4096)",
    each_copy_of(1, "_os.close(_fd)"),
    each_copy_of(2, "_os.close(_fd)") + "_os.dup2(_os.open('/dev/null', _os.O_WRONLY), 1)",
], ids=["the session's copies", "every copy of stdout", "every copy of stderr, and stdout replaced"])
def test_a_step_that_closes_every_copy_of_an_output_leaves_the_next_step_its_own(pool: PoolProcess,
                                                                                code: str) -> None:
    """The session's copies above 15 made again from 1, 2 and 3; a pipe closed everywhere (its end read by the
    pool) replaced by a new one, which the next step's frame brings."""
    name = new_id("copies")
    try:
        _ok(pool.run("x = 1", session=name))
        _ok(pool.run(code, session=name))
        for _ in range(2):
            after = _ok(pool.run("import sys\nprint(x)\nprint('e', file=sys.stderr)", session=name))
            assert (after["stdout"], after["stderr"]) == ("1\n", "e\n"), after
    finally:
        pool.run(session=name, close=True)


def test_a_step_that_closes_every_copy_of_its_report_ends_the_session_saying_so(pool: PoolProcess) -> None:
    name = new_id("no-report")
    try:
        _ok(pool.run("x = 1", session=name))
        ended = pool.run(each_copy_of(3, "_os.close(_fd)"), session=name)
        assert (ended["error"]["type"], ended["session_ended"]) == ("PoolWorkerError", True), ended
        assert "closed or replaced the step's report descriptor (3)" in ended["error"]["message"], ended
        assert pool.run("print(x)", session=name)["error"]["type"] == "NameError"
    finally:
        pool.run(session=name, close=True)


def test_a_report_forged_with_the_steps_own_number_ends_the_session_at_the_next_step(pool: PoolProcess) -> None:
    """The code may write a report of its own on descriptor 3, with the step's number: the step is answered from
    it (the job's own word), and the step's real report, which comes after, is none the next step can take: the
    session ends then, as for a broken channel, and no step is answered with another's report."""
    name = new_id("forged")
    try:
        _ok(pool.run("x = 1", session=name))
        forged = pool.run("import os, struct\nbody = b'{\"exit\": 0}'\n"
                          "os.write(3, struct.pack('!III', 0xFFFFFFFF, 2, len(body)) + body)\n"
                          "import time\ntime.sleep(0.2)\nprint('real')", session=name)
        assert forged["step"] == 2 and forged["exit"] == 0, forged
        after = pool.run("print('next')", session=name)
        assert after["error"]["type"] == "PoolWorkerError" and after["session_ended"] is True, after
    finally:
        pool.run(session=name, close=True)


def test_what_a_leftover_thread_floods_counts_against_the_step_that_reads_it(pool: PoolProcess) -> None:
    """A thread's flood after its step ended is the next step's output: cut at that step's max_output, said
    truncated, every byte counted in its usage, and the step after it starts clean."""
    name = new_id("flood")
    try:
        _ok(pool.run("import os, threading, time\nout = os.dup(1)\n"
                     "def flood():\n    time.sleep(0.2)\n    os.write(out, b'x' * 300_000)\n"
                     "flooder = threading.Thread(target=flood)\nflooder.start()", session=name))
        flooded = _ok(pool.run("flooder.join()", session=name, max_output="64k"))
        assert flooded["stdout_truncated"] is True and len(flooded["stdout"]) == 64 << 10, flooded["usage"]
        assert flooded["usage"]["stdout_bytes"] == 300_000, flooded["usage"]
        clean = _ok(pool.run("print('clean')", session=name))
        assert (clean["stdout"], clean["stdout_truncated"]) == ("clean\n", False), clean
    finally:
        pool.run(session=name, close=True)
