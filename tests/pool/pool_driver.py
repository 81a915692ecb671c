"""A test driver for the real ``pynox pool`` process: JSON Lines over pipes, deadlines, and no leftovers.

:class:`PoolProcess` starts ``python -m pynox pool ARGS`` with its three pipes,
reads the ready event, sends request lines, collects every output line in
order (results, call events, stats, closed answers), answers host-function
calls from Python callables, and always ends with a check that nothing the
pool started is still running.

Finding leftovers does not rely on the pool's own bookkeeping: the test
process is made a *child subreaper* (see ``conftest.py``), so any process the
pool orphans (a template whose server died, a job whose template died) is
re-parented to the test process instead of init. After a pool exits, every
live descendant of the test process that does not belong to another pool still
in use is a leak.
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import json
import os
import queue
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from tests.harness import procfs

POOL = [sys.executable, "-m", "pynox", "pool"]
DEADLINE = 20.0  # seconds any single wait may take before the test fails
EXIT_DEADLINE = 15.0  # seconds a pool may take to drain and exit after EOF
LEFTOVER_DEADLINE = 5.0  # seconds for the processes of an exited pool to disappear

# In the environment of the shared pools: no job may ever see it.
HOST_SECRET_NAME = "PYNOX_POOL_TEST_HOST_SECRET"
HOST_SECRET = "host-secret-" + secrets.token_hex(8)
_PR_SET_CHILD_SUBREAPER = 36
_ids = itertools.count(1)
# Pools (and wrapper processes) still in use: their process trees are not leftovers.
_live: set[int] = set()
_live_lock = threading.Lock()


def own_commands_env() -> dict[str, str]:
    """This environment with the running interpreter's own scripts directory first on PATH: a test that
    runs `pynox` by name runs the one installed beside this interpreter, never another on PATH."""
    scripts = os.path.dirname(sys.executable)
    return {**os.environ, "PATH": os.pathsep.join([scripts, os.environ.get("PATH", os.defpath)])}


def new_id(prefix: str = "r") -> str:
    return f"{prefix}-{next(_ids)}"


def set_child_subreaper(on: bool) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")


def refused(result: dict[str, Any], *words: str) -> str:
    """A request the pool refused before anything ran: a RequestError with exit 2, no output, and each of
    ``words`` in its message, which is returned."""
    assert result["error"] is not None and result["error"]["type"] == "RequestError", result
    assert result["exit"] == 2, result
    assert result.get("stdout", "") == "" and result.get("stderr", "") == "", result
    message = result["error"]["message"]
    for word in words:
        assert word in message, message
    return message


def same_id(a: object, b: object) -> bool:
    """Ids are echoed as given: ``1`` and ``1.0`` and ``"1"`` are three different ids."""
    return type(a) is type(b) and a == b


# --- /proc --------------------------------------------------------------------------------------------


def proc_table() -> dict[int, tuple[int, str, int, str]]:
    """pid -> (ppid, state, start time, command name) for every process visible in /proc."""
    table: dict[int, tuple[int, str, int, str]] = {}
    for pid in procfs.pids():
        try:
            stat = procfs.stat(pid)
        except OSError:
            continue  # it ended while we looked
        table[pid] = (stat.ppid, stat.state, stat.start, stat.comm)
    return table


def walk(root: int, parent_of: Mapping[int, int], ignore: frozenset[int] = frozenset()) -> dict[int, tuple[int, int]]:
    """Every process below ``root`` in a pid -> ppid table: pid -> (depth below root, parent). The processes
    in ``ignore`` and everything below them are left out."""
    children: dict[int, list[int]] = {}
    for pid, ppid in parent_of.items():
        children.setdefault(ppid, []).append(pid)
    found: dict[int, tuple[int, int]] = {}
    frontier = [(root, 0)]
    while frontier:
        pid, depth = frontier.pop()
        for child in children.get(pid, ()):
            if child not in found and child not in ignore:
                found[child] = (depth + 1, pid)
                frontier.append((child, depth + 1))
    return found


def descendants(root: int, table: dict[int, tuple[int, str, int, str]] | None = None) -> dict[int, int]:
    """Live (non-zombie) descendants of ``root``: pid -> depth below root (1 = child). What a zygote forked
    counts at the zygote's own depth (a session's template is a template, its child a session's child)."""
    table = table if table is not None else proc_table()
    return {pid: depth for pid, depth in pool_depths(root, table).items() if table[pid][1] != "Z"}


