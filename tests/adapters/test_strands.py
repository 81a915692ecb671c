"""pynox-strands beyond the shared suite: strands' own python_repl and file operations through ``PynoxSandbox``."""

from __future__ import annotations

import inspect
import json
import time
from pathlib import Path

import pytest
from strands import Agent
from strands.sandbox.errors import SandboxPathNotFoundError
from strands.vended_tools import python_repl, shell

from pynox import Pool
from pynox_strands import PynoxSandbox, UnsupportedOperation, python_tool

from .conftest import WORKERS, run_async
from .procs import pynox_processes, wait_for_idle
from .scripted import PYTHON, ScriptedStrandsModel, Transcript, run_strands

pytestmark = pytest.mark.timeout(60)


def repl(code: str, **args: object) -> tuple[str, dict[str, object]]:
    return "python_repl", {"code": code, **args}


def test_a_plain_function_is_dropped_by_strands_so_it_must_be_wrapped(pool: Pool) -> None:
    assert Agent(model=ScriptedStrandsModel([]), tools=[pool.tool()], callback_handler=None).tool_names == []
    tool = python_tool(pool)
    assert Agent(model=ScriptedStrandsModel([]), tools=[tool], callback_handler=None).tool_names == ["run_python"]
    assert inspect.iscoroutinefunction(tool.__wrapped__)  # async: it awaits Pool.arun


def test_nothing_starts_before_the_first_call(earlier_pools: frozenset[int]) -> None:
    before = pynox_processes()
    python_tool(session=True)
    PynoxSandbox(allow_read=["/usr/share"], session=True, vend=["run_python", "python_repl", "file_editor"]).get_tools()
    assert pynox_processes() == before


def test_the_sandbox_vends_run_python_unless_told_not_to_or_the_agent_has_one(pool: Pool) -> None:
    model = ScriptedStrandsModel([])
    assert Agent(model=model, sandbox=PynoxSandbox(pool), callback_handler=None).tool_names == ["run_python"]
    assert Agent(model=model, sandbox=PynoxSandbox(pool, vend_tool=False), callback_handler=None).tool_names == []
    mine = python_tool(pool, timeout="3s")
    agent = Agent(model=model, sandbox=PynoxSandbox(pool), tools=[mine], callback_handler=None)
    assert agent.tool_registry.registry["run_python"] is mine


def test_python_repl_runs_in_pynox_and_reads_a_denied_path_as_an_error_with_the_hint(pool: Pool) -> None:
    sandbox = PynoxSandbox(pool, vend_tool=False)
    transcript = run_strands({"sandbox": sandbox, "tools": [python_repl]},
                             [repl("import sys\nprint(sys.argv[0])"), repl("print(open('/etc/passwd').read())"),
                              repl("print(x)")])
    ran, denied, fresh = (json.loads(text) for text in transcript.results)
    assert ran == {"output": "agent.py\n", "error": "", "exit_code": 0}
    assert denied["exit_code"] == 1 and denied["output"] == ""
    assert denied["error"].startswith("Traceback (most recent call last):\n  File \"agent.py\", line 1")
    assert "PermissionError: [Errno 13] Permission denied: '/etc/passwd' (agent.py:1)\nHint: " in denied["error"]
    assert 'allow_read=["/etc/passwd"]' in denied["error"]
    assert "NameError" in fresh["error"]  # each call is a fresh process


def test_a_longer_timeout_from_the_model_cannot_extend_the_hosts(pool: Pool) -> None:
    sandbox = PynoxSandbox(pool, vend_tool=False, timeout="1s")
    started = time.monotonic()
    transcript = run_strands({"sandbox": sandbox, "tools": [python_repl]},
                             [repl("import time\ntime.sleep(5)", timeout=120), repl("print('next')", timeout=1)])
    assert time.monotonic() - started < 4
    timed_out, after = transcript.results
    assert timed_out.startswith("Error: SandboxTimeoutError - Execution timed out after 1.0 seconds")
    assert "TimeoutError: the code did not finish within 1s" in timed_out and "Hint: " in timed_out
    assert json.loads(after)["output"] == "next\n"


def test_shell_commands_fail_saying_pynox_runs_python_only(pool: Pool) -> None:
    transcript = run_strands({"sandbox": PynoxSandbox(pool, vend_tool=False), "tools": [shell]},
                             [("shell", {"command": "cat /etc/passwd"})])
    assert "PynoxSandbox cannot run shell commands: Pynox runs Python code only" in transcript.results[0]
    with pytest.raises(UnsupportedOperation, match="runs Python only"):
        run_async(PynoxSandbox(pool).execute_code("console.log(1)", "node"))
    with pytest.raises(UnsupportedOperation, match="cwd"):
        run_async(PynoxSandbox(pool).execute_code("print(1)", "python3", cwd="/tmp"))


