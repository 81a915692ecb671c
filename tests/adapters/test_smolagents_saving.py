"""Saving and loading smolagents agents and tools that run code in Pynox: never back to an unconfined executor.

smolagents saves an agent as a folder (``agent.json``, the tools' code) and loads it with ``from_folder``;
the saved ``executor_type`` picks the executor. Each test saves through smolagents' own ``save``, loads
through its own ``from_folder`` / ``Tool.from_code``, runs the loaded agent's code, and checks from the host
that a file outside the grant was not read (with the granted file read, as the control).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from smolagents import CodeAgent, Tool, ToolCallingAgent
from smolagents.local_python_executor import LocalPythonExecutor
from smolagents.models import MODEL_REGISTRY

import pynox
from pynox_smolagents import PynoxCodeAgent, PynoxExecutor, PynoxTool, python_tool
from tests.adapters.test_smolagents import QUIET, ROOT, ScriptedModel, action_steps
from tests.harness.fixtures import shared_pool

pytestmark = pytest.mark.timeout(90)

SECRET = "s3cret-token-41"
NEXT_REPLIES: list[list[Any]] = []


class ReloadedModel(ScriptedModel):
    """A scripted model smolagents can save and load (by class name, from its model registry)."""

    @classmethod
    def from_dict(cls, model_dictionary: dict[str, Any]) -> ReloadedModel:
        return cls(NEXT_REPLIES.pop(0))


@pytest.fixture(autouse=True)
def registered_model(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(MODEL_REGISTRY, ReloadedModel.__name__, ReloadedModel)


pool = shared_pool(workers=1)


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    """A granted data directory with one file, and a secret file beside it, outside the grant."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "orders.csv").write_text("lamp,25\n")
    secret = tmp_path / "secret.txt"
    secret.write_text(SECRET)
    return data, secret


def reading(data: Path, secret: Path) -> list[Any]:
    """Two steps: read the granted file (the control), then the secret; then answer."""
    return [f"print(open({str(data / 'orders.csv')!r}).read())",
            f"print(open({str(secret)!r}).read())",
            "final_answer('read')"]


def assert_confined(agent: Any) -> None:
    steps = action_steps(agent)
    assert "lamp,25" in (steps[0].observations or ""), "the control: the granted file is readable"
    assert steps[1].error is not None and "PermissionError" in str(steps[1].error)
    everything = json.dumps([str(step.observations) + str(step.error) for step in steps])
    assert SECRET not in everything


def test_local_executor_reads_the_secret_when_unconfined(files: tuple[Path, Path], tmp_path: Path) -> None:
    """The harm the guards prevent: a loaded agent on smolagents' local executor reads what it likes."""
    _, secret = files
    agent = CodeAgent(tools=[], model=ReloadedModel([]), additional_authorized_imports=["*"], verbosity_level=QUIET)
    agent.save(tmp_path / "saved")
    # (smolagents' local executor has no open(); with every import authorized, pathlib reads as well.)
    NEXT_REPLIES.append([f"import pathlib\nprint(pathlib.Path({str(secret)!r}).read_text())", "final_answer('read')"])
    loaded = CodeAgent.from_folder(tmp_path / "saved", verbosity_level=QUIET)
    assert isinstance(loaded.python_executor, LocalPythonExecutor)
    loaded.run("read the secret")
    assert SECRET in (action_steps(loaded)[0].observations or "")


def test_a_plain_code_agent_with_a_pynox_executor_never_reloads_local(
        pool: pynox.Pool, files: tuple[Path, Path], tmp_path: Path) -> None:
    data, secret = files
    agent = CodeAgent(tools=[], model=ReloadedModel([]), verbosity_level=QUIET,
                      executor=PynoxExecutor(pool, allow_read=[data], timeout="5s"))
    agent.save(tmp_path / "saved")
    saved = json.loads((tmp_path / "saved" / "agent.json").read_text())
    assert saved["executor_type"] == "pynox"
    assert saved["executor_kwargs"] == {"allow_read": [str(data)], "timeout": "5s"}
    # smolagents' own loader refuses it, loudly, rather than running it in its local executor...
    NEXT_REPLIES.append([])
    with pytest.raises(ValueError, match="Unsupported executor type: pynox"):
        CodeAgent.from_folder(tmp_path / "saved")
    # ...and PynoxCodeAgent loads it confined, with the grants it was saved with.
    NEXT_REPLIES.append(reading(data, secret))
    loaded = PynoxCodeAgent.from_folder(tmp_path / "saved", executor_kwargs={"pool": pool}, verbosity_level=QUIET)
    with loaded:
        assert isinstance(loaded.python_executor, PynoxExecutor)
        assert loaded.run("read both") == "read"
        assert_confined(loaded)


