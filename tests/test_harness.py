"""The tests' own layout: one harness owns the reading of ``/proc`` (tests/harness/__init__.py says what it holds).

A test module states its case and its control and borrows the rest. Here the rule is read from the source,
as tests/test_layout.py reads the core's: a path into ``/proc`` that the test process itself opens is a
string (or f-string) that starts with ``/proc/``; the code a test hands to a job mentions ``/proc`` inside a
larger string, which is the job's reading, not the test's.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness import fd_audit

pytestmark = pytest.mark.pure

TESTS = Path(__file__).resolve().parent
# The harness's modules: the one reader, the pool driver and leftover guard, the sandbox suite's harness.
HARNESS = {TESTS / "harness" / "procfs.py", TESTS / "pool" / "pool_driver.py", TESTS / "sandbox" / "harness.py",
           Path(__file__).resolve()}  # and this rule, which names the prefix it looks for


def _proc_paths(source: str, filename: str) -> list[int]:
    """The lines of ``source`` where a string or f-string starts with ``/proc/``."""
    lines = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.JoinedStr):
            first = node.values[0] if node.values else None
            text = first.value if isinstance(first, ast.Constant) and isinstance(first.value, str) else ""
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value
        else:
            continue
        if text.startswith("/proc/"):
            lines.append(node.lineno)
    return sorted(set(lines))


def test_no_test_reads_proc_outside_the_harness() -> None:
    found = {str(path.relative_to(TESTS)): lines for path in sorted(TESTS.rglob("*.py")) if path not in HARNESS
             if (lines := _proc_paths(path.read_text(), str(path)))}
    assert not found, f"read /proc through tests.harness.procfs: {found}"


def test_the_rule_sees_a_test_reading_proc_and_not_a_job_doing_it() -> None:
    # Control: the reads a test used to write are seen; a job's code that reads /proc is not the test's.
    assert _proc_paths('open(f"/proc/{pid}/stat")\nos.listdir("/proc/self/fd")\n', "t.py") == [1, 2]
    assert _proc_paths("run(\"print(open('/proc/self/status').read())\")\n", "t.py") == []


# -- the descriptor audit (tests/harness/fd_audit), the control of every test that asserts it reported nothing ------
_BAD_CLOSES = """
import os, socket
read, write = os.pipe()
os.close(write)
try:
    os.close(write)  # closed twice
except OSError:
    pass
held = socket.socket()
os.close(held.fileno())  # a raw close under a live socket
held.detach()
socket.socket()  # collected open
"""


@pytest.mark.parametrize("argv", [["pynox", "pool"], ["other"]], ids=["a pool", "another process"])
def test_the_descriptor_audit_reports_each_bad_close_of_a_pool_and_only_a_pools(tmp_path: Path,
                                                                              argv: list[str]) -> None:
    run = subprocess.run([sys.executable, "-c", _BAD_CLOSES, *argv], env=fd_audit.audited(tmp_path), timeout=60,
                         capture_output=True, check=False)
    assert run.returncode == 0, run.stderr
    found = [report.splitlines()[0] for report in fd_audit.reports(tmp_path)]
    if argv[0] != "pynox":
        assert fd_audit.audited_pids(tmp_path) == [] and found == []
        return
    assert len(fd_audit.audited_pids(tmp_path)) == 1
    kinds = [line.split(": fd")[0] for line in found]
    assert kinds == ["=== closed twice (EBADF: not open)", "=== raw close of a socket's number",
                     "=== socket finalized open"], found
