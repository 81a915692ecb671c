"""The shutdown and signal contract, with signals sent as each supervisor sends them.

- to the pool's pid alone (``kill``, Docker and Kubernetes to a container's PID 1, supervisord by default);
- to its process group (supervisord ``stopasgroup``/``killasgroup``, Ctrl-C in a terminal);
- to every process of its cgroup (systemd's default ``KillMode=control-group``): simulated by signalling
  every process of the pool's tree, templates, jobs and children prepared ahead included, which is what
  systemd does to every pid of the unit's cgroup.

Each test checks from outside what became of every accepted line: it ran to its end, or the pool refused
it with ``refused: true`` saying it is shutting down; and the pool's exit status says whether the drain
was complete.
"""

from __future__ import annotations

import contextlib
import json
import os
import pty
import select
import shlex
import shutil
import signal
import termios
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest

from tests.harness import procfs
from tests.setup_facts import OUTER_SECCOMP

from .pool_driver import (
    DEADLINE,
    POOL,
    PoolProcess,
    assert_no_leftovers,
    descendants,
    jobs_of,
    mark_live,
    refused,
    unmark_live,
    wait_gone,
)

DRAIN_CUT = 75  # the pool's exit status when its drain was cut short (see docs/reliability.md)


def _deliver(pool: PoolProcess, signum: int, how: str) -> None:
    if how == "pid":
        os.kill(pool.pid, signum)
    elif how == "group":
        os.killpg(pool.pid, signum)
    elif how == "cgroup-fs":  # what systemd does: every pid its cgroup (and those below) lists
        assert isinstance(pool, _PoolInCgroup) and pool.cgroup is not None
        for pid in _cgroup_pids(pool.cgroup):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)
    else:  # "cgroup": every process of the pool's tree, as systemd's KillMode=control-group does
        for pid in [pool.pid, *descendants(pool.pid)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)


def _cgroup_pids(path: str) -> list[int]:
    pids = []
    for directory, _, _ in os.walk(path):
        with open(os.path.join(directory, "cgroup.procs")) as procs:
            pids += [int(line) for line in procs if line.strip()]
    return pids


def _tracking_hierarchy() -> str | None:
    """A cgroup hierarchy that only tracks membership, as systemd's own does: cgroup2 (unified), else the
    v1 name=systemd one."""
    found = {fields[2]: fields[1] for fields in (line.split() for line in procfs.machine("mounts").splitlines())
             if fields[2] == "cgroup2" or (fields[2] == "cgroup" and "name=systemd" in fields[3])}
    return found.get("cgroup2") or found.get("cgroup")


class _PoolInCgroup(PoolProcess):
    """A pool started in a cgroup of its own, as systemd starts a unit's main process."""

    cgroup: str | None = None

    def __init__(self, *args: str, cwd: Path) -> None:
        hierarchy = _tracking_hierarchy()
        assert hierarchy is not None
        self.cgroup = os.path.join(hierarchy, f"pynox-signals-test-{os.getpid()}")
        os.makedirs(self.cgroup, exist_ok=True)
        # The pool enters it before its first instruction: a shell puts itself there, then becomes the pool.
        enter = f"echo $$ > {shlex.quote(self.cgroup)}/cgroup.procs && exec \"$@\""
        super().__init__(*args, cwd=cwd, start_new_session=True, command=["sh", "-c", enter, "sh", *POOL])

    def remove_cgroup(self) -> None:
        if self.cgroup is not None:
            with contextlib.suppress(OSError):
                os.rmdir(self.cgroup)


def _wait_running(pool: PoolProcess, count: int) -> list[int]:
    end = time.monotonic() + DEADLINE
    while time.monotonic() < end:
        if len(running := jobs_of(pool.pid)) >= count:
            return running
        time.sleep(0.02)
    raise AssertionError(f"{count} jobs did not start: {pool.tree()}")


def _only_answer(pool: PoolProcess, request_id: str) -> dict[str, Any]:
    answers = pool.responses(request_id)
    assert len(answers) == 1, (request_id, answers)
    return answers[0]


def _shutting_down(result: dict[str, Any]) -> None:
    refused(result, "shutting down")
    assert result["refused"] is True, result


