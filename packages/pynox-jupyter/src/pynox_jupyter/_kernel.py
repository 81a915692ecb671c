"""``PynoxKernel``: ipykernel's wrapper-kernel base, whose cells run in one Pynox session.

The kernel process is trusted and holds no notebook state: it speaks the Jupyter messaging protocol
(ipykernel's :class:`~ipykernel.kernelbase.Kernel` does the sockets, the sessions' signatures and the
message loop) and sends each cell to a session of a Pynox pool it owns, confined by the grants of its
kernelspec or its config's profile, never by the notebook. Inside the session IPython's shell runs the
cell (``_cell.py``), so magics, ``_``, ``Out`` and rich display work as in IPython; the cell's outputs
come back as data the kernel decodes (``_outputs.py``) and publishes on IOPub.

An interrupt (``interrupt_mode: "message"``, as the kernelspec says: a signal to the kernel's process
group would reach the pool too) cancels the running cell's step: the pool raises ``KeyboardInterrupt``
in it, and the session keeps its variables when the cell stops within the pool's grace. A restart
closes the session; the next cell starts a fresh one.
"""

from __future__ import annotations

import asyncio
import os
import platform
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from typing import Any

from ipykernel.kernelbase import Kernel
from IPython.core.inputtransformer2 import TransformerManager

from pynox import OutputEvent, Pool, PynoxError, Result, Session, StreamText, __version__

from ._outputs import CellOutput, decode_failure, decode_outputs
from ._refusals import refusal

__all__ = ["KernelSettings", "PynoxKernel"]

_CLOSE_TIMEOUT = 5.0


@dataclass
class KernelSettings:
    """What the kernelspec (or ``pynox-jupyter`` flags) says: the pool's options and the session's grants."""

    grants: dict[str, Any] = field(default_factory=dict)
    config: str | None = None
    preload: list[str] = field(default_factory=list)


