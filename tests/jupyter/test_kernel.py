"""The Pynox Jupyter kernel, driven by clients nobody here wrote: ``jupyter_client``, ``nbclient``, ``nbconvert``.

Each test starts the real kernel as Jupyter does (from its kernelspec), so the kernel, its pool and its
session are real processes under the real kernel policy. What a cell may touch is checked from outside
(the file a cell tried to write), with the kernelspec's grant as the control; notebooks written in the
style of a data-science handbook's NumPy, pandas and Matplotlib chapters are run by both the Pynox kernel
and ipykernel's own, and their outputs compared cell by cell.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nbformat
import pytest
from jupyter_client.blocking.client import BlockingKernelClient
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient

from pynox_jupyter import install_kernelspec
from tests.pool.pool_driver import descendants

TIMEOUT = 120  # seconds: a kernel's first cell starts a pool, a session and IPython on a loaded machine


@pytest.fixture
def jupyter_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where the test's own kernelspecs go: first on Jupyter's path, for this test only."""
    prefix = tmp_path / "prefix"
    monkeypatch.setenv("JUPYTER_PATH", str(prefix / "share" / "jupyter"))
    return prefix


@pytest.fixture
def granted(tmp_path: Path) -> Path:
    directory = tmp_path / "granted"
    directory.mkdir()
    return directory


def _kernel(name: str) -> Iterator[tuple[KernelManager, BlockingKernelClient]]:
    manager = KernelManager(kernel_name=name)
    manager.start_kernel()
    client = manager.blocking_client()
    client.start_channels()
    try:
        client.wait_for_ready(timeout=TIMEOUT)
        yield manager, client
    finally:
        client.stop_channels()
        if manager.is_alive():
            manager.shutdown_kernel(now=False)


@pytest.fixture
def kernel(jupyter_path: Path, granted: Path) -> Iterator[tuple[KernelManager, BlockingKernelClient]]:
    install_kernelspec({"allow_write": [str(granted)], "timeout": "60s"}, name="pynox-test", prefix=str(jupyter_path))
    yield from _kernel("pynox-test")


def _execute(client: BlockingKernelClient, code: str, timeout: float = TIMEOUT) -> tuple[dict[str, Any], list[Any]]:
    messages: list[Any] = []
    reply = client.execute_interactive(code, timeout=timeout, output_hook=messages.append)
    return reply["content"], [(m["msg_type"], m["content"]) for m in messages
                              if m["msg_type"] not in ("status", "execute_input")]


def test_the_package_makes_a_pynox_kernel_visible() -> None:
    """Installed, the package's own kernelspec is in the environment, as ipykernel's python3 is."""
    specs = KernelSpecManager().find_kernel_specs()
    assert "pynox" in specs
    spec = KernelSpecManager().get_kernel_spec("pynox")
    assert spec.argv[1:3] == ["-m", "pynox_jupyter"] and spec.interrupt_mode == "message"


def test_cells_keep_state_and_ipython_works_as_in_ipython(kernel: tuple[KernelManager, BlockingKernelClient]) -> None:
    _, client = kernel
    reply, outputs = _execute(client, "x = 41\nprint('hello')\nx + 1")
    assert reply["status"] == "ok"
    assert ("stream", {"name": "stdout", "text": "hello\n"}) in outputs
    result = [content for kind, content in outputs if kind == "execute_result"]
    assert result == [{"execution_count": reply["execution_count"], "data": {"text/plain": "42"}, "metadata": {}}]

    reply, outputs = _execute(client, "%time y = x * 2\n_ + y, Out[" + str(result[0]["execution_count"]) + "]")
    assert reply["status"] == "ok", reply
    assert any(kind == "stream" and "Wall time" in content["text"] for kind, content in outputs)
    assert [content["data"]["text/plain"] for kind, content in outputs if kind == "execute_result"] == ["(124, 42)"]

    reply, outputs = _execute(client, "from IPython.display import HTML, display\ndisplay(HTML('<b>bold</b>'))\n"
                                      "import pandas as pd\npd.DataFrame({'a': [1, 2]})")
    shown = [content["data"] for kind, content in outputs if kind in ("display_data", "execute_result")]
    assert shown[0]["text/html"] == "<b>bold</b>"
    assert "<table" in shown[1]["text/html"] and "text/plain" in shown[1]