def pool_depths(root: int, table: dict[int, tuple[int, str, int, str]]) -> dict[int, int]:
    """Every process below ``root``, zombies included: pid -> depth below root, what a zygote forked counted at
    the zygote's own depth (the zygote itself is among them)."""
    found = walk(root, {pid: entry[0] for pid, entry in table.items()})

    def depth(pid: int) -> int:
        below, parent = found[pid]
        while parent in found:
            below -= table[parent][3] == ZYGOTE
            parent = found[parent][1]
        return below

    return {pid: depth(pid) for pid in found}


# The process a pool forks sessions' templates from: no template itself, never a job's parent.
ZYGOTE = "pynox-zygote"


def zygotes(root: int) -> list[int]:
    """The zygotes below a pool: every template is forked from one (more than one only while one is replaced)."""
    table = proc_table()
    return [pid for pid in descendants(root, table) if table[pid][3] == ZYGOTE]


# A template forks and confines children ahead of its next job ("pynox-ready"); they are not jobs yet. A
# pool's default keeps two of them per worker ([pool] prepared_children, docs/configuration.md): the most a
# worker's template has at once, one of them perhaps running a job handed to it.
READY_CHILD = "pynox-ready"
PREPARED_PER_WORKER = 2
# The signal a session's step is interrupted by (the product's wire/signals.py): a session's child takes it
# once confined, a job's child leaves it ignored, as the template does.
SESSION_INTERRUPT = signal.SIGRTMIN + 2


def prepared_for_a_session(pid: int) -> bool:
    """Whether a child prepared ahead ("pynox-ready") was confined for a session, not for a job: it catches the
    session interrupt (``SigCgt`` of its status). The template waiting for the next session holds one; a
    worker's template holds one for its next job."""
    try:
        caught = int(procfs.status(pid).get("SigCgt", "0"), 16)
    except (OSError, ValueError):
        return False
    return bool(caught & (1 << (SESSION_INTERRUPT - 1)))


# What a child names itself once it runs a job or a session. Until then it carries the template's name (it
# may become a prepared child); and a template that is starting may run a helper of its own below the pool
# (ctypes looking for a library runs ldconfig), at the same depth as jobs.
_JOB_NAMES = ("pynox-job", "pynox-session")


def jobs_of(root: int) -> list[int]:
    """The job and session processes below a pool (depth 2), prepared children excluded. A session's process is
    here between its steps too: a step is known to run by what it shows (its first streamed output), not by this."""
    table = proc_table()
    return [pid for pid, depth in descendants(root, table).items() if depth == 2 and table[pid][3] in _JOB_NAMES]


def reap_adopted_zombies() -> None:
    """Reap zombies re-parented to us (the subreaper); pools we started are reaped by their Popen."""
    me = os.getpid()
    with _live_lock:
        live = set(_live)
    for pid, (ppid, state, _start, _comm) in proc_table().items():
        if ppid == me and state == "Z" and pid not in live:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)


def leftovers() -> dict[int, str]:
    """Processes below the test process that belong to no pool still in use: pid -> command name."""
    reap_adopted_zombies()
    table = proc_table()
    with _live_lock:
        live = set(_live)
    mine = descendants(os.getpid(), table)
    excluded: set[int] = set()
    for pid in live:
        excluded.add(pid)
        excluded.update(descendants(pid, table))
    return {pid: table[pid][3] for pid in mine if pid not in excluded}


