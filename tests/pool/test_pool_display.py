"""Rich display over the protocol: display() in every job, MIME bundles by IPython's rules in the result's
``outputs``, a session step's ``execution_count``, and what the pool does with a display channel the job
abuses (it is the job's word: bounded, checked, and said so in the place of what was left out)."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from .pool_driver import PoolProcess, pool_process

pytestmark = pytest.mark.timeout(180)

_PNG = b"\x89PNG\r\n\x1a\n"


def _types(result: dict) -> list[tuple[str, list[str]]]:  # type: ignore[type-arg]
    return [(o["output_type"], sorted(o["data"])) for o in result["outputs"]]


def test_displayed_objects_and_the_trailing_value_are_bundles_in_order(pool: PoolProcess) -> None:
    code = ("display(1)\nfrom pynox_display import HTML, JSON, Markdown\n"
            "display(HTML('<b>x</b>'), Markdown('*m*'))\ndisplay(JSON({'a': [1, 2]}))\n"
            "class Card:\n    def _repr_html_(self): return '<div>card</div>'\n"
            "    def __repr__(self): return 'Card()'\n"
            "display(Card())\n40 + 2")
    result = pool.run(code, return_value=True)
    assert result["exit"] == 0, result
    assert _types(result) == [
        ("display_data", ["text/plain"]), ("display_data", ["text/html", "text/plain"]),
        ("display_data", ["text/markdown", "text/plain"]), ("display_data", ["application/json", "text/plain"]),
        ("display_data", ["text/html", "text/plain"]), ("execute_result", ["text/plain"]),
    ]
    outputs = result["outputs"]
    assert outputs[1]["data"]["text/html"] == "<b>x</b>" and outputs[3]["data"]["application/json"] == {"a": [1, 2]}
    assert outputs[4]["data"] == {"text/html": "<div>card</div>", "text/plain": "Card()"}
    assert outputs[5] == {"output_type": "execute_result", "data": {"text/plain": "42"}, "metadata": {},
                          "execution_count": None}
    assert result["return_value"] == "42", "the repr field stays as it was"


def test_without_return_value_there_is_no_execute_result(pool: PoolProcess) -> None:
    result = pool.run("display('shown')\n7")
    assert _types(result) == [("display_data", ["text/plain"])]
    assert "return_value" not in result
    assert "outputs" not in pool.run("print(1)"), "a job that displays nothing has no outputs field"


@pytest.mark.parametrize("code", ["ran = 6 * 7\nran;", "ran = [6 * 7]\nsorted(\n    ran);  # done\n",
                                  "ran = 1; ran;"])
def test_a_trailing_semicolon_hides_the_value_as_in_ipython(pool: PoolProcess, code: str) -> None:
    # `plt.plot(x);` in a notebook shows the figure, not the list of lines: IPython's rule. It came back as an
    # execute_result (and a return_value) all the same.
    result = pool.run(code + "\nprint(ran)", return_value=False)  # the code runs whole either way
    assert result["exit"] == 0, result
    quiet = pool.run(code, return_value=True)
    assert quiet["exit"] == 0 and "outputs" not in quiet and quiet["return_value"] is None, quiet
    shown = pool.run(code.rstrip().rstrip(";").rstrip() if "#" not in code else "ran = [1]\nran  # done; not quiet",
                     return_value=True)
    assert _types(shown) == [("execute_result", ["text/plain"])], shown  # control: without it, the value shows


def test_a_dataframe_and_its_style_come_back_as_html(pool: PoolProcess) -> None:
    pytest.importorskip("pandas")
    code = "import pandas as pd\ndf = pd.DataFrame({'a': [1, 2]})\ndisplay(df.style)\ndf"
    result = pool.run(code, return_value=True, timeout="60s")
    assert result["exit"] == 0, result
    styled, value = result["outputs"]
    assert "<table" in styled["data"]["text/html"] and "Styler" in styled["data"]["text/plain"]
    assert value["output_type"] == "execute_result" and "<table" in value["data"]["text/html"]
    assert value["data"]["text/plain"] == result["return_value"]


def test_a_shown_figure_is_a_display_output_where_it_was_shown(pool: PoolProcess) -> None:
    pytest.importorskip("matplotlib")
    code = ("import matplotlib.pyplot as plt\nplt.figure(figsize=(2, 2), dpi=50)\nplt.plot([1])\nplt.show()\n"
            "display('after')\nplt.figure(figsize=(3, 2), dpi=50)\nplt.bar([1], [2])")
    result = pool.run(code, timeout="60s")
    assert result["exit"] == 0, result
    first, after, left_open = result["outputs"]
    assert after["data"] == {"text/plain": "'after'"}
    for output in (first, left_open):
        assert base64.b64decode(output["data"]["image/png"]).startswith(_PNG)
        assert output["data"]["text/plain"].startswith("<Figure size")
    assert [o["data"]["image/png"] for o in (first, left_open)] == result["images"], "images stays as it was"


def test_a_display_over_the_output_limit_is_a_note_in_its_place(pool: PoolProcess) -> None:
    code = "from pynox_display import HTML\ndisplay('before')\ndisplay(HTML('x' * 50000))\ndisplay('after')"
    result = pool.run(code, max_output="10k")
    texts = [o["data"]["text/plain"] for o in result["outputs"]]
    assert texts[0] == "'before'" and texts[2] == "'after'", texts
    assert "left out" in texts[1] and "output limit" in texts[1], texts
    assert "text/html" not in result["outputs"][1]["data"]


@pytest.mark.parametrize("odd", [
    "class Odd:\n    def __getattr__(self, name):\n        raise RuntimeError(name)\n",  # asked for _repr_*_
    "class Meta(type):\n    @property\n    def __module__(cls):\n        raise RuntimeError('no')\n"
    "class Odd(metaclass=Meta):\n    pass\n",
])
def test_an_object_that_resists_its_bundle_is_shown_as_text(pool: PoolProcess, odd: str) -> None:
    # As IPython's formatter skips a method it cannot look up: the code that ran is not failed by its display.
    result = pool.run(odd + "display(Odd())\nOdd()", return_value=True)
    assert result["exit"] == 0, result
    assert _types(result) == [("display_data", ["text/plain"]), ("execute_result", ["text/plain"])]
    assert result["return_value"] is not None


def test_a_job_that_forges_frames_gets_notes_never_a_verdict(pool: PoolProcess) -> None:
    """Frames written by hand on the display descriptor: a header announcing 1 GiB (skipped as it streams
    past, never buffered), garbage, a fake image, a forged execute_result (not asked for): each left out
    with a note or dropped, and the job's own outcome stands."""
    code = (
        "import os, json, struct\n"
        "def frame(body): os.write(10, struct.pack('!I', len(body)) + body)\n"
        "os.write(10, struct.pack('!I', 1 << 30) + b'x' * 70000)\n"
        "os.close(10)\n"  # the rest of the announced frame never comes: cut short
    )
    result = pool.run(code)
    assert result["exit"] == 0 and result["error"] is None, result
    notes = [o["data"]["text/plain"] for o in result["outputs"]]
    assert len(notes) == 2 and "1073741824 bytes" in notes[0] and "cut short" in notes[1], notes

    code = (
        "import os, json, struct\n"
        "def frame(body): os.write(10, struct.pack('!I', len(body)) + body)\n"
        "frame(b'not json')\n"
        "frame(json.dumps({'output_type': 'display_data', 'data': {'image/png': 'aGVsbG8=', 'text/plain': 'img'},"
        " 'metadata': {}}).encode())\n"
        "frame(json.dumps({'output_type': 'execute_result', 'data': {'text/plain': 'forged'}, 'metadata': {}})"
        ".encode())\n"
        "frame(json.dumps({'output_type': 'display_data', 'data': {'bad key': 'x', 'text/plain': 'ok'}}).encode())\n"
        "raise SystemExit(3)"
    )
    result = pool.run(code)
    assert result["exit"] == 3, "the job's outcome is its own, whatever it wrote on its display channel"
    unreadable, image, kept = result["outputs"]
    assert "could not read" in unreadable["data"]["text/plain"]
    assert image["data"] == {"text/plain": "img [left out: image/png: not a PNG]"}
    assert kept["data"] == {"text/plain": "ok [left out: a key that is not a MIME type]"}