class PynoxKernel(Kernel):
    implementation = "pynox"
    implementation_version = __version__
    language = "python"
    language_version = platform.python_version()
    language_info = {  # noqa: RUF012 - ipykernel's base reads it as a class attribute
        "name": "python",
        "version": platform.python_version(),
        "mimetype": "text/x-python",
        "file_extension": ".py",
        "pygments_lexer": "ipython3",
        "codemirror_mode": {"name": "ipython", "version": 3},
        "nbconvert_exporter": "python",
    }
    banner = f"Pynox {__version__}: IPython in a kernel-confined process (Python {platform.python_version()})"
    settings = KernelSettings()  # set by the launcher before the kernel is made

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._pool: Pool | None = None
        self._session: Session | None = None
        # Where IPython keeps its profile and temporary files inside the session: the kernel's own, granted
        # for writing to the session alone, removed at shutdown.
        self._home = tempfile.mkdtemp(prefix="pynox-kernel-")
        # The running cell's step, and the loop it runs on: an interrupt comes on the control thread's loop.
        self._cell: tuple[asyncio.Task[Result], asyncio.AbstractEventLoop] | None = None
        self._completer = TransformerManager()

    # -- the session ------------------------------------------------------------------------------------
    def _ensure_session(self) -> Session:
        if self._pool is None:
            self._pool = Pool(workers=1, preload=self.settings.preload, config=self.settings.config)
        if self._session is None:
            grants = dict(self.settings.grants)
            home = self._home
            grants["allow_write"] = [*grants.get("allow_write", ()), home]
            grants["env"] = {**grants.get("env", {}), "IPYTHONDIR": os.path.join(home, ".ipython"), "TMPDIR": home,
                             "MPLCONFIGDIR": os.path.join(home, ".matplotlib"), "HOME": home}
            self._session = self._pool.session(**grants)
        return self._session

    async def _run_step(self, code: str, name: str, *, live: bool = False) -> Result:
        """One step of the session; ``live``: its stdout goes to the notebook as the cell prints it."""
        session = self._ensure_session()
        task = asyncio.ensure_future(session.arun(code, name=name, return_value=True,
                                                  on_output=self._printed if live else None))
        self._cell = (task, asyncio.get_running_loop())
        try:
            return await task
        finally:
            self._cell = None

    # -- execute ----------------------------------------------------------------------------------------
    async def do_execute(self, code: str, silent: bool, store_history: bool = True,
                         user_expressions: dict[str, Any] | None = None, allow_stdin: bool = False, *,
                         cell_meta: Any = None, cell_id: Any = None) -> dict[str, Any]:
        count = self.execution_count
        refused = refusal(code)
        if refused is not None:
            return self._error("PermissionError", refused, [f"PermissionError: {refused}"], silent)
        call = (f"__import__('pynox_jupyter._cell', fromlist=['run']).run({code!r}, {count}, silent={silent!r}, "
                f"store_history={store_history!r})")
        try:
            result = await self._run_step(call, f"In[{count}]", live=not silent)
        except asyncio.CancelledError:
            return self._error("KeyboardInterrupt", "the cell was interrupted", ["KeyboardInterrupt"], silent)
        except PynoxError as exc:  # the pool could not run it at all (it refused, or it is gone)
            message = str(exc)
            return self._error(type(exc).__name__, message, [f"{type(exc).__name__}: {message}"], silent)
        if not silent:
            if result.session_reopened is not None:  # an earlier cell ended its process: say the state is gone
                note = (f"[The kernel's earlier process was gone ({result.session_reopened}): this cell ran in a new "
                        "one. Variables, imports and functions defined in earlier cells are gone.]\n")
                self.send_response(self.iopub_socket, "stream", {"name": "stderr", "text": note})
            self._publish_streams(result)
        if result.ok:
            if not silent:
                for output in decode_outputs(result.return_value):
                    self._publish_output(output, count)
                self._publish_images(result)
            return {"status": "ok", "execution_count": count, "payload": [], "user_expressions": {}}
        return await self._cell_error(result, count, silent)

    async def _cell_error(self, result: Result, count: int, silent: bool) -> dict[str, Any]:
        error = result.error or {}
        ename = str(error.get("type") or "Error")
        evalue = str(error.get("message") or "")
        outputs: list[CellOutput] = []
        traceback: list[str] = []
        if not result.session_ended and error.get("type") not in ("TimeoutError", "PoolWorkerError"):
            # What it displayed, and IPython's own formatting of its error, kept by the session (_cell.failed).
            failure = await self._run_step("__import__('pynox_jupyter._cell', fromlist=['run']).failed()",
                                           "pynox-kernel")
            outputs, traceback = decode_failure(failure.return_value)
        if not silent:
            for output in outputs:
                self._publish_output(output, count)
            self._publish_images(result)
        if not traceback:
            traceback = [f"{ename}: {evalue}"]
        notes = result.notes(source_line=False).split("\n")[1:]  # the hint and the session's end, if any
        return self._error(ename, evalue, traceback + notes, silent)

    def _error(self, ename: str, evalue: str, traceback: list[str], silent: bool) -> dict[str, Any]:
        content = {"ename": ename, "evalue": evalue, "traceback": traceback}
        if not silent:
            self.send_response(self.iopub_socket, "error", content)
        return {"status": "error", "execution_count": self.execution_count, **content}

    def _printed(self, event: OutputEvent) -> None:
        """What the cell prints, as it prints it. Its stderr waits for the cell's end: the traceback Python
        prints there is left out of it then (the cell's error shows IPython's own)."""
        if isinstance(event, StreamText) and event.name == "stdout":
            self.send_response(self.iopub_socket, "stream", {"name": "stdout", "text": event.text})

    def _publish_streams(self, result: Result) -> None:
        if result.stderr_text:
            self.send_response(self.iopub_socket, "stream", {"name": "stderr", "text": result.stderr_text})

    def _publish_output(self, output: CellOutput, count: int) -> None:
        if output.output_type == "execute_result":
            self.send_response(self.iopub_socket, "execute_result",
                               {"execution_count": count, "data": output.data, "metadata": output.metadata})
        else:
            self.send_response(self.iopub_socket, "display_data",
                               {"data": output.data, "metadata": output.metadata, "transient": {}})

    def _publish_images(self, result: Result) -> None:
        import base64

        for image in result.images:  # figures the cell showed or left open (pynox's own backend)
            self.send_response(self.iopub_socket, "display_data",
                               {"data": {"image/png": base64.b64encode(image).decode("ascii"),
                                         "text/plain": "<Figure>"}, "metadata": {}, "transient": {}})

    # -- the rest of the protocol ----------------------------------------------------------------------
    async def do_is_complete(self, code: str) -> dict[str, Any]:
        status, indent = self._completer.check_complete(code)
        reply: dict[str, Any] = {"status": status}
        if status == "incomplete":
            reply["indent"] = " " * (indent or 0)
        return reply

    async def interrupt_request(self, stream: Any, ident: Any, parent: Any) -> None:
        """Interrupt the running cell only: no signal to the kernel's process group (the pool is in it)."""
        cell = self._cell
        if cell is not None:
            task, loop = cell
            loop.call_soon_threadsafe(task.cancel)
        assert self.session is not None  # the kernel answers messages only once its session exists
        self.session.send(stream, "interrupt_reply", {"status": "ok"}, parent, ident=ident)

    async def do_shutdown(self, restart: bool) -> dict[str, Any]:
        # The kernel's process ends after this either way (a restart starts a new one): so do its pool and home.
        self._session = None
        pool, self._pool = self._pool, None
        if pool is not None:
            await asyncio.to_thread(pool.close, timeout=_CLOSE_TIMEOUT)
        _remove_home(self._home)
        return {"status": "ok", "restart": restart}


def _remove_home(home: str) -> None:
    """Remove the kernel's home, whose tree the notebook's code chose (its session may write there): as deep as it
    likes, with symlinks out (neither removal follows one). The core removes its own such trees without recursion
    (pynox/trees.py, not part of its public surface); here rm walks a tree too deep for rmtree."""
    try:
        shutil.rmtree(home, ignore_errors=True)
    except RecursionError:  # nested deeper than rmtree recurses (until Python 3.12)
        try:
            subprocess.run(["rm", "-rf", "--", home], check=False, timeout=_CLOSE_TIMEOUT * 12,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        except (OSError, subprocess.SubprocessError):  # no rm here: the home stays in the temporary directory
            pass