_IN_A_CGROUP = pytest.param("cgroup-fs", marks=[
    pytest.mark.needs_root("making a cgroup needs root"),
    pytest.mark.skipif(_tracking_hierarchy() is None, reason="no cgroup2 nor name=systemd hierarchy mounted")])


@pytest.mark.parametrize("how", ["pid", "group", "cgroup", _IN_A_CGROUP])
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_drains_every_accepted_job_however_it_is_delivered(tmp_path: Path, how: str,
                                                                        signum: int) -> None:
    pool = (_PoolInCgroup("--workers=2", cwd=tmp_path) if how == "cgroup-fs"
            else PoolProcess("--workers=2", cwd=tmp_path, start_new_session=True))
    try:
        assert pool.run("x = 'open'", session="nb")["exit"] == 0
        running = [pool.submit(code=f"import time\ntime.sleep(1.5)\nprint('done {i}')") for i in range(2)]
        queued = [pool.submit(code=f"print({i})") for i in range(3)]
        step = pool.submit(session="nb", code="import time\ntime.sleep(0.3)\nprint(x)")
        pool.stats()  # answered after the lines before it were read: they are accepted
        _wait_running(pool, 3)  # both jobs and the session's step
        templates = pool.templates()
        if how == "cgroup-fs":  # the whole tree is in the cgroup: the delivery reaches every process
            assert isinstance(pool, _PoolInCgroup) and pool.cgroup is not None
            assert {pool.pid, *pool.tree()} <= set(_cgroup_pids(pool.cgroup))
        _deliver(pool, signum, how)
        time.sleep(0.3)
        # The templates did not die of it (they ignore it: the pool decides how jobs end).
        assert set(templates) <= set(pool.templates()), (templates, pool.tree())
        status = pool.wait_exit()
        assert [_only_answer(pool, i)["stdout"] for i in running] == ["done 0\n", "done 1\n"]
        assert [_only_answer(pool, i)["stdout"] for i in queued] == ["0\n", "1\n", "2\n"]
        assert _only_answer(pool, step)["stdout"] == "open\n"
        assert status == 0, bytes(pool.stderr)
    finally:
        pool.finish()
        if isinstance(pool, _PoolInCgroup):
            pool.remove_cgroup()


def test_300_lines_then_sigterm_every_line_is_answered_once(tmp_path: Path) -> None:
    """300 lines then SIGTERM: each is answered once, run or refused (how many the pool read before the signal
    is a race it may win whole: it reads every line as it arrives). Lines written once it drains are refused."""
    with PoolProcess("--workers=2", "--log=json", cwd=tmp_path) as pool:
        ids = [f"l{i}" for i in range(300)]
        lines = b"".join(json.dumps({"id": i, "code": f"import time\ntime.sleep(0.02)\nprint({n})"}).encode()
                         + b"\n" for n, i in enumerate(ids))
        pool.send(lines)
        pool.proc.send_signal(signal.SIGTERM)
        end = time.monotonic() + DEADLINE
        while not any(line.get("event") == "drain" for line in pool.log_lines()):
            assert time.monotonic() < end, bytes(pool.stderr)
            time.sleep(0.005)
        late = [f"late{i}" for i in range(10)]  # 300 jobs of 20 ms on 2 workers: the drain lasts seconds
        pool.send(b"".join(json.dumps({"id": i, "code": "print('late')"}).encode() + b"\n" for i in late))
        status = pool.wait_exit()
        ran = refusals = 0
        for n, request_id in enumerate(ids):
            answer = _only_answer(pool, request_id)
            if answer.get("refused"):
                _shutting_down(answer)
                refusals += 1
            else:
                assert answer["stdout"] == f"{n}\n", answer
                ran += 1
        assert ran + refusals == 300, (ran, refusals)
        for request_id in late:
            _shutting_down(_only_answer(pool, request_id))
        assert status == 0, bytes(pool.stderr)  # everything accepted to run ran


def test_requests_sent_during_the_drain_are_refused_and_stats_still_answered(tmp_path: Path) -> None:
    with PoolProcess("--workers=1", cwd=tmp_path) as pool:
        running = pool.submit(code="import time\ntime.sleep(1.5)\nprint('done')")
        _wait_running(pool, 1)
        pool.proc.send_signal(signal.SIGTERM)
        time.sleep(0.2)
        late = pool.submit(code="print('late')")
        _shutting_down(pool.result(late))
        step = pool.submit(session="late", code="print('late')")
        _shutting_down(pool.result(step))
        assert pool.stats()["event"] == "stats"
        assert pool.result(running)["stdout"] == "done\n"
        assert pool.wait_exit() == 0