def assert_no_leftovers(deadline: float = LEFTOVER_DEADLINE) -> None:
    end = time.monotonic() + deadline
    while True:
        left = leftovers()
        if not left:
            return
        if time.monotonic() > end:
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.2)
            reap_adopted_zombies()
            raise AssertionError(f"processes left behind {deadline}s after the pool exited: {left}")
        time.sleep(0.05)


def wait_gone(pids: Sequence[int], deadline: float) -> list[int]:
    """Wait until none of ``pids`` is alive (zombies count as gone); returns those still alive."""
    end = time.monotonic() + deadline
    while True:
        reap_adopted_zombies()
        table = proc_table()
        alive = [pid for pid in pids if pid in table and table[pid][1] != "Z"]
        if not alive or time.monotonic() > end:
            return alive
        time.sleep(0.05)


def rss_kb(pid: int) -> int:
    return procfs.status_number(pid, "VmRSS")


# --- the pool -----------------------------------------------------------------------------------------


# Lines the pool sends for a request before its answer: host-function calls, and output as it happens.
_OUTPUT = ("stream", "display_data")
_EVENTS = ("call", *_OUTPUT)


class PoolExited(AssertionError):
    pass


class PoolProcess:
    """One real ``pynox pool`` process driven over its pipes."""

    def __init__(self, *args: str, cwd: Path | str | None = None, env: dict[str, str] | None = None,
                 expect_ready: bool = True, command: Sequence[str] = POOL, start_new_session: bool = False,
                 as_written: bool = False) -> None:
        """``start_new_session``: the pool leads a process group of its own, as a supervisor starts it (a
        signal to its group then reaches the pool and its templates, and not the test). ``as_written``: every
        request goes out exactly as given, as a client written from the protocol page sends it (no "open")."""
        self.args = list(args)
        self.messages: list[dict[str, Any]] = []
        self.bad_lines: list[bytes] = []
        self.stderr = bytearray()
        self._cond = threading.Condition()
        self._eof = False
        self._write_lock = threading.Lock()
        self._reading = threading.Event()
        self._reading.set()
        self._handlers: dict[str, dict[str, Callable[..., Any]]] = {}
        self._calls: queue.Queue[dict[str, Any] | None] = queue.Queue()
        # Sessions this driver opened and the pool has not said ended: as the Python client does, the first
        # request under a name says "open" (a code-only one opens a session too, as the protocol says: see
        # ``as_written``). A request that gives ``open`` itself (False too) is sent as it is.
        self.open_sessions: set[str] = set()
        self.as_written = as_written
        self.proc = subprocess.Popen(
            [*command, *self.args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            cwd=cwd, env=env if env is not None else os.environ.copy(), start_new_session=start_new_session,
        )
        with _live_lock:
            _live.add(self.proc.pid)
        self._threads = [
            threading.Thread(target=self._read_stdout, name="pool-stdout", daemon=True),
            threading.Thread(target=self._read_stderr, name="pool-stderr", daemon=True),
            threading.Thread(target=self._answer_calls, name="pool-calls", daemon=True),
        ]
        for thread in self._threads:
            thread.start()
        self.ready: dict[str, Any] = {}
        self._ended = False
        if expect_ready:
            try:
                first = self.wait_for(lambda m: True, timeout=60)
                if first.get("event") != "ready":
                    raise AssertionError(f"the first line is not the ready event: {first}")
                self.ready = first
            except BaseException:
                self.kill()
                raise

    @property
    def pid(self) -> int:
        return self.proc.pid

    # -- reading -------------------------------------------------------------------------------------------
    def _read_stdout(self) -> None:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        buffer = bytearray()
        while True:
            self._reading.wait()
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                break
            buffer += chunk
            *lines, rest = buffer.split(b"\n")
            buffer = bytearray(rest)
            for line in lines:
                self._add(line)
        if buffer:
            self.bad_lines.append(bytes(buffer))  # output must end with a newline
        with self._cond:
            self._eof = True
            self._cond.notify_all()
        self._calls.put(None)

    def _add(self, line: bytes | bytearray) -> None:
        try:
            message = json.loads(line)
        except ValueError:
            message = None
        if not isinstance(message, dict):
            self.bad_lines.append(bytes(line))
            return
        if message.get("session_ended") is True or message.get("closed") is True:
            self.open_sessions.discard(message.get("session"))
        with self._cond:
            self.messages.append(message)
            self._cond.notify_all()
        if message.get("event") == "call":
            self._calls.put(message)

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        fd = self.proc.stderr.fileno()
        while chunk := os.read(fd, 1 << 16):
            self.stderr += chunk

    def pause_reading(self) -> None:
        self._reading.clear()

    def resume_reading(self) -> None:
        self._reading.set()

    def wait_for(self, predicate: Callable[[dict[str, Any]], bool], timeout: float = DEADLINE,
                 start: int = 0) -> dict[str, Any]:
        """The first message (from index ``start``) matching ``predicate``; fails after ``timeout``."""
        end = time.monotonic() + timeout
        index = start
        with self._cond:
            while True:
                while index < len(self.messages):
                    message = self.messages[index]
                    index += 1
                    if predicate(message):
                        return message
                if self._eof:
                    raise PoolExited(f"the pool's stdout ended (exit {self.proc.poll()}) before a matching line; "
                                     f"stderr: {bytes(self.stderr[-2000:])!r}")
                left = end - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no matching line within {timeout}s; last lines: {self.messages[-5:]}")
                self._cond.wait(left)

    def quiet_for(self, predicate: Callable[[dict[str, Any]], bool], seconds: float) -> None:
        """Assert that no message matching ``predicate`` arrives within ``seconds``."""
        end = time.monotonic() + seconds
        with self._cond:
            while True:
                found = [m for m in self.messages if predicate(m)]
                assert not found, f"unexpected lines: {found}"
                left = end - time.monotonic()
                if left <= 0 or self._eof:
                    return
                self._cond.wait(left)

    def responses(self, request_id: object) -> list[dict[str, Any]]:
        """Every answer (not call or output events) carrying this id, so far."""
        with self._cond:
            return [m for m in self.messages if same_id(m.get("id"), request_id) and m.get("event") not in _EVENTS]

    def events(self, request_id: object) -> list[dict[str, Any]]:
        """The output events (stream, display_data) of this id so far, in the order the pool sent them."""
        with self._cond:
            return [m for m in self.messages if same_id(m.get("id"), request_id) and m.get("event") in _OUTPUT]

    def calls(self, request_id: object) -> list[dict[str, Any]]:
        with self._cond:
            return [m for m in self.messages if m.get("event") == "call" and same_id(m.get("id"), request_id)]

    def index_of(self, message: dict[str, Any]) -> int:
        with self._cond:
            return next(i for i, m in enumerate(self.messages) if m is message)

    def result(self, request_id: object, timeout: float = DEADLINE) -> dict[str, Any]:
        """The answer to ``request_id`` (a result, a stats event or a closed answer)."""
        return self.wait_for(lambda m: same_id(m.get("id"), request_id) and m.get("event") not in _EVENTS, timeout)

    # -- writing -------------------------------------------------------------------------------------------
    def send(self, message: dict[str, Any] | bytes) -> None:
        line = message if isinstance(message, bytes) else json.dumps(message).encode() + b"\n"
        assert self.proc.stdin is not None
        with self._write_lock:
            self.proc.stdin.write(line)
            self.proc.stdin.flush()

    def submit(self, host: dict[str, Callable[..., Any]] | None = None, /, **fields: Any) -> Any:
        """Send one request; ``host`` functions are declared (unless ``functions`` is given) and answered
        from here. Returns the request's id. (``host`` may be given by name too: a request has no such field.)"""
        host = fields.pop("host", host)
        request_id = fields.setdefault("id", new_id())
        session = fields.get("session")
        opens = (not self.as_written and not fields.get("close") and "open" not in fields
                 and session not in self.open_sessions)
        if isinstance(session, str) and opens:
            fields["open"] = True
            self.open_sessions.add(session)
        if host is not None:
            fields.setdefault("functions", list(host))
            self.handle_calls(request_id, host)
        self.send(fields)
        return request_id

    def run(self, code: str | None = None, /, **fields: Any) -> dict[str, Any]:
        """Submit a request and wait for its result: ``code``, then the request's fields, and the driver's own
        ``wait`` (seconds for the result) and ``host`` (see :meth:`submit`). Every keyword is ``Any``, so a
        test may pass a request's fields as one ``**dict``."""
        wait: float = fields.pop("wait", DEADLINE)
        host: dict[str, Callable[..., Any]] | None = fields.pop("host", None)
        if code is not None:
            fields["code"] = code
        return self.result(self.submit(host, **fields), timeout=wait)

    def stats(self) -> dict[str, Any]:
        answer = self.result(self.submit(stats=True))
        assert answer["event"] == "stats", answer
        return answer

    def reply(self, call_id: int, **body: Any) -> None:
        self.send({"reply": {"call_id": call_id, **body}})

    def handle_calls(self, request_id: object, functions: dict[str, Callable[..., Any]]) -> None:
        """Answer call events of ``request_id`` with these callables (an exception is an error reply)."""
        assert isinstance(request_id, str)
        self._handlers[request_id] = functions

    def _answer_calls(self) -> None:
        while (call := self._calls.get()) is not None:
            request_id = call.get("id")
            handlers = self._handlers.get(request_id) if isinstance(request_id, str) else None
            if handlers is None or call["function"] not in handlers:
                continue  # the test answers (or deliberately ignores) this one itself
            try:
                value = handlers[call["function"]](*call["args"], **call["kwargs"])
            except Exception as exc:
                body: dict[str, Any] = {"error": str(exc)}
            else:
                body = {"result": value}
            with contextlib.suppress(OSError):
                self.reply(call["call_id"], **body)

    # -- ending --------------------------------------------------------------------------------------------
    def tree(self) -> dict[int, int]:
        """The pool's live templates and jobs: pid -> depth (1 = a template, 2 = a job or session child).

        Children prepared ahead of their job and the zygote are left out (see READY_CHILD, ZYGOTE);
        :func:`descendants` has all."""
        table = proc_table()
        return {pid: depth for pid, depth in descendants(self.pid, table).items()
                if table[pid][3] not in (READY_CHILD, ZYGOTE)}

    def templates(self) -> list[int]:
        return sorted(pid for pid, depth in self.tree().items() if depth == 1)

    def prepared_children(self) -> int:
        """How many children wait prepared ahead of their job below this pool now."""
        table = proc_table()
        return sum(1 for pid in descendants(self.pid, table) if table[pid][3] == READY_CHILD)

    def await_prepared_children(self, count: int, timeout: float = DEADLINE) -> None:
        end = time.monotonic() + timeout
        while self.prepared_children() != count:
            assert time.monotonic() < end, f"{count} children prepared ahead never waited: {descendants(self.pid)}"
            time.sleep(0.02)

    def close_stdin(self) -> None:
        assert self.proc.stdin is not None
        with self._write_lock, contextlib.suppress(OSError):
            self.proc.stdin.close()

    def wait_exit(self, timeout: float = EXIT_DEADLINE) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            left = self.still_running()  # what it was waiting on, read before the kill ends it
            self.kill()
            raise AssertionError(f"the pool did not exit within {timeout}s; {left}; "
                                 f"stderr: {bytes(self.stderr[-2000:])!r}") from None

    def still_running(self) -> str:
        """The pool's threads and processes as they are now (state, kernel wait channel, name): what a pool that
        does not end is waiting on."""
        def wchan(pid: int, task: int) -> str:
            with contextlib.suppress(OSError):
                return procfs.read(pid, f"task/{task}/wchan") or "-"
            return "?"

        table = proc_table()
        threads = []
        for task in procfs.tasks(self.pid):
            with contextlib.suppress(OSError):
                threads.append(f"{procfs.read(self.pid, f'task/{task}/comm').strip()}:{wchan(self.pid, task)}")
        below = [f"{pid} (depth {depth}, {table[pid][3]}, {table[pid][1]}, {wchan(pid, pid)})"
                 for pid, depth in sorted(descendants(self.pid, table).items()) if pid in table]
        return f"its threads: {', '.join(threads) or 'none'}; below it: {', '.join(below) or 'nothing'}"

    def __enter__(self) -> PoolProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        # What a test's own `try: ... finally: pool.finish()` did: the pool ends however the block ends.
        self.finish()

    def finish(self, timeout: float = EXIT_DEADLINE) -> int:
        """EOF on stdin, wait for the exit, check that nothing is left behind; returns the exit status."""
        if self._ended:
            return self.proc.returncode
        self.resume_reading()
        self.close_stdin()
        status = self.wait_exit(timeout)
        self._end()
        return status

    def kill(self) -> None:
        """Last resort: SIGKILL the pool and everything below it."""
        if self._ended:
            return
        if self.proc.poll() is None:  # never signal a pid that may have been reused
            for pid in [*self.tree(), self.pid]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        self.resume_reading()
        self.proc.wait(10)
        self._end()

    def _end(self) -> None:
        self._ended = True
        for thread in self._threads:
            thread.join(10)
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        with _live_lock:
            _live.discard(self.pid)
        assert_no_leftovers()
        assert not self.bad_lines, f"the pool wrote lines that are not JSON objects: {self.bad_lines[:3]}"

    def log_lines(self) -> list[dict[str, Any]]:
        """stderr lines that are JSON objects (``--log=json``)."""
        lines = []
        for raw in bytes(self.stderr).splitlines():
            with contextlib.suppress(ValueError):
                value = json.loads(raw)
                if isinstance(value, dict):
                    lines.append(value)
        return lines


def sleeping_family(pool: PoolProcess, deadline: float = 30.0) -> None:
    """Give ``pool`` (two workers) a session ``nb`` holding ``x = 1`` whose next step, and two plain jobs, sleep a
    minute; returns once all three run (what a test that kills the pool, or part of it, then looks for). The
    session's process is there between its steps too, so the step is known to run by its first streamed output."""
    assert pool.run("x = 1", session="nb")["exit"] == 0
    step = pool.submit(session="nb", code="import time\nprint('started', flush=True)\ntime.sleep(60)", stream=True)
    for _ in range(2):
        pool.submit(code="import time\ntime.sleep(60)")
    end = time.monotonic() + deadline
    while not pool.events(step) or len(jobs_of(pool.pid)) != 3:
        assert time.monotonic() < end, f"two jobs and a session step were not running within {deadline}s"
        time.sleep(0.05)


@contextlib.contextmanager
def pool_process(*args: str, check_exit: bool = True, **kwargs: Any) -> Iterator[PoolProcess]:
    """A pool for one block: on exit, EOF, exit status 0 (if ``check_exit``) and no leftovers."""
    pool = PoolProcess(*args, **kwargs)
    try:
        yield pool
    except BaseException:
        if not pool._ended:
            pool.kill()
        raise
    status = pool.finish()
    if check_exit:
        assert status == 0, f"the pool exited {status}; stderr: {bytes(pool.stderr[-2000:])!r}"


def mark_live(pid: int) -> None:
    with _live_lock:
        _live.add(pid)


def unmark_live(pid: int) -> None:
    with _live_lock:
        _live.discard(pid)


def leftover_guard() -> Iterator[None]:
    """A package fixture body: the test process is a child subreaper while the package's tests run (so
    whatever a pool orphans is re-parented here), and nothing may be left running at the end.

    Each suite that drives real pools applies it: ``_subreaper = pytest.fixture(...)(leftover_guard)``."""
    set_child_subreaper(True)
    try:
        yield
        assert_no_leftovers()
    finally:
        set_child_subreaper(False)
        reap_adopted_zombies()
