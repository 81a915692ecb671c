"""A saturated pool is observable: stats on the pipe past a full queue, gauges, and the metrics socket.

Saturated means every worker busy and the queue full. The jobs that fill the pool wait for a gate file the
test creates, so "the stats arrived before the blocking jobs ended" is a fact of order, not a timing: no
blocking job can end before the test opens the gate, whatever the load of the machine.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .pool_driver import DEADLINE, PoolProcess, new_id, own_commands_env, pool_process

pytestmark = pytest.mark.timeout(120)

WORKERS = 1
QUEUE = 2 * WORKERS  # the protocol's queue: twice the workers


class Gate:
    """Jobs that say they started, then wait until the test opens the gate."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.root.mkdir()
        self.open_file = root / "open"

    def job(self, name: str) -> dict[str, Any]:
        code = (f"import os, time\nopen({str(self.root / name)!r}, 'w').close()\n"
                f"while not os.path.exists({str(self.open_file)!r}):\n    time.sleep(0.01)\n")
        return {"id": name, "code": code, "allow_write": [str(self.root)], "timeout": "60s"}

    def started(self, name: str) -> bool:
        return (self.root / name).exists()

    def wait_started(self, pool: PoolProcess, name: str) -> None:
        """Until the job's marker file exists, seen from outside (the pool says nothing while a job runs)."""
        end = time.monotonic() + DEADLINE
        while not self.started(name):
            assert not pool.responses(name), f"job {name} ended before it started: {pool.responses(name)}"
            assert time.monotonic() < end, f"job {name} did not start within {DEADLINE}s"
            time.sleep(0.02)

    def open(self) -> None:
        self.open_file.touch()


def _scrape(path: Path, route: str = "/metrics") -> tuple[int, str]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as peer:
        peer.settimeout(DEADLINE)
        peer.connect(str(path))
        peer.sendall(f"GET {route} HTTP/1.1\r\nHost: pynox\r\n\r\n".encode())
        answer = b""
        while chunk := peer.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), body.decode()


_SAMPLE = re.compile(r'^([a-z_]+)(?:\{([^}]*)\})? (\S+)$')


def _samples(text: str) -> dict[str, float]:
    """Every sample of an exposition, by name and labels as written (``name{a="b"}``); every line is a
    comment, a sample or empty, and every family has its HELP and TYPE before its samples."""
    samples: dict[str, float] = {}
    typed: set[str] = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            typed.add(line.split()[2])
            continue
        if not line or line.startswith("# HELP "):
            continue
        match = _SAMPLE.match(line)
        assert match is not None, f"not a sample line: {line!r}"
        name, labels, value = match.groups()
        family = re.sub(r"_(bucket|sum|count)$", "", name) if name not in typed else name
        assert family in typed, f"{name} has no TYPE line before it"
        samples[f"{name}{{{labels}}}" if labels else name] = float(value)
    return samples


@pytest.fixture
def gate(tmp_path: Path) -> Gate:
    return Gate(tmp_path / "gate")


@pytest.fixture
def socket_path(tmp_path: Path) -> Iterator[Path]:
    run = tmp_path / "run"
    run.mkdir()
    yield run / "metrics.sock"


def test_stats_on_the_pipe_are_answered_past_a_full_queue(tmp_path: Path, gate: Gate) -> None:
    with pool_process(f"--workers={WORKERS}", cwd=tmp_path) as pool:
        pool.submit(**gate.job("running"))
        gate.wait_started(pool, "running")
        # Every worker busy, the queue full, and one more job behind it: intake holds it.
        waiting = [pool.submit(**gate.job(f"queued-{i}")) for i in range(QUEUE + 1)]
        stats = pool.stats()
        assert not any(pool.responses(name) for name in ["running", *waiting]), "a blocking job ended"
        assert not any(gate.started(name) for name in waiting)
        assert (stats["busy_workers"], stats["queued"], stats["in_flight"]) == (WORKERS, QUEUE + 1, QUEUE + 2)
        assert stats["queue_capacity"] >= QUEUE + 1 and stats["workers"] == WORKERS
        assert stats["jobs"] == 0 and stats["draining"] is False
        assert stats["pid"] == pool.pid and stats["version"] == __import__("pynox").__version__
        gate.open()
        for name in ["running", *waiting]:
            assert pool.result(name)["exit"] == 0
        after = pool.stats()
        assert (after["busy_workers"], after["queued"], after["in_flight"], after["jobs"]) == (0, 0, 0, QUEUE + 2)
        assert pool.finish() == 0