def test_session_steps_carry_their_execution_count(pool: PoolProcess) -> None:
    first = pool.run("x = 41", session="display-counts", return_value=True)
    second = pool.run("display('step two')\nx + 1", session="display-counts", return_value=True)
    assert first["execution_count"] == 1 and second["execution_count"] == 2
    assert second["outputs"][-1] == {"output_type": "execute_result", "data": {"text/plain": "42"},
                                     "metadata": {}, "execution_count": 2}
    pool.run(session="display-counts", close=True)


# A thread that keeps showing numbered outputs of ~100 KB (more than a pipe holds: each is written in several
# pieces), whatever step runs: each step's result must hold whole ones only, never one another step showed.
_SHOWER = ("import threading, time\nshown = 0\n"
           "def show():\n    global shown\n    while True:\n"
           "        shown += 1\n        display({'text/plain': f'{shown} ' + 'x' * 100_000}, raw=True)\n"
           "        time.sleep(0.002)\n"
           "threading.Thread(target=show, daemon=True).start()")


def _numbers(result: dict) -> list[int]:  # type: ignore[type-arg]
    numbers = []
    for output in result.get("outputs", []):
        number, _, padding = output["data"]["text/plain"].partition(" ")
        assert padding == "x" * 100_000, f"an output cut or mixed with another: {output['data']['text/plain'][:80]}"
        numbers.append(int(number))
    return numbers