def test_a_cell_error_is_ipythons_with_the_hint_and_the_notebook_lives_on(
        kernel: tuple[KernelManager, BlockingKernelClient], tmp_path: Path) -> None:
    _, client = kernel
    outside = tmp_path / "outside.txt"
    reply, outputs = _execute(client, f"z = 1\nopen({str(outside)!r}, 'w').write('x')")
    assert reply["status"] == "error" and reply["ename"] == "PermissionError"
    assert any("Cell In[" in line for line in reply["traceback"])
    assert any(line.startswith("Hint:") and "allow_write" in line for line in reply["traceback"])
    assert ("error", {key: reply[key] for key in ("ename", "evalue", "traceback")}) in outputs
    assert not outside.exists()  # refused by the kernel's policy, seen from outside
    reply, _ = _execute(client, "z")
    assert reply["status"] == "ok"


def test_the_kernelspecs_grant_is_the_control(kernel: tuple[KernelManager, BlockingKernelClient],
                                             granted: Path) -> None:
    _, client = kernel
    reply, _ = _execute(client, f"open({str(granted / 'made.txt')!r}, 'w').write('by the notebook')")
    assert reply["status"] == "ok"
    assert (granted / "made.txt").read_text() == "by the notebook"


@pytest.mark.parametrize("cell", ["!ls /", "files = !ls", "%%bash\nls /", "%sx ls", "%%time\n!ls", "%pip install six"])
def test_shell_commands_and_installs_fail_with_a_clear_error(kernel: tuple[KernelManager, BlockingKernelClient],
                                                             cell: str) -> None:
    _, client = kernel
    reply, _ = _execute(client, cell)
    assert reply["status"] == "error" and reply["ename"] == "PermissionError"
    assert "do not" in reply["evalue"] and "SyntaxError" not in reply["evalue"]


def test_a_process_started_inside_is_refused_by_the_policy_all_the_same(
        kernel: tuple[KernelManager, BlockingKernelClient], granted: Path) -> None:
    """Past the kernel's own refusal (a cell that calls IPython's shell by itself), seccomp refuses."""
    _, client = kernel
    marker = granted / "ran.txt"
    _execute(client, f"get_ipython().system('touch {marker}')\nimport os\nos.system('touch {marker}')")
    assert not marker.exists()
    subprocess.run(["touch", str(marker)], check=True)  # the control: the command itself works, unconfined
    assert marker.exists()


def test_is_complete_and_kernel_info(kernel: tuple[KernelManager, BlockingKernelClient]) -> None:
    _, client = kernel
    info = client.kernel_info(reply=True, timeout=TIMEOUT)["content"]
    assert info["implementation"] == "pynox" and info["language_info"]["name"] == "python"
    for code, status in (("for i in range(3):", "incomplete"), ("x = 1", "complete"), ("x = (", "incomplete")):
        client.is_complete(code)
        assert client.get_shell_msg(timeout=TIMEOUT)["content"]["status"] == status


def test_restart_starts_afresh_and_shutdown_leaves_nothing(kernel: tuple[KernelManager, BlockingKernelClient]) -> None:
    manager, client = kernel
    assert _execute(client, "kept = 1")[0]["status"] == "ok"
    manager.restart_kernel(now=False)
    client.wait_for_ready(timeout=TIMEOUT)
    reply, _ = _execute(client, "kept")
    assert reply["status"] == "error" and reply["ename"] == "NameError"
    provisioner = manager.provisioner
    assert provisioner is not None
    pid = provisioner.pid  # type: ignore[attr-defined]
    assert descendants(pid)  # its pool, template and session
    manager.shutdown_kernel(now=False)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.1)
    assert not _alive(pid)