def test_the_metrics_socket_answers_while_the_queue_is_full(tmp_path: Path, gate: Gate, socket_path: Path) -> None:
    config = tmp_path / "pynox.toml"
    config.write_text("[pool]\nmax_queued = 4\n")
    with pool_process(f"--workers={WORKERS}", f"--metrics-socket={socket_path}", f"--config={config}",
                      cwd=tmp_path) as pool:
        pool.submit(**gate.job("running"))
        gate.wait_started(pool, "running")
        capacity = pool.stats()["queue_capacity"]
        assert capacity == 4
        # More than the queue holds: the two beyond it are refused at once (see test_pool_admission.py).
        names = [pool.submit(**gate.job(f"queued-{i}")) for i in range(capacity + 2)]
        over, names = names[capacity:], names[:capacity]
        for name in over:
            assert "queue is full" in pool.result(name)["error"]["message"]
        samples = _samples(_scrape(socket_path)[1])
        assert not any(pool.responses(name) for name in ["running", *names]), "a blocking job ended"
        assert samples["pynox_workers_busy"] == WORKERS and samples["pynox_queue_depth"] == capacity
        assert samples["pynox_queue_capacity"] == capacity
        assert samples["pynox_in_flight"] == 1 + capacity
        assert samples["pynox_draining"] == 0 and samples['pynox_jobs_total{outcome="ok"}'] == 0
        assert f'pynox_info{{version="{__import__("pynox").__version__}",pid="{pool.pid}"}}' in samples
        assert _scrape(socket_path, "/readyz") == (200, "serving\n")
        gate.open()
        for name in ["running", *names]:
            assert pool.result(name)["exit"] == 0
        done = 1 + len(names)
        failed = pool.run("1/0")
        assert failed["error"]["type"] == "ZeroDivisionError"
        samples = _samples(_scrape(socket_path)[1])
        assert samples['pynox_jobs_total{outcome="ok"}'] == done
        assert samples['pynox_jobs_total{outcome="request_errors"}'] == len(over)
        assert samples['pynox_jobs_total{outcome="failed"}'] == 1
        assert samples['pynox_errors_total{type="ZeroDivisionError"}'] == 1
        assert samples["pynox_job_duration_seconds_count"] == done + 1
        assert samples['pynox_job_duration_seconds_bucket{le="+Inf"}'] == done + 1
        assert samples["pynox_queue_wait_seconds_count"] == done + 1
        # The jobs behind the gate waited at least as long as the running one held the only worker.
        assert samples['pynox_queue_wait_seconds_bucket{le="0.0001"}'] <= 2
        assert (samples["pynox_workers_busy"], samples["pynox_queue_depth"], samples["pynox_in_flight"]) == (0, 0, 0)
        stats = pool.stats()
        assert stats["duration_seconds"]["count"] == done + 1 and stats["ok"] == done
        assert pool.finish() == 0
    assert not socket_path.exists()


def test_health_says_serving_then_draining(tmp_path: Path, gate: Gate, socket_path: Path) -> None:
    def health(*flags: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "pynox", "health", str(socket_path), *flags],
                              capture_output=True, text=True, timeout=DEADLINE, env=own_commands_env())

    with pool_process(f"--metrics-socket={socket_path}", cwd=tmp_path) as pool:
        serving = health()
        assert (serving.returncode, serving.stdout) == (0, "serving\n"), serving
        pool.submit(**gate.job("running"))
        gate.wait_started(pool, "running")
        pool.close_stdin()  # EOF: the pool drains the job it holds
        end = time.monotonic() + DEADLINE
        while _scrape(socket_path, "/readyz")[0] != 503:  # the pool has read the EOF
            assert time.monotonic() < end, "the pool never said it drains"
            time.sleep(0.05)
        draining = health()
        assert (draining.returncode, draining.stdout) == (1, "draining\n"), draining
        assert health("--live").returncode == 0
        assert _samples(_scrape(socket_path)[1])["pynox_draining"] == 1
        gate.open()
        assert pool.result("running")["exit"] == 0
        assert pool.finish() == 0
    gone = health()
    assert gone.returncode == 1 and "No such file" in gone.stderr, gone


def test_only_the_pools_user_may_connect(tmp_path: Path, socket_path: Path) -> None:
    with pool_process(f"--metrics-socket={socket_path}", cwd=tmp_path) as pool:
        mode = os.stat(socket_path).st_mode
        assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o600
        assert _scrape(socket_path, "/livez") == (200, "ok\n")  # the control: its own user connects
        pool.finish()