def test_a_pynox_code_agent_round_trips_with_its_tools_and_limits(
        pool: pynox.Pool, files: tuple[Path, Path], tmp_path: Path) -> None:
    data, secret = files
    agent = PynoxCodeAgent(tools=[], model=ReloadedModel([]), max_print_outputs_length=200, verbosity_level=QUIET,
                           executor_kwargs={"pool": pool, "allow_read": [str(data)], "memory": "256m"})
    agent.save(tmp_path / "saved")
    saved = json.loads((tmp_path / "saved" / "agent.json").read_text())
    assert saved["class"] == "PynoxCodeAgent" and saved["executor_type"] == "pynox"
    assert saved["executor_kwargs"] == {"allow_read": [str(data)], "memory": "256m",
                                        "max_print_outputs_length": 200}
    NEXT_REPLIES.append([*reading(data, secret)[:2], "print('x' * 1000)", "final_answer('read')"])
    with PynoxCodeAgent.from_folder(tmp_path / "saved", executor_kwargs={"pool": pool},
                                    verbosity_level=QUIET) as loaded:
        assert loaded.run("read both") == "read"
        assert_confined(loaded)
        assert loaded.pynox_executor.grants["memory"] == "256m"
        assert "truncated to stay below 200 characters" in (action_steps(loaded)[2].observations or "")


def test_an_agent_saved_with_the_local_executor_loads_confined_as_a_pynox_code_agent(
        pool: pynox.Pool, files: tuple[Path, Path], tmp_path: Path) -> None:
    data, secret = files
    CodeAgent(tools=[], model=ReloadedModel([]), verbosity_level=QUIET).save(tmp_path / "saved")
    NEXT_REPLIES.append(reading(data, secret)[1:])
    with PynoxCodeAgent.from_folder(tmp_path / "saved", executor_kwargs={"pool": pool},
                                    verbosity_level=QUIET) as loaded:
        loaded.run("read the secret")
        step = action_steps(loaded)[0]
    assert "PermissionError" in str(step.error) and SECRET not in str(step.error) + str(step.observations)


def test_what_cannot_be_saved_raises_at_save(pool: pynox.Pool, tmp_path: Path) -> None:
    with_functions = CodeAgent(tools=[], model=ReloadedModel([]), verbosity_level=QUIET,
                               executor=PynoxExecutor(pool, functions={"lookup": len}))
    with pytest.raises(ValueError, match=r"functions=\.\.\.\) cannot be saved: lookup are code"):
        with_functions.save(tmp_path / "a")
    with_env = PynoxCodeAgent(tools=[], model=ReloadedModel([]), verbosity_level=QUIET,
                              executor_kwargs={"pool": pool, "env": {"TOKEN": "t"}})
    with pytest.raises(ValueError, match="env is not saved"):
        with_env.save(tmp_path / "b")
    with pytest.raises(ValueError, match="executor_type must be 'pynox', not 'local'"):
        PynoxCodeAgent(tools=[], model=ReloadedModel([]), executor_type="local")


def test_the_system_prompt_states_the_sandbox_not_an_import_list(pool: pynox.Pool, tmp_path: Path) -> None:
    plain = CodeAgent(tools=[], model=ReloadedModel([]), executor=PynoxExecutor(pool), verbosity_level=QUIET)
    assert "only from the following list of modules: [" in plain.system_prompt  # smolagents' own wording
    agent = PynoxCodeAgent(tools=[], model=ReloadedModel([]), verbosity_level=QUIET,
                           executor_kwargs={"pool": pool, "allow_write": [str(tmp_path)], "timeout": "7s"})
    prompt = agent.system_prompt
    assert "only from the following list of modules" not in prompt and "'collections'" not in prompt
    assert "you may import any installed package" in prompt
    assert f"Write files: {tmp_path}." in prompt and "7s of time" in prompt and "Network: not allowed" in prompt


