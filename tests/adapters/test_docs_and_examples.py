"""The spec's framework lines, the adapters' READMEs, docs/integrations.md and the examples, run as a user would.

Each runs in a fresh interpreter (so the default pool starts and closes as in
an application) in a directory holding ``data/orders.csv`` and a ``pynox.toml``
with an ``analysis`` profile. Where a real model would go, the scripted models
of ``scripted.py`` stand in. After each, no Pynox process may be left: this
process is a subreaper, so even an orphaned one would be seen.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from .procs import wait_for_none

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
CODE = "import csv\nprint(len(list(csv.DictReader(open('data/orders.csv')))), 'orders')"
MODELS = {
    "pydantic-ai": f"model = pydantic_model([(PYTHON, {{'code': {CODE!r}}})], echo=True)",
    "strands": f"model = ScriptedStrandsModel([(PYTHON, {{'code': {CODE!r}}})], echo=True)",
}
PRELUDE = "from scripted import PYTHON, ScriptedStrandsModel, pydantic_model\n"

# The spec's lines ("Registering with a framework"), exactly, and how the model is put in.
SPEC_PYDANTIC_AI = ('from pydantic_ai import Agent\nimport pynox\n\n'
                    'agent = Agent("anthropic:claude-sonnet-4-5", tools=[pynox.tool(profile="analysis")])\n')
SPEC_STRANDS = ('from strands import Agent, tool\nimport pynox\n\n'
                'agent = Agent(tools=[tool(pynox.tool(profile="analysis"))])\n')


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "orders.csv").write_text("product,quantity\nlamp,2\ndesk,1\nlamp,4\n")
    (tmp_path / "pynox.toml").write_text('[profiles.analysis]\nallow_read = ["data"]\ntimeout = "10s"\n')
    return tmp_path


def run_script(source: str | Path, cwd: Path, earlier_pools: frozenset[int]) -> str:
    """Run Python source (or a file) in ``cwd``, with ``scripted`` importable; return what it printed."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))}
    argv = [str(source)] if isinstance(source, Path) else ["-c", source]
    done = subprocess.run([sys.executable, *argv], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=90, check=False)
    assert done.returncode == 0, done.stderr
    wait_for_none(earlier_pools)
    return done.stdout


def python_blocks(markdown: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", markdown, re.DOTALL)


def section(markdown: str, heading: str) -> str:
    start = markdown.index(f"\n## {heading}\n")
    end = markdown.find("\n## ", start + 1)
    return markdown[start : end if end >= 0 else None]


def spec_cases() -> list[tuple[str, str, str]]:
    """(id, framework, script) for each spec line, with the profile, and with grants instead of it."""
    pydantic_ai = SPEC_PYDANTIC_AI.replace('"anthropic:claude-sonnet-4-5"', "model")
    strands = SPEC_STRANDS.replace("Agent(tools=", "Agent(model=model, callback_handler=None, tools=")
    cases = []
    for name, framework, script, run in [("pydantic-ai", "pydantic-ai", pydantic_ai, "agent.run_sync('go').output"),
                                         ("strands", "strands", strands, "agent('go')")]:
        assert script != (SPEC_PYDANTIC_AI if framework == "pydantic-ai" else SPEC_STRANDS)  # the model went in
        body = f"{PRELUDE}{MODELS[framework]}\n{script}print({run})\n"
        cases.append((f"{name}-profile", framework, body))
        cases.append((f"{name}-grants", framework, body.replace('profile="analysis"', 'allow_read=["data"]')))
    return cases


@pytest.mark.parametrize(("framework", "script"), [
    pytest.param(framework, script, id=case_id) for case_id, framework, script in spec_cases()])
def test_the_specs_framework_line_runs(framework: str, script: str, workdir: Path,
                                       earlier_pools: frozenset[int]) -> None:
    out = run_script(script, workdir, earlier_pools)
    assert "Done. 3 orders" in out, out


@pytest.mark.parametrize(("heading", "framework"), [("Pydantic AI", "pydantic-ai"), ("Strands Agents", "strands")])
def test_integrations_doc_blocks_run(heading: str, framework: str, workdir: Path,
                                     earlier_pools: frozenset[int]) -> None:
    blocks = python_blocks(section((ROOT / "docs" / "integrations.md").read_text(), heading))
    assert blocks
    for block in blocks:
        out = run_script(f"{PRELUDE}{MODELS[framework]}\n{block}", workdir, earlier_pools)
        assert "3 orders" in out, (block, out)


@pytest.mark.parametrize("package", ["pynox-pydantic-ai", "pynox-strands"])
def test_readme_example_runs_offline(package: str, tmp_path: Path, earlier_pools: frozenset[int]) -> None:
    [block] = python_blocks((ROOT / "packages" / package / "README.md").read_text())
    out = run_script(block, tmp_path, earlier_pools)
    assert "The sum is 45." in out


def test_pydantic_ai_example(tmp_path: Path, earlier_pools: frozenset[int]) -> None:
    out = run_script(ROOT / "examples" / "pydantic_ai_agent.py", tmp_path, earlier_pools)
    assert "You can run Python code with the `run_python` tool." in out
    assert "- catalog_price(product: str) -> float: The unit price of a product, in euros, for this customer." in out
    assert "--- run_python returned (success):\n3 orders\n" in out
    assert "total 369.00 EUR\n" in out  # the run context's 10 % reached the host function
    assert "--- run_python returned (failed):\nPermissionError: [Errno 13] Permission denied: '/etc/shadow'" in out
    assert 'allow_read=["/etc/shadow"]' in out
    assert "--- the application reads: exit 0, stdout '3 orders\\n'" in out
    assert "--- answer: 3 orders, 369.00 EUR in total; /etc/shadow is not mine to read.\n" in out
    assert "--- code mode tools: run_code\n" in out
    assert out.rstrip().endswith("--- code mode answer: In Celsius: {'Paris': 20.0, 'Tokyo': 25.0}")


def test_strands_example(tmp_path: Path, earlier_pools: frozenset[int]) -> None:
    out = run_script(ROOT / "examples" / "strands_agent.py", tmp_path, earlier_pools)
    assert "--- returned:\n285\n" in out
    assert '{"output": "", "error": "", "exit_code": 0}' in out
    assert "Permission denied: '/etc/hostname' (agent.py:1)" in out
    assert "PynoxSandbox cannot run shell commands" in out
    assert out.rstrip().endswith("--- the host reads: 42 rows")