def _connect_as(uid: int, path: Path) -> int:
    """0 if a process of ``uid`` connects to ``path``, 13 if it is refused (EACCES), 1 on anything else. A fork
    of this process rather than a new interpreter, which that user may not be allowed to read."""
    with warnings.catch_warnings():
        # Python 3.12 on warns of a fork in a threaded process; this child makes system calls only.
        warnings.simplefilter("ignore", DeprecationWarning)
        child = os.fork()
    if child == 0:  # only system calls until _exit: the forked copy of a threaded process must not do more
        status = 1
        try:
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            socket.socket(socket.AF_UNIX, socket.SOCK_STREAM).connect(str(path))
            status = 0
        except PermissionError:
            status = 13
        finally:
            os._exit(status)
    return os.waitstatus_to_exitcode(os.waitpid(child, 0)[1])


@pytest.mark.needs_root("the test connects as another user, which only root can become")
def test_another_user_cannot_connect(tmp_path_factory: pytest.TempPathFactory) -> None:
    # A directory anyone may pass through, so that only the socket's own mode decides.
    run = Path(tempfile.mkdtemp(prefix="pynox-metrics-"))
    try:
        run.chmod(0o755)
        path = run / "metrics.sock"
        with pool_process(f"--metrics-socket={path}", cwd=tmp_path_factory.mktemp("cwd")) as pool:
            assert _connect_as(65534, path) == 13
            path.chmod(0o666)  # the control: the same user connects once the mode lets it
            assert _connect_as(65534, path) == 0
            pool.finish()
    finally:
        shutil.rmtree(run, ignore_errors=True)


def test_a_job_cannot_reach_the_metrics_socket(tmp_path: Path, socket_path: Path) -> None:
    connect = (f"import socket\ns = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
               f"s.connect({str(socket_path)!r})\ns.sendall(b'GET /stats HTTP/1.0\\r\\n\\r\\n')\n"
               "print(s.recv(65536).decode())\n")
    with pool_process(f"--metrics-socket={socket_path}", cwd=tmp_path) as pool:
        # The control: the same code, unconfined, reads the pool's stats.
        control = subprocess.run([sys.executable, "-c", connect], capture_output=True, text=True, timeout=DEADLINE)
        assert control.returncode == 0 and '"event":"stats"' in control.stdout, control
        before = pool.stats()
        # Even with the network and its directory granted, a job gets no unix socket to connect with.
        job = pool.run(connect, allow_network=True, allow_read=[str(socket_path.parent)])
        assert job["error"]["type"] == "PermissionError" and job["stdout"] == "", job
        # From outside: the socket is still the pool's, and it answered nobody but the control.
        assert _scrape(socket_path, "/livez") == (200, "ok\n") and before["jobs"] + 1 == pool.stats()["jobs"]
        pool.finish()


@pytest.mark.parametrize("grant", ["dir", "socket"])
def test_a_write_grant_over_the_metrics_socket_is_refused(tmp_path: Path, socket_path: Path, grant: str) -> None:
    target = socket_path.parent if grant == "dir" else socket_path
    remove = f"import os\nos.unlink({str(socket_path)!r})\n"
    with pool_process(f"--metrics-socket={socket_path}", cwd=tmp_path) as pool:
        result = pool.run(remove, allow_write=[str(target)])
        assert result["error"]["type"] == "RequestError" and "metrics socket" in result["error"]["message"], result
        assert socket_path.exists() and _scrape(socket_path, "/livez")[0] == 200  # seen from outside
        # The control: a directory beside it may be granted, and a job can remove what it holds there.
        beside = tmp_path / "beside"
        beside.mkdir()
        (beside / "file").touch()
        removed = pool.run(f"import os\nos.unlink({str(beside / 'file')!r})", allow_write=[str(beside)])
        assert removed["exit"] == 0 and not (beside / "file").exists()
        pool.finish()


def test_a_socket_in_use_stops_the_pool_and_a_stale_one_is_replaced(tmp_path: Path, socket_path: Path) -> None:
    with pool_process(f"--metrics-socket={socket_path}", cwd=tmp_path) as first:
        second = PoolProcess(f"--metrics-socket={socket_path}", cwd=tmp_path, expect_ready=False)
        error = second.wait_for(lambda m: True)
        assert error["event"] == "error" and "another process is listening" in error["error"]["message"], error
        assert second.wait_exit() == 1
        second.finish()
        assert _scrape(socket_path, "/livez")[0] == 200  # the first pool's socket was left alone
        first.finish()
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(socket_path))
    stale.close()  # a socket file nobody listens on, as a pool killed with SIGKILL leaves
    with pool_process(f"--metrics-socket={socket_path}", cwd=tmp_path) as pool:
        assert _scrape(socket_path, "/readyz") == (200, "serving\n")
        pool.finish()
    socket_path.write_text("not a socket")
    refused = PoolProcess(f"--metrics-socket={socket_path}", cwd=tmp_path, expect_ready=False)
    error = refused.wait_for(lambda m: True)
    assert "not a socket" in error["error"]["message"] and refused.wait_exit() == 1
    refused.finish()
    assert socket_path.read_text() == "not a socket"