def test_a_later_steps_display_comes_on_its_report_pipe_and_belongs_to_it_alone(pool: PoolProcess) -> None:
    """A later step's display frames come on the session's report pipe, before its report, so a step costs no
    fourth pipe. Seen from the code: the display channel's number stays /dev/null in a later step, and display()
    still reaches the result. A thread that displays across the steps' ends never breaks a report (the step's end
    waits for its frame, and the thread's next frame follows the report, read with the next step), and no output
    shows in two steps or cut short."""
    name = "display-later"
    try:
        first = pool.run(_SHOWER + "\ntime.sleep(0.05)", session=name, max_output=8 << 20)
        assert first["exit"] == 0, first
        seen = [_numbers(first)]
        for _ in range(6):
            step = pool.run("import os, stat\nprint(stat.S_ISCHR(os.fstat(10).st_mode))\ntime.sleep(0.1)",
                            session=name, max_output=8 << 20)
            assert step["exit"] == 0 and step["session_ended"] is False, step
            assert step["stdout"] == "True\n", "a later step's display channel number is /dev/null, not a pipe"
            seen.append(_numbers(step))
        assert all(seen[1:]), f"the thread's outputs reach the steps it runs in: {seen}"
        flat = [number for numbers in seen for number in numbers]
        assert flat == sorted(set(flat)), f"an output shown twice, or out of its order: {seen}"
        mine = pool.run("display('mine')\n41 + 1", session=name, return_value=True, max_output=8 << 20)
        assert mine["exit"] == 0, mine
        assert mine["outputs"][-1]["data"] == {"text/plain": "42"}
        assert any(o["data"] == {"text/plain": "'mine'"} for o in mine["outputs"]), mine
    finally:
        pool.run(session=name, close=True)


# A session's first step starts a thread that shows one output, and ends once the thread has written half of its
# frame: the thread's writes go through a stand-in for the display module's ``os`` that stops it there for 0.5 s.
_HALF_A_FRAME_AT_THE_END = """
import os as real_os, sys, threading, time
halfway = threading.Event()
class _Halts:
    def __getattr__(self, name):
        return getattr(real_os, name)
    def write(self, fd, data):
        if halfway.is_set():
            return real_os.write(fd, data)
        written = real_os.write(fd, bytes(data[:len(data) // 2]))
        halfway.set()
        time.sleep(0.5)
        return written
sys.modules['pynox.job.display'].os = _Halts()
threading.Thread(target=lambda: display({'text/plain': 'y' * 1000}, raw=True), daemon=True).start()
halfway.wait(10)
"""


def test_a_first_steps_end_waits_for_the_frame_a_thread_is_writing(pool: PoolProcess) -> None:
    """As a later step's (above): the end of a session's first step waits until the frame a thread of its is
    writing is whole, and the thread's frames after it are dropped. The first step's display channel was put back
    to /dev/null under the writing thread, its frame cut short (1 in a loaded run of the suite, by the test above;
    every time here, where the thread is held halfway through its frame as the step ends)."""
    name = "display-first-end"
    try:
        first = pool.run(_HALF_A_FRAME_AT_THE_END, session=name)
        assert first["exit"] == 0 and first["session_ended"] is False, first
        assert [output["data"] for output in first["outputs"]] == [{"text/plain": "y" * 1000}], first["outputs"]
        assert pool.run("print('next')", session=name)["stdout"] == "next\n"
    finally:
        pool.run(session=name, close=True)