def test_env_reaches_the_code_and_python_versions_are_accepted(pool: Pool) -> None:
    sandbox = PynoxSandbox(pool, env={"HOST": "1"})
    result = run_async(sandbox.execute_code("import os\nprint(os.environ['HOST'], os.environ['CALLER'])",
                                            "python3.11", env={"CALLER": "2"}))
    assert (result.exit_code, result.stdout, result.stderr) == (0, "1 2\n", "")


def test_file_operations_are_confined_jobs_under_the_same_grants(pool: Pool, tmp_path: Path) -> None:
    sandbox = PynoxSandbox(pool, allow_write=[str(tmp_path)])

    async def scenario() -> None:
        await sandbox.write_file(str(tmp_path / "sub" / "data.bin"), b"\x00\xffbytes")
        assert (tmp_path / "sub" / "data.bin").read_bytes() == b"\x00\xffbytes"
        assert await sandbox.read_file(str(tmp_path / "sub" / "data.bin")) == b"\x00\xffbytes"
        await sandbox.write_text(str(tmp_path / "sub" / "note.txt"), "héllo")
        listed = await sandbox.list_files(str(tmp_path / "sub"))
        assert [(f.name, f.is_dir, f.size) for f in listed] == [("data.bin", False, 7), ("note.txt", False, 6)]
        await sandbox.remove_file(str(tmp_path / "sub" / "note.txt"))
        assert not (tmp_path / "sub" / "note.txt").exists()
        with pytest.raises(PermissionError, match=r'allow_read=\["/etc/passwd"\]'):
            await sandbox.read_file("/etc/passwd")
        with pytest.raises(PermissionError, match="outside the paths"):
            await sandbox.write_file("/tmp/pynox-strands-outside.txt", b"no")
        with pytest.raises(FileNotFoundError):
            await sandbox.read_file(str(tmp_path / "missing"))
        with pytest.raises(SandboxPathNotFoundError):
            await sandbox.list_files(str(tmp_path / "missing"))

    run_async(scenario())
    assert not Path("/tmp/pynox-strands-outside.txt").exists()


def test_a_sandbox_session_keeps_state_for_python_repl_until_closed(pool: Pool,
                                                                    earlier_pools: frozenset[int]) -> None:
    sandbox = PynoxSandbox(pool, session=True, vend_tool=False)
    transcript = run_strands({"sandbox": sandbox, "tools": [python_repl]}, [repl("x = 41"), repl("print(x + 1)")])
    assert json.loads(transcript.results[1])["output"] == "42\n"
    run_async(sandbox.aclose())
    wait_for_idle(templates=WORKERS, ignore=earlier_pools)
    transcript = run_strands({"sandbox": sandbox, "tools": [python_repl]}, [repl("print('x' in globals())")])
    assert json.loads(transcript.results[0])["output"] == "False\n"  # a fresh session after the close
    sandbox.close()
    wait_for_idle(templates=WORKERS, ignore=earlier_pools)


def test_a_callers_session_outlives_agents_and_ends_with_its_block(pool: Pool,
                                                                 earlier_pools: frozenset[int]) -> None:
    with pool.session() as session:
        run_strands({"tools": [python_tool(session=session)]}, [(PYTHON, {"code": "x = 41"})])
        transcript = run_strands({"tools": [python_tool(session=session)]}, [(PYTHON, {"code": "print(x + 1)"})])
        assert transcript.results == ["42"]
    wait_for_idle(templates=WORKERS, ignore=earlier_pools)


def test_a_stock_python_repl_the_agent_is_given_wins_over_the_vended_one(pool: Pool) -> None:
    # strands skips a vended tool whose name the agent already has: the stock description is what the
    # model then reads (the docs say to let the sandbox vend python_repl instead). It still runs in Pynox.
    transcript = Transcript()
    model = ScriptedStrandsModel([repl("print(1)")], transcript)
    Agent(model=model, sandbox=PynoxSandbox(pool, vend=["python_repl"]), tools=[python_repl],
          callback_handler=None)("go")
    assert [seen.name for seen in transcript.tools] == ["python_repl"]
    assert "Files written to the working directory persist" in transcript.tool("python_repl").description
    assert json.loads(transcript.results[0])["output"] == "1\n"