def test_shutdown_removes_a_home_the_code_made_thousands_deep(kernel: tuple[KernelManager, BlockingKernelClient],
                                                             granted: Path) -> None:
    """The kernel's home is the code's to fill; its removal at shutdown follows no symlink and does not recurse
    (shutil.rmtree raised RecursionError a thousand levels down, and the home stayed)."""
    manager, client = kernel
    (granted / "kept.txt").write_text("kept")
    reply, outputs = _execute(client, "import os\nhome = os.environ['HOME']\nos.chdir(home)\n"
                                      "for _ in range(1500):\n    os.mkdir('d')\n    os.chdir('d')\n"
                                      f"os.symlink({str(granted)!r}, 'out')\nos.chdir(home)\nprint(home)")
    assert reply["status"] == "ok", reply
    home = Path(next(content["text"] for kind, content in outputs if kind == "stream").strip())
    try:
        assert home.name.startswith("pynox-kernel-") and home.is_dir()
        manager.shutdown_kernel(now=False)
        assert not home.exists()
        assert [path for path in home.parent.iterdir() if path.name.startswith(home.name)] == []  # nothing moved out
        assert (granted / "kept.txt").read_text() == "kept", "the removal followed the symlink out"
    finally:
        subprocess.run(["rm", "-rf", "--", str(home)], check=True, timeout=60)  # pytest's own cleanup recurses


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


# -- notebooks, against ipykernel's own kernel ---------------------------------------------------------------

_CHAPTERS = {
    "numpy": ["import numpy as np\nnp.random.seed(0)",
              "x1 = np.random.randint(10, size=6)\nx2 = np.random.randint(10, size=(3, 4))\nx2",
              "print('x2 ndim:', x2.ndim, 'shape:', x2.shape, 'size:', x2.size)",
              "x2[0, 0] = 12\nx2[:2, ::2]",
              "%timeit -n 3 -r 1 np.arange(1000).sum()",
              "np.concatenate([x1, x1]).reshape(2, -1).T"],
    "pandas": ["import pandas as pd\nimport numpy as np",
               "data = pd.Series([0.25, 0.5, 0.75, 1.0], index=['a', 'b', 'c', 'd'])\ndata",
               "area = pd.Series({'California': 423967, 'Texas': 695662, 'New York': 141297})\n"
               "pop = pd.Series({'California': 38332521, 'Texas': 26448193, 'New York': 19651127})\n"
               "states = pd.DataFrame({'population': pop, 'area': area})\nstates",
               "states['density'] = states['population'] / states['area']\nstates.describe()",
               "states.style.format(precision=1)",
               "states.loc['Texas', 'nope']"],
    "matplotlib": ["%matplotlib inline\nimport matplotlib.pyplot as plt\nimport numpy as np",
                   "x = np.linspace(0, 10, 100)\nfig = plt.figure()\nplt.plot(x, np.sin(x), '-')\n"
                   "plt.plot(x, np.cos(x), '--');",
                   "plt.plot(x, np.sin(x - 1), color='g')\nplt.title('A sine curve');",
                   "_ = 'done'\n_"],
}


def _notebook(cells: list[str]) -> nbformat.NotebookNode:
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(source) for source in cells]
    return notebook


def _shape(output: Any) -> tuple[str, ...]:
    """What an output is, without its exact bytes (timings, figure pixels and ids differ between runs)."""
    if output["output_type"] == "stream":
        return ("stream", output["name"])
    if output["output_type"] == "error":
        return ("error", output["ename"])
    return (output["output_type"], *sorted(output["data"]))


@pytest.mark.parametrize("chapter", sorted(_CHAPTERS))
def test_notebooks_run_as_under_ipykernel(chapter: str, tmp_path: Path) -> None:
    ran = {}
    for kernel_name in ("python3", "pynox"):
        notebook = _notebook(_CHAPTERS[chapter])
        NotebookClient(notebook, kernel_name=kernel_name, timeout=TIMEOUT, allow_errors=True,
                       resources={"metadata": {"path": str(tmp_path)}}).execute()
        ran[kernel_name] = notebook
    for ours, theirs in zip(ran["pynox"].cells, ran["python3"].cells, strict=True):
        assert [_shape(o) for o in ours.outputs] == [_shape(o) for o in theirs.outputs], ours.source
        assert ours.execution_count == theirs.execution_count
        for mine, other in zip(ours.outputs, theirs.outputs, strict=True):
            if mine["output_type"] == "execute_result" and "image/png" not in mine["data"]:
                assert _text(mine) == _text(other), ours.source


