"""Every example runs as a user would run it, and prints what its docstring promises."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def run_example(name: str) -> str:
    done = subprocess.run([sys.executable, str(EXAMPLES / name)], capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_agent_tool() -> None:
    out = run_example("agent_tool.py")
    assert out.startswith("Run Python code in an isolated sandbox")
    assert "Write files: /tmp/pynox-agent-" in out  # its own fresh directory, nothing else
    assert "Hello from an agent tool ['agent.py']" in out
    assert "PermissionError: [Errno 13] Permission denied: '/etc/passwd' (agent.py:1)" in out
    assert 'allow_read=["/etc/passwd"]' in out
    assert "root:x:0:0" not in out


def test_notebook_session() -> None:
    lines = run_example("notebook_session.py").splitlines()
    assert "3 orders, total 50.75" in lines
    assert any(line.startswith("NameError: name 'undefined_name'") for line in lines)
    assert "still here: 50.75" in lines
    assert any(line.startswith("TimeoutError") for line in lines)
    assert lines[-1] == "False"


def test_codeact() -> None:
    out = run_example("codeact.py")
    assert "2 products: lamp, lamp shade; total 37.00 EUR" in out
    assert "host said: no product named 'sofa'" in out


# docs/use-cases.md shows what each of its examples printed: the example is run, and the transcript must be
# its output to the character (the models are scripted, so the output is fixed; nothing in it is invented).
USE_CASES = EXAMPLES.parent / "docs" / "use-cases.md"
_OUTPUT_OF = re.compile(r"^<!-- output-of: (?P<example>examples/\S+) -->\n```text\n(?P<body>.*?)^```$",
                        re.MULTILINE | re.DOTALL)
TRANSCRIPTS = {match.group("example"): match.group("body") for match in _OUTPUT_OF.finditer(USE_CASES.read_text())}


def test_the_use_cases_guide_shows_five_agents_and_a_notebook() -> None:
    assert sorted(TRANSCRIPTS) == ["examples/analyst_agent.py", "examples/codeact_agent.py",
                                   "examples/mcp_notebook.py", "examples/monty_agent.py",
                                   "examples/packages_agent.py", "examples/untrusted_notebook.py"]


@pytest.mark.parametrize("example", sorted(TRANSCRIPTS))
def test_a_use_case_prints_its_transcript(example: str) -> None:
    assert run_example(example.removeprefix("examples/")) == TRANSCRIPTS[example]