def test_the_drain_deadline_stops_running_jobs_and_refuses_queued_ones(tmp_path: Path) -> None:
    with PoolProcess("--workers=1", "--drain-timeout=1s", cwd=tmp_path) as pool:
        running = pool.submit(code="import time\ntime.sleep(30)\nprint('done')", timeout="60s")
        queued = [pool.submit(code="print('queued')") for _ in range(2)]
        pool.stats()
        _wait_running(pool, 1)
        family = [pool.pid, *descendants(pool.pid)]
        signalled = time.monotonic()
        pool.proc.send_signal(signal.SIGTERM)
        stopped = pool.result(running, timeout=10)
        took = time.monotonic() - signalled
        assert stopped["error"]["type"] == "CancelledError" and "drain" in stopped["error"]["message"], stopped
        assert stopped["stdout"] == ""
        assert 0.9 < took < 5, took
        for request_id in queued:
            _shutting_down(_only_answer(pool, request_id) if pool.responses(request_id) else pool.result(request_id))
        assert pool.wait_exit() == DRAIN_CUT
        assert wait_gone(family, 5) == []


@pytest.mark.parametrize("second", [signal.SIGTERM, signal.SIGINT])
def test_a_second_signal_escalates_at_once(tmp_path: Path, second: int) -> None:
    with PoolProcess("--workers=1", "--drain-timeout=60s", cwd=tmp_path) as pool:
        running = pool.submit(code="import time\ntime.sleep(30)\nprint('done')", timeout="60s")
        _wait_running(pool, 1)
        pool.proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        pool.quiet_for(lambda m: m.get("id") == running, 0.3)  # still draining: the job runs on
        signalled = time.monotonic()
        pool.proc.send_signal(second)
        stopped = pool.result(running, timeout=10)
        assert time.monotonic() - signalled < 5
        assert stopped["error"]["type"] == "CancelledError", stopped
        assert pool.wait_exit() == DRAIN_CUT


@pytest.mark.parametrize("how", ["pid", "group", "cgroup"])
def test_sighup_is_ignored_and_every_accepted_request_is_answered(tmp_path: Path, how: str) -> None:
    with PoolProcess("--workers=2", "--log=json", cwd=tmp_path, start_new_session=True) as pool:
        ids = [pool.submit(code=f"import time\ntime.sleep(0.3)\nprint({i})") for i in range(11)]
        pool.stats()
        _wait_running(pool, 2)
        templates = pool.templates()
        _deliver(pool, signal.SIGHUP, how)
        assert [pool.result(i)["stdout"] for i in ids] == [f"{i}\n" for i in range(11)]
        assert pool.proc.poll() is None
        assert set(templates) <= set(pool.templates())
        assert pool.run("print('after')")["stdout"] == "after\n"
        assert pool.finish() == 0
        events = [line for line in pool.log_lines() if line.get("event") == "signal"]
        assert events and "SIGHUP" in events[0]["message"] and "ignored" in events[0]["message"], events


# --- the pool as PID 1 ----------------------------------------------------------------------------------


_IN_NAMESPACE = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child"]
# A container's seccomp profile refuses unshare(CLONE_NEWPID) to the test itself: there is no namespace to make.
_NAMESPACES_REFUSED = pytest.mark.skipif(OUTER_SECCOMP or shutil.which("unshare") is None,
                                         reason="no unshare here, or this run's own seccomp filter refuses it")


@_NAMESPACES_REFUSED
@pytest.mark.needs_root("unshare --pid needs CAP_SYS_ADMIN")
def test_the_pool_runs_as_pid_1_of_a_pid_namespace(tmp_path: Path) -> None:
    with PoolProcess("--workers=2", cwd=tmp_path, command=[*_IN_NAMESPACE, *POOL]) as pool:
        result = pool.run("import os\nprint(os.getpid() > 1)")
        assert result["stdout"] == "True\n", result
        assert pool.run("y = 2", session="ns")["exit"] == 0
        assert pool.run("print(y * 21)", session="ns")["stdout"] == "42\n"
        assert pool.finish() == 0