def test_unknown_routes_and_methods(tmp_path: Path, socket_path: Path) -> None:
    with pool_process(f"--metrics-socket={socket_path}", cwd=tmp_path) as pool:
        assert _scrape(socket_path, "/nothing")[0] == 404
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as peer:
            peer.settimeout(DEADLINE)
            peer.connect(str(socket_path))
            peer.sendall(b"POST /metrics HTTP/1.0\r\n\r\n")
            assert peer.recv(65536).split()[1] == b"405"
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as peer:  # a peer that never sends is dropped
            peer.settimeout(DEADLINE)
            peer.connect(str(socket_path))
            assert peer.recv(65536) == b""
        assert pool.run("print(1)", id=new_id())["stdout"] == "1\n"
        pool.finish()


def test_template_restarts_are_counted(tmp_path: Path, socket_path: Path) -> None:
    with pool_process("--workers=1", f"--metrics-socket={socket_path}", cwd=tmp_path) as pool:
        assert pool.stats()["template_restarts"] == 0
        [template] = pool.templates()
        os.kill(template, signal.SIGKILL)
        assert pool.run("print(1)")["stdout"] == "1\n"  # on a replacement
        assert pool.templates() != [template]
        assert pool.stats()["template_restarts"] == 1
        assert _samples(_scrape(socket_path)[1])["pynox_template_restarts_total"] == 1
        pool.finish()


def test_session_steps_are_in_flight_against_max_sessions(tmp_path: Path, gate: Gate) -> None:
    with pool_process("--workers=1", "--max-sessions=3", cwd=tmp_path) as pool:
        job = gate.job("step")
        pool.submit(session="nb", **job)
        gate.wait_started(pool, "step")
        stats = pool.stats()
        assert (stats["sessions_active"], stats["max_sessions"], stats["in_flight"]) == (1, 3, 1)
        assert (stats["busy_workers"], stats["queued"]) == (0, 0)  # a session has its own process, not a worker
        gate.open()
        assert pool.result("step")["exit"] == 0
        assert pool.stats()["in_flight"] == 0
        pool.run(session="nb", close=True)
        assert pool.stats()["sessions_active"] == 0
        pool.finish()


def test_a_cancel_just_behind_a_full_queue_is_answered_at_once(tmp_path: Path, gate: Gate) -> None:
    with pool_process(f"--workers={WORKERS}", cwd=tmp_path) as pool:
        pool.submit(**gate.job("running"))
        gate.wait_started(pool, "running")
        waiting = [pool.submit(**gate.job(f"queued-{i}")) for i in range(QUEUE + 1)]
        cancel = pool.submit(cancel=waiting[-1])
        assert pool.result(cancel) == {"id": cancel, "cancelled": waiting[-1]}
        assert pool.result(waiting[-1])["error"]["type"] == "CancelledError"
        assert not any(pool.responses(name) for name in ["running", *waiting[:-1]]), "a blocking job ended"
        gate.open()
        for name in ["running", *waiting[:-1]]:
            assert pool.result(name)["exit"] == 0
        assert not gate.started(waiting[-1])  # seen from outside: the cancelled job never ran
        pool.finish()


def test_a_host_reply_just_behind_a_full_queue_reaches_its_job(tmp_path: Path, gate: Gate) -> None:
    """The reply a running job waits for is written after the jobs that fill the queue: intake must read past
    them, or the job waits for its reply until its timeout while the jobs behind it wait for the job."""
    call_now = gate.root / "call-now"
    code = (f"import os, time\nfrom pynox_host import lookup\nopen({str(gate.root / 'caller')!r}, 'w').close()\n"
            f"while not os.path.exists({str(call_now)!r}):\n    time.sleep(0.01)\nprint(lookup('k'))\n")
    with pool_process(f"--workers={WORKERS}", cwd=tmp_path) as pool:
        caller = pool.submit(host={"lookup": lambda key: f"value of {key}"}, id="caller", code=code,
                             allow_write=[str(gate.root)], timeout="20s")
        gate.wait_started(pool, "caller")
        waiting = [pool.submit(**gate.job(f"queued-{i}")) for i in range(QUEUE + 1)]
        call_now.touch()  # the call, and so its reply, come after every line above
        result = pool.result(caller)
        assert (result["exit"], result["stdout"]) == (0, "value of k\n"), result
        assert not any(pool.responses(name) for name in waiting), "a blocking job ended"
        gate.open()
        for name in waiting:
            assert pool.result(name)["exit"] == 0
        pool.finish()
