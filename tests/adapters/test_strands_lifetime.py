"""pynox-strands as strands' own tools behave (issue 32, rows 6 and 7): ``agent.cancel()`` stops the running code
at once (strands' ``ToolContext.cancel_signal``), and ``agent.cleanup()`` ends the agent's session (the tool
is a strands ``ToolProvider``). Real agents on a scripted strands model, a real pool; harm seen from the host.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from strands import Agent

from pynox import Pool
from pynox_strands import PynoxSessionTools, python_tool

from .conftest import WORKERS
from .procs import wait_for_idle
from .scripted import ScriptedStrandsModel, Transcript, code_calls, late_write

pytestmark = pytest.mark.timeout(90)


@pytest.mark.parametrize("session", [True, False])
def test_cancelling_the_agent_stops_its_code_at_once(pool: Pool, tmp_path: Path, session: bool) -> None:
    late = tmp_path / "late.txt"
    tool = python_tool(pool, session=session, allow_write=[tmp_path])
    agent = Agent(model=ScriptedStrandsModel(code_calls(late_write(late))), callback_handler=None, tools=[tool])
    threading.Timer(1.0, agent.cancel).start()
    started = time.monotonic()
    agent("go")
    assert time.monotonic() - started < 2.5, "agent.cancel() waited for the code"
    time.sleep(4)  # past the moment the code would have written
    assert not late.exists(), "the cancelled code's side effect happened"
    # The control: not cancelled, the same code writes the file.
    Agent(model=ScriptedStrandsModel(code_calls(late_write(late))), callback_handler=None, tools=[tool])("go")
    assert late.read_text() == "written"
    agent.cleanup()


def test_cleanup_ends_the_agents_session_and_agents_never_share_one(pool: Pool,
                                                                   earlier_pools: frozenset[int]) -> None:
    shared = python_tool(pool, session=True)
    assert isinstance(shared, PynoxSessionTools)
    alice, bob = Transcript(), Transcript()
    first = Agent(model=ScriptedStrandsModel(code_calls("secret = 1", "print(secret)"), alice),
                  callback_handler=None, tools=[shared])
    first("go")
    second = Agent(model=ScriptedStrandsModel(code_calls("print(secret)"), bob), callback_handler=None,
                   tools=[shared])
    second("go")
    assert alice.results[-1] == "1" and bob.results[0].startswith("NameError")
    assert "Calls share one Python process of this agent" in alice.tool("run_python").description
    with pytest.raises(AssertionError, match="still running"):  # the control: both sessions are open
        wait_for_idle(templates=WORKERS, ignore=earlier_pools, deadline=1.0)
    first.cleanup()
    second.cleanup()
    wait_for_idle(templates=WORKERS, ignore=earlier_pools)  # their sessions' processes are gone