@_NAMESPACES_REFUSED
@pytest.mark.needs_root("unshare --pid needs CAP_SYS_ADMIN")
def test_pid_1_drains_on_sigterm_and_reaps_the_orphans_of_a_killed_template(tmp_path: Path) -> None:
    with PoolProcess("--workers=2", cwd=tmp_path, command=[*_IN_NAMESPACE, *POOL]) as pool:
        init = next(pid for pid, depth in descendants(pool.pid).items() if depth == 1)  # the namespace's PID 1
        # A template killed under its running job: the job's child is orphaned to PID 1, which must reap it.
        victim_job = pool.submit(code="import time\ntime.sleep(30)", timeout="60s")
        job = _wait_running_below(init, 1)[0]
        template = _parent(job)
        os.kill(template, signal.SIGKILL)
        assert pool.result(victim_job)["error"]["type"] == "PoolWorkerError"
        end = time.monotonic() + 5
        while time.monotonic() < end and any(state == "Z" for state in _children_states(init)):
            time.sleep(0.05)
        assert not [s for s in _children_states(init) if s == "Z"], "PID 1 left zombies unreaped"
        running = pool.submit(code="import time\ntime.sleep(1)\nprint('done')")
        _wait_running_below(init, 1)
        os.kill(init, signal.SIGTERM)  # docker stop, Kubernetes: the signal goes to PID 1 alone
        assert pool.result(running)["stdout"] == "done\n"
        assert pool.wait_exit() == 0


@_NAMESPACES_REFUSED
@pytest.mark.needs_root("unshare --pid needs CAP_SYS_ADMIN")
def test_when_the_pool_below_pid_1_dies_pid_1_exits_with_its_status_at_once(tmp_path: Path) -> None:
    pool = PoolProcess("--workers=1", cwd=tmp_path, command=[*_IN_NAMESPACE, *POOL])
    left: set[str] = set()
    try:
        running = pool.submit(code="import time\ntime.sleep(30)", timeout="60s")
        init = next(pid for pid, depth in descendants(pool.pid).items() if depth == 1)
        _wait_running_below(init, 1)
        server = next(pid for pid, depth in descendants(init).items() if depth == 1)
        left = _own_cgroups(descendants(server))
        os.kill(server, signal.SIGKILL)
        # PID 1 holds none of the pool's pipes: the client sees their end as soon as the pool is gone.
        assert pool.wait_exit(timeout=5) == 128 + signal.SIGKILL
        assert pool.responses(running) == []
    finally:
        pool.finish()
        # A pool killed by SIGKILL cannot remove its cgroups, named by its pid in the namespace: the next
        # pool in a namespace would have the same pid and find them there. (Issue 31's cgroup naming.)
        for path in sorted(left, key=len, reverse=True):
            with contextlib.suppress(OSError):
                os.rmdir(path)


def _own_cgroups(pids: Iterable[int]) -> set[str]:
    """The pids cgroups of these processes, and their parents below the root: pid-named ones of a pool."""
    paths: set[str] = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            for line in procfs.read(pid, "cgroup").splitlines():
                _, controllers, path = line.rstrip("\n").split(":", 2)
                if "pids" in controllers.split(",") and path.strip("/").startswith("pynox-"):
                    parts = path.strip("/").split("/")
                    paths.update(f"/sys/fs/cgroup/pids/{'/'.join(parts[:n])}" for n in range(1, len(parts) + 1))
    return paths


def _parent(pid: int) -> int:
    return procfs.stat(pid).ppid


def _children_states(pid: int) -> list[str]:
    states = []
    for entry in procfs.pids():
        with contextlib.suppress(OSError):
            fields = procfs.stat(entry).fields
            if int(fields[1]) == pid:
                states.append(fields[0])
    return states


def _wait_running_below(root: int, count: int) -> list[int]:
    end = time.monotonic() + DEADLINE
    while time.monotonic() < end:
        if len(running := jobs_of_below(root)) >= count:
            return running
        time.sleep(0.02)
    raise AssertionError(f"{count} jobs did not start below {root}")


def jobs_of_below(root: int) -> list[int]:
    """Jobs anywhere below ``root`` (in a namespace, the pool is one level further down)."""
    found = []
    for pid in descendants(root):
        with contextlib.suppress(OSError):
            if procfs.read(pid, "comm").strip() in ("pynox-job", "pynox-session"):
                found.append(pid)
    return found