def test_figures_reach_the_model_as_the_steps_observation_images(pool: pynox.Pool) -> None:
    model = ReloadedModel(["import matplotlib.pyplot as plt\nplt.plot([1, 2])\nprint('drawn')",
                           "final_answer('done')"])
    with PynoxCodeAgent(tools=[], model=model, executor_kwargs={"pool": pool}, verbosity_level=QUIET) as agent:
        assert agent.run("plot") == "done"
        drawn, answered = action_steps(agent)
    assert drawn.observations_images is not None and len(drawn.observations_images) == 1
    assert drawn.observations_images[0].format == "PNG" and not answered.observations_images
    # smolagents puts a step's images in the next prompt, for a vision model to see.
    assert any(part.get("type") == "image" for message in model.prompts[1] for part in message.content
               if isinstance(message.content, list) and isinstance(part, dict))


# -- the tool ---------------------------------------------------------------------------------------------------

def test_the_tool_saves_as_code_that_rebuilds_it_with_its_grants(pool: pynox.Pool, files: tuple[Path, Path]) -> None:
    data, secret = files
    made = python_tool(pool, allow_read=[data], timeout="5s", session=True)
    saved = made.to_dict()
    assert saved["name"] == "run_python" and "pynox_smolagents" in saved["requirements"]
    loaded = Tool.from_code(saved["code"], pool=pool)
    assert isinstance(loaded, PynoxTool) and loaded.description == made.description
    assert loaded.code_tool.owns_session and loaded.code_tool.grants == made.code_tool.grants
    try:
        assert "lamp,25" in loaded(code=f"print(open({str(data / 'orders.csv')!r}).read())")
        with pytest.raises(Exception, match="PermissionError") as denied:
            loaded(code=f"print(open({str(secret)!r}).read())")
        assert SECRET not in str(denied.value)
    finally:
        loaded.code_tool.close()
        made.code_tool.close()


# Loading happens in a program of its own, as a user's would: the loaded tool runs on Pynox's default pool
# (smolagents' loader passes no arguments to tools), which lives as long as its process.
LOAD_AND_RUN = """
import json, sys
from smolagents import ToolCallingAgent
from smolagents.models import MODEL_REGISTRY
from pynox_smolagents import PynoxTool
from tests.adapters import test_smolagents_saving as saving

MODEL_REGISTRY[saving.ReloadedModel.__name__] = saving.ReloadedModel
saving.NEXT_REPLIES.append([{"name": "run_python", "args": {"code": f"print(open({sys.argv[2]!r}).read())"}},
                            {"name": "final_answer", "args": {"answer": "tried"}}])
loaded = ToolCallingAgent.from_folder(sys.argv[1], verbosity_level=saving.QUIET)
answer = loaded.run("read the secret")
step = saving.action_steps(loaded)[0]
print(json.dumps({"tool": type(loaded.tools["run_python"]).__name__, "answer": answer, "error": str(step.error)}))
"""


def test_a_tool_calling_agent_with_the_tool_saves_and_loads(
        pool: pynox.Pool, files: tuple[Path, Path], tmp_path: Path) -> None:
    data, secret = files
    agent = ToolCallingAgent(tools=[python_tool(pool, allow_read=[data])], model=ReloadedModel([]),
                             verbosity_level=QUIET)
    agent.save(tmp_path / "saved")
    done = subprocess.run([sys.executable, "-c", LOAD_AND_RUN, str(tmp_path / "saved"), str(secret)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    loaded = json.loads(done.stdout.splitlines()[-1])
    assert loaded["tool"] == "SavedRunPython" and loaded["answer"] == "tried"
    assert "PermissionError" in loaded["error"] and SECRET not in loaded["error"]


def test_a_tool_with_host_functions_or_env_refuses_to_save(pool: pynox.Pool) -> None:
    with pytest.raises(ValueError, match=r"host functions \(lookup\) cannot be saved"):
        python_tool(pool, functions={"lookup": len}).to_dict()
    with pytest.raises(ValueError, match="env is not saved"):
        python_tool(pool, env={"TOKEN": "t"}).to_dict()
