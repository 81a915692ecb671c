"""Cancelling an ``arun`` cancels the job: asyncio cancellation reaches the pool, which kills it (a session
step: interrupts it first, and kills it only past the grace).

Checked from the host: the job would write a file after a pause; after the cancel the file never
appears, and the next run starts at once (one worker: it would wait for the old job otherwise).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from pathlib import Path

import pytest

from pynox import Pool, Result
from tests.harness.fixtures import shared_pool

pytestmark = pytest.mark.timeout(90)


pool = shared_pool(workers=1)


def _writer(marker: Path) -> str:
    return f"import time\ntime.sleep(3)\nopen({str(marker)!r}, 'w').write('ran')"


def test_wait_for_cancels_the_job(pool: Pool, tmp_path: Path) -> None:
    marker = tmp_path / "wait_for"

    async def scenario() -> float:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(pool.arun(_writer(marker), allow_write=[str(tmp_path)]), 0.7)
        started = time.monotonic()
        result = await pool.arun("print('next')")
        assert result.stdout == "next\n"
        return time.monotonic() - started

    next_took = asyncio.run(scenario())
    assert next_took < 1.0, f"the next run waited {next_took:.2f}s for the cancelled one"
    time.sleep(3.5)
    assert not marker.exists(), "the cancelled job went on and wrote its file"


def test_the_control_run_writes_its_file(pool: Pool, tmp_path: Path) -> None:
    marker = tmp_path / "control"
    assert asyncio.run(pool.arun(_writer(marker), allow_write=[str(tmp_path)])).ok
    assert marker.exists()


def test_a_cancelled_session_step_is_interrupted_and_the_session_keeps_its_state(pool: Pool) -> None:
    """As a notebook's interrupt: the step raises KeyboardInterrupt, and the next run sees the variables."""
    async def scenario() -> tuple[str, bool, str | None]:
        session = pool.session()
        await session.arun("x = 1")
        task = asyncio.ensure_future(session.arun("x = 2\nimport time\ntime.sleep(5)\nx = 3"))
        await asyncio.sleep(0.5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        after = await session.arun("print(x)")
        alive = session.alive
        await session.aclose()
        return after.stdout, alive, after.session_reopened

    assert asyncio.run(scenario()) == ("2\n", True, None)


def test_a_cancelled_session_step_that_will_not_stop_starts_a_fresh_session_that_says_so(pool: Pool) -> None:
    async def scenario() -> Result:
        session = pool.session()
        await session.arun("x = 1")
        task = asyncio.ensure_future(session.arun(
            "import time\nwhile True:\n    try:\n        time.sleep(5)\n    except KeyboardInterrupt:\n        pass"))
        await asyncio.sleep(0.5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        after = await session.arun("print('x' in dir())")
        await session.aclose()
        return after

    after = asyncio.run(scenario())
    assert after.stdout == "False\n"
    assert after.session_reopened is not None and "cancelled" in after.session_reopened, after
    assert "earlier process was gone" in after.text


def test_session_interrupt_interrupts_the_running_step_from_another_thread(pool: Pool) -> None:
    with pool.session() as session:
        session.run("x = 1")
        assert session.interrupt() is False  # nothing runs
        timer = threading.Timer(0.5, session.interrupt)
        timer.start()
        result = session.run("x = 2\nimport time\ntime.sleep(10)\nx = 3")
        timer.join()
        assert result.interrupted and result.error is not None and result.error["type"] == "KeyboardInterrupt"
        assert "interrupted (KeyboardInterrupt)" in result.text and not result.session_ended
        assert session.run("print(x)").stdout == "2\n"


def test_a_step_interrupted_while_it_waits_for_a_host_function_keeps_the_session_and_its_channel(pool: Pool) -> None:
    def slow() -> int:
        time.sleep(2)
        return 1

    with pool.session(functions={"slow": slow, "fast": lambda: 2}) as session:
        session.run("x = 5")
        timer = threading.Timer(0.5, session.interrupt)
        timer.start()
        interrupted = session.run("from pynox_host import slow\ny = slow()")
        timer.join()
        assert interrupted.interrupted and interrupted.error is not None
        assert interrupted.error["type"] == "KeyboardInterrupt", interrupted
        time.sleep(2)  # the late answer to the interrupted call arrives, and is dropped
        assert session.run("from pynox_host import fast\nprint(x, fast())").stdout == "5 2\n"


# The main thread waits for its host call and reads the channel for every caller; two threads call once it does
# (found by its frame, so the order is certain), and wait to be handed their answers. The interrupt reaches the
# main thread while it reads: the step's code catches it, says so, and waits (bounded) for the threads.
_READER_INTERRUPTED = """\
import sys, threading, time
from pynox_host import block
main, out = threading.main_thread().ident, {}

def main_reads():
    frame = sys._current_frames().get(main)
    while frame is not None and frame.f_code.co_name != "_take":
        frame = frame.f_back
    return frame is not None

def call(name):
    deadline = time.monotonic() + 30
    while not main_reads() and time.monotonic() < deadline:
        time.sleep(0.005)
    out[name] = block(name)

threads = [threading.Thread(target=call, args=(name,), daemon=True) for name in ("t1", "t2")]
[thread.start() for thread in threads]
try:
    block("main")
except KeyboardInterrupt:
    print("interrupted", flush=True)
[thread.join(5) for thread in threads]
print(sorted(out.items()))
"""


def test_calls_of_other_threads_complete_when_the_thread_reading_for_them_is_interrupted(tmp_path: Path) -> None:
    """The interrupted caller passes the reading of the host channel on: the threads' calls get their answers."""
    config = tmp_path / "pynox.toml"
    config.write_text('[pool]\ninterrupt_grace = "60s"\n')  # the step's code waits for its threads after it
    arrived: set[str] = set()
    changed = threading.Condition()
    taken = threading.Event()  # the step's code has its KeyboardInterrupt: the host answers from then on

    def block(name: str) -> str:
        with changed:
            arrived.add(name)
            changed.notify_all()
        taken.wait(30)
        return name

    def on_output(event: object) -> None:
        if "interrupted" in getattr(event, "text", ""):
            taken.set()

    with Pool(workers=1, config=config) as pool, pool.session(functions={"block": block}) as session:
        with concurrent.futures.ThreadPoolExecutor(1) as runner:
            step = runner.submit(session.run, _READER_INTERRUPTED, on_output=on_output)
            with changed:
                assert changed.wait_for(lambda: arrived == {"main", "t1", "t2"}, 30), arrived
            assert session.interrupt()
            result = step.result(60)
        assert result.stdout == "interrupted\n[('t1', 't1'), ('t2', 't2')]\n", result.text
        assert session.run("from pynox_host import block\nprint(block('after'))").stdout == "after\n"


# A step's interrupt can land as the reader reads an answer, even right after `recv` returned, whose bytes are then
# lost: the stream is out of step. Made certain here: a profile hook of the step's code raises KeyboardInterrupt
# as the channel's N-th `recv` returns (a signal's handler runs at that very point), its result discarded.
_INTERRUPTED_AFTER = """\
import sys
from pynox_host import big, small, HostError
takes = []

def hook(frame, event, arg):
    if event == "c_return" and getattr(arg, "__name__", "") in ("recv", "recv_into"):
        takes.append(arg.__name__)
        if len(takes) == {after}:
            sys.setprofile(None)
            raise KeyboardInterrupt

sys.setprofile(hook)
try:
    answer = big()
except KeyboardInterrupt:
    print("interrupted after", takes, flush=True)
else:
    print("whole", len(answer), "in", len(takes), "reads")
sys.setprofile(None)
try:
    print(small())
except HostError as error:
    print("next:", error)
"""
_BIG = "x" * 900_000  # under the 1 MB limit of an answer, yet read in several chunks
_CLEAR = ("small(): the host channel failed: reading an answer was interrupted (KeyboardInterrupt) partway "
          "through it, so the channel is out of step and cannot be used again by this job or session")


@pytest.mark.parametrize("after", [1, 2], ids=["after-its-header", "after-a-chunk-of-its-body"])
def test_a_reader_interrupted_partway_through_an_answer_breaks_the_channel_for_every_later_call(
        pool: Pool, after: int) -> None:
    """Fails closed: the next call, and a later step's, raise a clear HostError at once, instead of reading the
    rest of the frame as a header (garbage, or a wait until the deadline). The job is not killed for leaving
    the rest of the answer unread (the channel is shut down): a later step waits past the pool's 5 s stall."""
    with pool.session(functions={"big": lambda: _BIG, "small": lambda: "small"}) as session:
        first = session.run(_INTERRUPTED_AFTER.replace("{after}", str(after)), timeout=20)
        taken = ["recv_into", "recv"][:after]
        assert first.ok and first.stdout == f"interrupted after {taken}\nnext: {_CLEAR}\n", first.text
        later = session.run("import time\nfrom pynox_host import small, HostError\ntime.sleep(5.5)\n"
                            "try:\n    small()\nexcept HostError as error:\n    print(error)", timeout=20)
        assert later.ok and later.stdout == _CLEAR + "\n", later.text
        assert session.run("print('alive')").stdout == "alive\n"


def test_control_without_the_interrupt_the_large_answer_arrives_whole_over_several_reads(pool: Pool) -> None:
    with pool.session(functions={"big": lambda: _BIG, "small": lambda: "small"}) as session:
        result = session.run(_INTERRUPTED_AFTER.replace("{after}", "0"), timeout=20)
        assert result.ok and result.stdout.startswith("whole 900000 in "), result.text
        reads = int(result.stdout.split(" in ")[1].split()[0])
        assert reads >= 3, result.stdout  # a header and two chunks at least: the interrupts above land mid-frame
        assert result.stdout.endswith("reads\nsmall\n"), result.text