def test_a_stop_signal_while_the_templates_start_waits_for_the_pool_then_drains_it(tmp_path: Path) -> None:
    with PoolProcess("--workers=2", "--preload=json,decimal", cwd=tmp_path, expect_ready=False) as pool:
        # Once the pool has blocked its signals (before that the default action applies: it is not running
        # yet), and before its templates are up.
        end = time.monotonic() + DEADLINE
        while not _blocks_sigterm(pool.pid) and time.monotonic() < end:
            time.sleep(0.005)
        assert not pool.messages, "ready before the signal: the test proves nothing"
        pool.proc.send_signal(signal.SIGTERM)
        assert pool.wait_exit() == 0
        assert pool.messages and pool.messages[0]["event"] == "ready", pool.messages


def _blocks_sigterm(pid: int) -> bool:
    """Whether the pool blocks SIGTERM as it does to wait for it, not for a moment: a process that starts a
    subprocess (Popen's child before its exec, ctypes looking for a library) blocks every signal around
    the fork, and dies of one that came then once it restores its mask. SIGUSR1 tells them apart."""
    if b"pynox\0pool" not in procfs.read_bytes(pid, "cmdline"):
        return False
    for line in procfs.read(pid, "status").splitlines():
        if line.startswith("SigBlk:"):
            blocked = int(line.split()[1], 16)
            return bool(blocked & (1 << (signal.SIGTERM - 1))) and not blocked & (1 << (signal.SIGUSR1 - 1))
    return False


@_NAMESPACES_REFUSED
@pytest.mark.needs_root("unshare --pid needs CAP_SYS_ADMIN")
def test_ctrl_c_on_the_terminal_of_a_pool_that_is_pid_1_drains_once(tmp_path: Path) -> None:
    """`docker run -it`: the terminal's SIGINT goes to its foreground process group. The pool holds the
    terminal in a group of its own, so it gets one SIGINT (a drain), not a second one forwarded by PID 1
    (which would stop the drain at once)."""
    pid, terminal = pty.fork()
    if pid == 0:  # pragma: no cover - the child execs at once
        attributes = termios.tcgetattr(0)
        attributes[3] &= ~termios.ECHO  # lflags: no echo of the requests; ISIG stays, so ^C is SIGINT
        termios.tcsetattr(0, termios.TCSANOW, attributes)
        os.chdir(tmp_path)
        os.execvp(_IN_NAMESPACE[0], [*_IN_NAMESPACE, *POOL, "--workers=1"])
    mark_live(pid)
    seen = bytearray()

    def read_until(predicate: Callable[[list[dict[str, Any]]], bool], timeout: float = DEADLINE,
                   must: bool = True) -> None:
        end = time.monotonic() + timeout
        while not predicate(_json_lines(seen)):
            if time.monotonic() > end:
                assert not must, bytes(seen)
                return
            ready, _, _ = select.select([terminal], [], [], 0.1)
            if ready:
                with contextlib.suppress(OSError):  # EIO: the terminal's last holder is gone
                    if not (chunk := os.read(terminal, 1 << 16)):
                        break
                    seen.extend(chunk)

    try:
        read_until(lambda lines: any(line.get("event") == "ready" for line in lines), timeout=60)
        os.write(terminal, b'{"id": "slow", "code": "import time\\ntime.sleep(1.5)\\nprint(\'done\')"}\n')
        read_until(lambda lines: False, timeout=0.7, must=False)  # it runs
        os.write(terminal, b"\x03")  # Ctrl-C
        read_until(lambda lines: any(line.get("id") == "slow" for line in lines))
        (result,) = [line for line in _json_lines(seen) if line.get("id") == "slow"]
        assert result["stdout"] == "done\n" and result["error"] is None, result
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        with contextlib.suppress(ChildProcessError, ProcessLookupError):
            if os.waitpid(pid, os.WNOHANG) == (0, 0):
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
        os.close(terminal)
        unmark_live(pid)
    assert_no_leftovers()


def _json_lines(raw: bytearray) -> list[dict[str, Any]]:
    lines = []
    for line in bytes(raw).replace(b"\r", b"").split(b"\n"):
        with contextlib.suppress(ValueError):
            if isinstance(value := json.loads(line), dict):
                lines.append(value)
    return lines