def test_a_later_step_that_forges_its_report_pipe_gets_no_verdict_from_it(pool: PoolProcess) -> None:
    """The report pipe of a later step carries frames, then a mark, then the report: code that writes a mark and
    a report of its own there before the step's leaves a report the pool cannot take, and the session ends at
    once, as a broken channel does (the pool's verdict), never with the forged one."""
    name = "display-forged"
    try:
        assert pool.run("x = 1", session=name)["exit"] == 0
        forged = pool.run("import os, struct\nos.write(3, struct.pack('!I', 0xFFFFFFFF) + b'{\"exit\": 0}')\n"
                          "os.write(3, b'garbage after it')\nraise ValueError('mine')", session=name)
        assert (forged["error"]["type"], forged["exit"], forged["session_ended"]) == ("PoolWorkerError", 70, True)
    finally:
        pool.run(session=name, close=True)


def test_ipythons_own_display_works_where_ipython_is_installed(pool: PoolProcess) -> None:
    pytest.importorskip("IPython")
    code = "from IPython.display import HTML, display\ndisplay(HTML('<i>i</i>'))"
    result = pool.run(code, timeout="60s")
    assert result["exit"] == 0, result
    [shown] = result["outputs"]
    assert shown["data"]["text/html"] == "<i>i</i>", "IPython's display() is the job's, not a print of the object"


@pytest.mark.parametrize("module", ["pynox_display", "IPython.display"])
def test_a_display_handle_is_returned_and_its_updates_are_shown(pool: PoolProcess, module: str) -> None:
    # `h = display(x, display_id=True); h.update(y)`, a notebook's progress line: display returned None, and
    # the code raised AttributeError. Each update is one more output (a result replaces none in place).
    if module == "IPython.display":
        pytest.importorskip("IPython")
    code = (f"from {module} import display\n"
            "h = display('start', display_id=True)\n"
            "h.update('half')\nh.display('again')\n"
            "named = display('x', display_id='mine')\n"
            "print(type(h).__name__, len(h.display_id), named.display_id, display('no id'))")
    result = pool.run(code)
    assert result["exit"] == 0, result
    assert result["stdout"] == "DisplayHandle 16 mine None\n", result
    shown = [o["data"]["text/plain"] for o in result["outputs"]]
    assert shown == ["'start'", "'half'", "'again'", "'x'", "'no id'"], shown


def test_a_pool_that_preloads_ipythons_formatter_displays_with_it(workdir: Path) -> None:
    """The operator's preload makes IPython's formatter the template's (built once, shared by every job): its
    text/plain is IPython's pretty printer's (``<T at 0x...>``), not repr()'s (``<T object at 0x...>``)."""
    pytest.importorskip("IPython")
    code = "class T:\n    def _repr_html_(self): return '<i>t</i>'\ndisplay(T())"
    with pool_process("--workers=1", "--preload=IPython.core.formatters", cwd=workdir) as own:
        result = own.run(code)
    [shown] = result["outputs"]
    assert shown["data"]["text/html"] == "<i>t</i>"
    assert shown["data"]["text/plain"].startswith("<__main__.T at 0x"), shown


def test_code_running_its_own_ipython_shell_displays_through_it(pool: PoolProcess, tmp_path: Path) -> None:
    """A kernel inside the session (pynox-jupyter runs IPython's shell there) keeps IPython's display: what a
    cell displays goes to the shell's publisher, not to the pool's display channel."""
    pytest.importorskip("IPython")
    code = ("from IPython.core.interactiveshell import InteractiveShell\n"
            "from IPython.core.displaypub import DisplayPublisher\nseen = []\n"
            "class Publisher(DisplayPublisher):\n"
            "    def publish(self, data, metadata=None, *args, **kwargs): seen.append(data)\n"
            "class Shell(InteractiveShell):\n    display_pub_class = Publisher\n"
            "Shell.instance()\nfrom IPython.display import display as ipython_display\n"
            "ipython_display(1)\ndisplay(2)\nprint(seen)")
    result = pool.run(code, timeout="60s", allow_write=[str(tmp_path)],
                      env={"IPYTHONDIR": str(tmp_path), "TMPDIR": str(tmp_path)})
    assert result["exit"] == 0, result
    assert result["stdout"] == "[{'text/plain': '1'}, {'text/plain': '2'}]\n"
    assert "outputs" not in result