def _text(output: Any) -> str:
    return re.sub(r"0x[0-9a-f]+", "0x...", output["data"]["text/plain"])  # an object's address differs


def test_nbconvert_executes_a_notebook_from_the_command_line(tmp_path: Path) -> None:
    source = tmp_path / "analysis.ipynb"
    nbformat.write(_notebook(["import statistics\nvalues = [3, 9, 27]", "statistics.mean(values)",
                              "'pynox_jupyter._cell' in __import__('sys').modules"]), source)
    done = subprocess.run([sys.executable, "-m", "jupyter", "nbconvert", "--to", "notebook", "--execute",
                           "--ExecutePreprocessor.kernel_name=pynox", "--output", "done.ipynb", str(source)],
                          capture_output=True, text=True, timeout=TIMEOUT * 2, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    executed = nbformat.read(tmp_path / "done.ipynb", as_version=4)
    assert executed.cells[1].outputs[0]["data"]["text/plain"] == "13"
    assert executed.cells[2].outputs[0]["data"]["text/plain"] == "True"  # it ran in a Pynox session


def test_a_cell_prints_as_it_runs(kernel: tuple[KernelManager, BlockingKernelClient]) -> None:
    """Jupyter's stream messages arrive while the cell runs, not all at its end."""
    _, client = kernel
    _execute(client, "import time")
    arrived: list[tuple[float, str]] = []
    client.execute_interactive("print('first', flush=True)\ntime.sleep(2)\nprint('second')", timeout=TIMEOUT,
                               output_hook=lambda m: arrived.append((time.monotonic(), m["content"].get("text", "")))
                               if m["msg_type"] == "stream" else None)
    texts = "".join(text for _, text in arrived)
    assert texts == "first\nsecond\n"
    first = next(at for at, text in arrived if "first" in text)
    second = next(at for at, text in arrived if "second" in text)
    assert second - first > 1.0  # the first line came while the cell slept, a second before the last


def test_an_interrupt_raises_keyboardinterrupt_and_keeps_the_notebooks_state(
        kernel: tuple[KernelManager, BlockingKernelClient]) -> None:
    manager, client = kernel
    assert _execute(client, "kept = 41")[0]["status"] == "ok"
    msg_id = client.execute("while True:\n    pass")
    time.sleep(1.0)  # the cell is running
    manager.interrupt_kernel()
    reply = client.get_shell_msg(timeout=TIMEOUT)
    while reply["parent_header"].get("msg_id") != msg_id:
        reply = client.get_shell_msg(timeout=TIMEOUT)
    assert reply["content"]["status"] == "error" and reply["content"]["ename"] == "KeyboardInterrupt"
    reply, outputs = _execute(client, "kept + 1")
    assert reply["status"] == "ok", reply
    assert [content["data"]["text/plain"] for kind, content in outputs if kind == "execute_result"] == ["42"]
    assert not any(kind == "stream" and "gone" in content["text"] for kind, content in outputs)


def test_a_cell_that_ignores_the_interrupt_ends_its_process_and_the_next_cell_says_so(
        kernel: tuple[KernelManager, BlockingKernelClient]) -> None:
    manager, client = kernel
    assert _execute(client, "kept = 1")[0]["status"] == "ok"
    # Asleep inside the try nearly all the time: the interrupt lands there and is swallowed.
    msg_id = client.execute("import time\nwhile True:\n    try:\n        time.sleep(10)\n"
                            "    except KeyboardInterrupt:\n        pass")
    time.sleep(1.0)
    manager.interrupt_kernel()
    reply = client.get_shell_msg(timeout=TIMEOUT)
    while reply["parent_header"].get("msg_id") != msg_id:
        reply = client.get_shell_msg(timeout=TIMEOUT)
    assert reply["content"]["status"] == "error"
    reply, outputs = _execute(client, "'kept' in globals()")
    assert [content["data"]["text/plain"] for kind, content in outputs if kind == "execute_result"] == ["False"]
    assert any(kind == "stream" and "Variables, imports and functions defined in earlier cells are gone"
               in content["text"] for kind, content in outputs)
