"""smolagents' own executor and agent arguments mean for ``PynoxExecutor`` what they mean for its other executors,
a saved ``PynoxCodeAgent`` reloads and runs from its own ``app.py``, and one session tool given to two agents
keeps a session per agent (issue 32, rows 8, 9, 11 and the shared-tool note).

Each test goes through smolagents' real code path (``CodeAgent.run``, ``save``, the saved ``app.py``) with a
scripted model, on a real pool.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from smolagents import CodeAgent, ToolCallingAgent
from smolagents.local_python_executor import InterpreterError

import pynox
from pynox_smolagents import PynoxCodeAgent, PynoxExecutor, python_tool
from tests.adapters.test_smolagents import QUIET, ROOT, ScriptedModel, action_steps
from tests.harness.fixtures import shared_pool

pytestmark = pytest.mark.timeout(120)


pool = shared_pool(workers=1)


def test_the_agents_print_cap_reaches_an_executor_it_was_given(pool: pynox.Pool) -> None:
    model = ScriptedModel(["print('x' * 5000)", "final_answer('done')"])
    agent = CodeAgent(tools=[], model=model, executor=PynoxExecutor(pool), max_print_outputs_length=50,
                      verbosity_level=QUIET)
    with agent:
        assert agent.run("print a lot") == "done"
    observed = action_steps(agent)[0].observations or ""
    assert "x" * 51 not in observed and "truncated to stay below 50 characters" in observed
    with pytest.raises(ValueError, match="max_print_outputs_length=50 and its PynoxExecutor's 80 differ"):
        CodeAgent(tools=[], model=model, executor=PynoxExecutor(pool, max_print_outputs_length=80),
                  max_print_outputs_length=50)


def test_timeout_seconds_is_the_steps_time_limit(pool: pynox.Pool) -> None:
    executor = PynoxExecutor(pool, timeout_seconds=1)
    assert any(line.startswith("Limits per call: 1s of time") for line in executor.permissions.permissions)
    started = time.monotonic()
    with CodeAgent(tools=[], model=ScriptedModel(["import time\ntime.sleep(20)", "final_answer('over')"]),
                   executor=executor, verbosity_level=QUIET) as agent:
        assert agent.run("sleep") == "over"
    assert time.monotonic() - started < 15
    assert "TimeoutError" in str(action_steps(agent)[0].error)
    with pytest.raises(ValueError, match="without a time limit"):
        PynoxExecutor(pool, timeout_seconds=None)
    with pytest.raises(ValueError, match="not both"):
        PynoxExecutor(pool, timeout_seconds=3, timeout="3s")


def test_additional_authorized_imports_are_checked_and_importable(pool: pynox.Pool) -> None:
    with pytest.raises(InterpreterError, match="Non-installed authorized modules: no_such_module_41"):
        PynoxExecutor(pool, additional_authorized_imports=["no_such_module_41"])
    model = ScriptedModel(["import pandas\nprint(pandas.__name__)", "final_answer('ok')"])
    with PynoxCodeAgent(tools=[], model=model, additional_authorized_imports=["pandas"], verbosity_level=QUIET,
                        executor_kwargs={"pool": pool}) as agent:
        assert agent.pynox_executor.additional_authorized_imports == ["pandas"]
        assert agent.run("import") == "ok"
    assert "pandas" in (action_steps(agent)[0].observations or "")


# The saved folder's own app.py, run as a Space runs it: imported, its agent built and run (no UI started).
RUN_THE_APP = """
import json, sys
sys.path.insert(0, sys.argv[1])
from tests.adapters import test_smolagents_saving as saving

import smolagents


class ReloadedModel(saving.ReloadedModel):
    # What app.py builds from the model settings it saved (a real model class lives in smolagents).

    def __init__(self, **settings):
        super().__init__([f"print(open({sys.argv[2]!r}).read())", "final_answer('read')"])


smolagents.ReloadedModel = ReloadedModel
import app
agent = app.agent
answer = agent.run("read")
print(json.dumps({"class": type(agent).__name__, "executor": type(agent.python_executor).__name__,
                  "answer": answer, "seen": str(saving.action_steps(agent)[0].observations)}))
"""


def test_a_saved_agent_names_its_requirements_and_its_app_runs_confined(tmp_path: Path) -> None:
    from tests.adapters.test_smolagents_saving import ReloadedModel

    data = tmp_path / "data"
    data.mkdir()
    (data / "orders.csv").write_text("lamp,25\n")
    agent = PynoxCodeAgent(tools=[], model=ReloadedModel([]), verbosity_level=QUIET,
                           executor_kwargs={"allow_read": [str(data)], "timeout": "20s"})
    agent.save(tmp_path / "saved")
    requirements = (tmp_path / "saved" / "requirements.txt").read_text().split()
    assert "pynox-smolagents" in requirements
    app = (tmp_path / "saved" / "app.py").read_text()
    assert "from pynox_smolagents import PynoxCodeAgent" in app
    done = subprocess.run([sys.executable, "-c", RUN_THE_APP, str(tmp_path / "saved"), str(data / "orders.csv")],
                          cwd=ROOT, capture_output=True, text=True, timeout=100, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    ran = json.loads(done.stdout.splitlines()[-1])
    assert ran == {"class": "PynoxCodeAgent", "executor": "PynoxExecutor", "answer": "read",
                   "seen": ran["seen"]} and "lamp,25" in ran["seen"]


def test_a_plain_code_agent_with_a_pynox_executor_saves_its_requirement(pool: pynox.Pool, tmp_path: Path) -> None:
    from tests.adapters.test_smolagents_saving import ReloadedModel

    CodeAgent(tools=[], model=ReloadedModel([]), executor=PynoxExecutor(pool), verbosity_level=QUIET).save(
        tmp_path / "saved")
    assert "pynox-smolagents" in (tmp_path / "saved" / "requirements.txt").read_text().split()


def test_one_session_tool_given_to_two_agents_keeps_a_session_per_agent(pool: pynox.Pool) -> None:
    def run(code: str) -> dict[str, object]:
        return {"name": "run_python", "args": {"code": code}}

    shared = python_tool(pool, session=True)
    assert "Calls share one Python process of this agent" in shared.description
    answer = {"name": "final_answer", "args": {"answer": "done"}}
    alice = ToolCallingAgent(tools=[shared], model=ScriptedModel([run("secret = 'alice-token'"), run("print(secret)"),
                                                                  answer]), verbosity_level=QUIET)
    bob = ToolCallingAgent(tools=[shared], model=ScriptedModel([run("print(secret)"), answer]),
                           verbosity_level=QUIET)
    alice.run("go")
    bob.run("go")
    assert action_steps(alice)[1].observations == "alice-token"  # the control: one agent's calls share state
    assert "NameError: name 'secret' is not defined" in str(action_steps(bob)[0].error)
    for agent in (alice, bob):
        agent.tools["run_python"].code_tool.close()
