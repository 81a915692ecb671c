"""``pynox pool --listen``: many clients on one pool, each connection's ids, sessions, cancels and host calls its
own, peers known by their credentials, a dropped connection's work ended; seen from outside the pool.

Two users: root (the test) and the unprivileged ``pynox-ci`` that CI's matrix uses, whose client runs as a
separate process under that uid (``listen_client.py``), so the pool sees two different peers.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness import procfs
from tests.harness.fixtures import passable_run_dir
from tests.harness.scrape import metrics_text

from .listen_client import ListenClient
from .pool_driver import DEADLINE, POOL, PoolProcess, pool_process, wait_gone

pytestmark = pytest.mark.timeout(240)

CLIENT = str(Path(__file__).with_name("listen_client.py"))
OTHER_USER = "pynox-ci"


def _other_uid() -> int:
    try:
        return pwd.getpwnam(OTHER_USER).pw_uid
    except KeyError:
        pytest.skip(f"no user {OTHER_USER} on this host (.ci/matrix creates it)")


def _as_other_user(path: Path, lines: list[dict[str, Any]], seconds: float = 30.0) -> list[dict[str, Any]]:
    """Run ``listen_client.py`` as pynox-ci: it sends ``lines`` and returns every line the pool wrote to it."""
    uid = _other_uid()
    # The client needs only the standard library: the system's interpreter, which that user may run (the test's
    # own may live where only root reads), with the script's source passed in.
    python = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin") or pytest.skip("no system python3")
    source = Path(CLIENT).read_text()
    done = subprocess.run([python, "-c", source, str(path), str(seconds)], user=uid, group=uid, extra_groups=[],
                          input="".join(json.dumps(line) + "\n" for line in lines), capture_output=True, text=True,
                          timeout=seconds + 30, cwd="/")
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def _stop(pool: PoolProcess) -> None:
    """A listening pool ends on SIGTERM (its stdin is not read): drained, exit 0, nothing left behind."""
    pool.proc.send_signal(signal.SIGTERM)
    assert pool.wait_exit() == 0
    pool.finish()


run_dir = passable_run_dir("pynox-listen-")


@pytest.fixture
def two_tenants(tmp_path: Path) -> Path:
    config = tmp_path / "pynox.toml"
    config.write_text(f'[tenants.ops]\nusers = ["root"]\n\n[tenants.ci]\nusers = ["{OTHER_USER}"]\nmax_jobs = 2\n')
    return config


@pytest.fixture
def listening(tmp_path: Path, run_dir: Path, two_tenants: Path) -> Iterator[tuple[PoolProcess, Path]]:
    if os.geteuid() != 0:
        pytest.skip("two users need a root test process")
    path = run_dir / "pool.sock"
    with pool_process("--workers=3", f"--listen=unix:{path}", f"--config={two_tenants}", cwd=tmp_path,
                      check_exit=False) as pool:
        yield pool, path
        _stop(pool)


def _gate(root: Path, name: str) -> str:
    return (f"import os, time\nopen({str(root / name)!r}, 'w').write(str(os.getpid()))\n"
            f"while not os.path.exists({str(root / 'open')!r}):\n    time.sleep(0.01)\n")


def _wait_file(path: Path) -> str:
    end = time.monotonic() + DEADLINE
    while not path.exists() or not path.read_text():
        assert time.monotonic() < end, f"{path} never appeared"
        time.sleep(0.02)
    return path.read_text()


def test_two_users_cannot_see_or_reach_each_other(tmp_path: Path, listening: tuple[PoolProcess, Path]) -> None:
    _, path = listening
    gate = tmp_path / "gate"
    gate.mkdir()
    mine = ListenClient(str(path))
    assert mine.wait_for(lambda m: True)["event"] == "ready"
    # Root's job holds a worker and waits on a host call; root's session holds a variable.
    mine.send(id="job", code=_gate(gate, "job"), allow_write=[str(gate)], timeout="60s")
    mine.send(id="s1", session="nb", open=True, code="secret = 'root-only'")
    assert mine.result("s1")["exit"] == 0
    mine.send(id="caller", functions=["lookup"], code="from pynox_host import lookup\nprint(lookup('k'))")
    call = mine.wait_for(lambda m: m.get("event") == "call")
    assert call["id"] == "caller"
    _wait_file(gate / "job")
    # The other user uses the same names: its own job "job", its own session "nb", a cancel of "job", a reply
    # to root's pending call. None of them reaches root's. (A step with only code would open a session of its
    # own under "nb"; "open": false says it is a later step, so the pool answers whether it holds one.)
    theirs = _as_other_user(path, [
        {"id": "c1", "cancel": "job"},
        {"id": "r1", "session": "nb", "code": "print(secret)", "open": False},
        {"reply": {"call_id": call["call_id"], "result": "forged"}},
        {"id": "job", "code": "print('their own job')"},
        {"id": "s2", "session": "nb", "open": True, "code": "print('their own session')"},
    ])
    assert theirs[0]["event"] == "ready"
    by_id: dict[Any, list[dict[str, Any]]] = {}
    for message in theirs[1:]:
        by_id.setdefault(message.get("id"), []).append(message)
    assert "no queued or running job has the id" in by_id["c1"][0]["error"]["message"]
    assert "no open session named 'nb'" in by_id["r1"][0]["error"]["message"]
    assert "no such call is pending on this connection" in by_id[None][0]["error"]["message"]
    assert by_id["job"][0]["stdout"] == "their own job\n"
    assert by_id["s2"][0]["stdout"] == "their own session\n"
    # Nothing of root's was seen by the other user, and root's work is untouched, seen from outside.
    assert all("root-only" not in json.dumps(message) and message.get("event") != "call" for message in theirs)
    assert procfs.exists(_wait_file(gate / 'job'))
    (gate / "open").touch()
    assert mine.result("job")["exit"] == 0
    mine.sock.sendall(json.dumps({"reply": {"call_id": call["call_id"], "result": "root's"}}).encode() + b"\n")
    assert mine.result("caller")["stdout"] == "root's\n"
    mine.send(id="s3", session="nb", code="print(secret)")
    assert mine.result("s3")["stdout"] == "root-only\n"
    assert not any(m.get("id") in ("c1", "r1", "s2") for m in mine.messages)
    mine.close()


def test_a_user_no_tenant_names_is_refused(tmp_path: Path, run_dir: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("two users need a root test process")
    config = tmp_path / "pynox.toml"
    config.write_text('[tenants.ops]\nusers = ["root"]\n')
    path = run_dir / "pool.sock"
    with pool_process("--workers=1", f"--listen=unix:{path}", f"--config={config}", cwd=tmp_path,
                      check_exit=False) as pool:
        [refusal] = _as_other_user(path, [{"id": 1, "code": "print(1)"}])
        assert refusal["event"] == "error" and "refuses your connection" in refusal["error"]["message"], refusal
        assert f"uid {_other_uid()}" in refusal["error"]["message"]
        control = ListenClient(str(path))  # root is a tenant
        control.wait_for(lambda m: True)
        control.send(id=1, code="print(1)")
        assert control.result(1)["stdout"] == "1\n"
        control.close()
        _stop(pool)


def test_a_dropped_connection_ends_its_jobs_and_fails_its_calls(tmp_path: Path, run_dir: Path) -> None:
    path = run_dir / "pool.sock"
    gate = tmp_path / "gate"
    gate.mkdir()
    calling = (f"import os, time\nfrom pynox_host import lookup, HostError\n"
               f"open({str(gate / 'caller-pid')!r}, 'w').write(str(os.getpid()))\n"
               f"try:\n    lookup('k')\nexcept HostError as exc:\n"
               # Whole or not at all (the cancel's kill may come between an open and its write): a rename.
               f"    open({str(gate / 'host-error.part')!r}, 'w').write(str(exc))\n"
               f"    os.rename({str(gate / 'host-error.part')!r}, {str(gate / 'host-error')!r})\n"
               "time.sleep(60)\n")
    with pool_process("--workers=2", f"--listen=unix:{path}", cwd=tmp_path, check_exit=False) as pool:
        client = ListenClient(str(path))
        client.wait_for(lambda m: True)
        client.send(id="held", code=_gate(gate, "held"), allow_write=[str(gate)], timeout="60s")
        client.send(id="caller", functions=["lookup"], code=calling, allow_write=[str(gate)], timeout="60s")
        client.send(id="nb", session="nb", open=True, code="x = 1")
        assert client.result("nb")["exit"] == 0
        client.wait_for(lambda m: m.get("event") == "call")
        held = int(_wait_file(gate / "held"))
        client.close()  # dropped: nobody will read their results
        # Seen from outside: both jobs' processes are gone. The caller's pending call is failed (HostError) just
        # before the cancel kills it, so whether it lived to write the message is a race; if it did, it says why.
        assert wait_gone([held], DEADLINE) == [], "the dropped connection's job still runs"
        assert wait_gone([int(_wait_file(gate / "caller-pid"))], DEADLINE) == []
        if (gate / "host-error").exists():
            assert "connection to the pool closed" in (gate / "host-error").read_text()
        # The pool serves the next client, with both workers free and the session gone.
        other = ListenClient(str(path))
        other.wait_for(lambda m: True)
        other.send(id="s", stats=True)
        end = time.monotonic() + DEADLINE
        while (stats := other.result("s"))["in_flight"] or stats["sessions_active"]:
            assert time.monotonic() < end, stats
            other.messages.clear()
            time.sleep(0.1)
            other.send(id="s", stats=True)
        assert stats["cancelled"] == 2, stats
        other.close()
        _stop(pool)


def test_one_tenant_saturating_does_not_delay_another(tmp_path: Path, listening: tuple[PoolProcess, Path]) -> None:
    """pynox-ci fills its max_jobs (2 of 3 workers) with 8 s jobs and asks for 38 more; root's small jobs, run
    while both of those still hold their workers (the stats say so before and after), wait no longer than on an
    idle pool's free worker."""
    _, path = listening
    lines = [{"id": f"ci-{i}", "code": "import time\ntime.sleep(8)", "timeout": "20s"} for i in range(40)]
    box: list[list[dict[str, Any]]] = []
    saturating = threading.Thread(target=lambda: box.append(_as_other_user(path, lines, seconds=30)))
    mine = ListenClient(str(path))
    mine.wait_for(lambda m: True)
    saturating.start()

    def busy(tag: str) -> int:
        mine.send(id=tag, stats=True)
        return int(mine.result(tag)["busy_workers"])

    end = time.monotonic() + DEADLINE
    while busy(f"before-{time.monotonic()}") < 2:
        assert time.monotonic() < end, "the other tenant's jobs never started"
        time.sleep(0.05)
    waits, rounds = [], []
    for i in range(20):
        sent = time.monotonic()
        mine.send(id=i, code="print(1)")
        result = mine.result(i)
        rounds.append(time.monotonic() - sent)
        waits.append(result["queue_us"] / 1e6)
    assert busy("after") == 2, "the other tenant's jobs ended during the measurement: it proves nothing"
    saturating.join(timeout=60)
    theirs = box[0][1:]
    ran = [m for m in theirs if m.get("exit") == 0]
    refused = [m for m in theirs if m.get("error") and "max_jobs" in m["error"]["message"]]
    assert ran and refused, "the other tenant did not saturate its share"
    p50_wait, p50_round = statistics.median(waits), statistics.median(rounds)
    print(f"\nroot p50 queue wait {p50_wait * 1e3:.1f} ms, p50 round trip {p50_round * 1e3:.1f} ms "
          f"while {OTHER_USER} ran {len(ran)} and was refused {len(refused)}")
    assert p50_wait < 0.25, waits  # never behind a 1 s job
    mine.close()


def test_the_python_client_connects(tmp_path: Path, run_dir: Path) -> None:
    from pynox import Pool

    path = run_dir / "pool.sock"
    with pool_process("--workers=2", f"--listen=unix:{path}", cwd=tmp_path, check_exit=False) as pool:
        with Pool(connect=f"unix:{path}") as first, Pool(connect=f"unix:{path}") as second:
            assert first.run("print(1)").stdout == "1\n"
            assert first.run("print(lookup('k'))", functions={"lookup": lambda k: f"v-{k}"},
                             host_globals="call").stdout == "v-k\n"
            a, b = first.session(), second.session()
            a.run("x = 'first'")
            b.run("x = 'second'")
            assert (a.run("x").return_value, b.run("x").return_value) == ("'first'", "'second'")
            assert first.stats()["sessions_active"] == 2
        _stop(pool)


def test_systemd_socket_activation(tmp_path: Path, run_dir: Path) -> None:
    """As systemd does: the socket is bound by the parent and handed over as descriptor 3, LISTEN_PID naming
    the pool's process."""
    path = run_dir / "activated.sock"
    wrapper = ("import os, socket, sys\n"
               "s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
               "s.bind(sys.argv[1]); s.listen(8)\n"
               "os.dup2(s.fileno(), 3) if s.fileno() != 3 else os.set_inheritable(3, True)\n"
               "os.environ.update(LISTEN_FDS='1', LISTEN_PID=str(os.getpid()))\n"
               "os.execv(sys.executable, [sys.executable, '-m', 'pynox', 'pool', *sys.argv[2:]])\n")
    pool = PoolProcess("--workers=1", "--listen=systemd", cwd=tmp_path,
                       command=[sys.executable, "-c", wrapper, str(path)])
    try:
        client = ListenClient(str(path))
        assert client.wait_for(lambda m: True)["event"] == "ready"
        client.send(id=1, code="import os\nprint(os.environ.get('LISTEN_FDS'))")
        assert client.result(1)["stdout"] == "None\n"  # not passed on to jobs
        client.close()
        _stop(pool)
        assert path.exists()  # systemd's socket: the pool does not remove it
    finally:
        pool.kill()
    refused = PoolProcess("--workers=1", "--listen=systemd", cwd=tmp_path, expect_ready=False)
    error = refused.wait_for(lambda m: True)
    assert "no socket was handed over" in error["error"]["message"], error
    assert refused.wait_exit() == 1
    refused.finish()


def test_a_connection_from_the_same_user_without_tenants(tmp_path: Path, run_dir: Path) -> None:
    """The control for the tenant rule: with no [tenants.NAME], the pool's own user is served."""
    path = run_dir / "pool.sock"
    with pool_process("--workers=1", f"--listen=unix:{path}", "--log=json", cwd=tmp_path, check_exit=False) as pool:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as raw:
            raw.connect(str(path))
            raw.sendall(b'{"id": 7, "code": "print(7)"}\n')
            lines = raw.makefile("rb")
            assert json.loads(lines.readline())["event"] == "ready"
            assert json.loads(lines.readline())["stdout"] == "7\n"
        _stop(pool)
    [job] = [line for line in pool.log_lines() if line.get("event") == "job"]
    assert job["tenant"] == "default"  # the tenant label of its connection


def _first_line(raw: socket.socket) -> dict[str, Any]:
    raw.settimeout(DEADLINE)
    line = raw.makefile("rb").readline()
    assert line, "the pool closed the connection without a line"
    return json.loads(line)


def test_connections_past_the_open_file_limit_are_refused_with_a_line(tmp_path: Path, run_dir: Path) -> None:
    """Connections are descriptors: under a low open-file limit the pool serves what leaves its jobs room, and
    answers each connection past it with a line saying so (before: past the limit a connection waited in the
    backlog for good, unanswered, while the accept loop spun on it), then serves again once one closes."""
    path = run_dir / "pool.sock"
    if shutil.which("prlimit") is None:
        pytest.skip("no prlimit(1) here")
    # 1100 descriptors, less what the pool keeps for its jobs and 100 sessions (~900): ~170 connections.
    command = ["prlimit", "--nofile=1100", *POOL]
    with pool_process("--workers=1", "--max-sessions=100", f"--listen=unix:{path}", cwd=tmp_path,
                      check_exit=False, command=command) as pool:
        served: list[socket.socket] = []
        refused = None
        try:
            while refused is None:
                assert len(served) < 1100, "no connection was refused under a limit of 1100 open files"
                raw = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                raw.connect(str(path))
                first = _first_line(raw)
                if first["event"] == "ready":
                    served.append(raw)
                else:
                    raw.close()
                    refused = first
            assert refused["event"] == "error" and refused["error"]["type"] == "PoolError", refused
            assert "open-file limit 1100" in refused["error"]["message"], refused
            assert served, "not even one connection was served"  # the control: under the limit, served
            ticks = procfs.stat(pool.proc.pid).cpu_ticks
            time.sleep(1.0)  # the refused client is gone: nothing is left for the pool to do
            assert procfs.stat(pool.proc.pid).cpu_ticks - ticks < 50, "the pool spins while at its limit"
            served.pop().close()
            deadline = time.monotonic() + DEADLINE
            while True:  # the connection's end is seen by its thread: a slot is free soon after
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as raw:
                    raw.connect(str(path))
                    first = _first_line(raw)
                    if first["event"] == "ready":
                        raw.sendall(b'{"id": 7, "code": "print(7)"}\n')
                        done = _first_line(raw)
                        assert done["stdout"] == "7\n", done["error"]
                        break
                assert time.monotonic() < deadline, first
                time.sleep(0.05)
        finally:
            for raw in served:
                raw.close()
        _stop(pool)


def _connections_until_refused(path: Path, most: int) -> tuple[list[socket.socket], dict[str, Any]]:
    """Connect until the pool refuses one (at most ``most`` + 1 tries): the served connections, and the refusal."""
    served: list[socket.socket] = []
    for _ in range(most + 1):
        raw = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        raw.connect(str(path))
        first = _first_line(raw)
        if first["event"] != "ready":
            raw.close()
            return served, first
        served.append(raw)
    for raw in served:
        raw.close()
    raise AssertionError(f"{most + 1} connections were all served")


def _served_again(path: Path) -> None:
    """Once a connection closed, its thread sees the end soon after and a new connection is served."""
    deadline = time.monotonic() + DEADLINE
    while True:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as raw:
            raw.connect(str(path))
            first = _first_line(raw)
            if first["event"] == "ready":
                raw.sendall(b'{"id": 7, "code": "print(7)"}\n')
                assert _first_line(raw)["stdout"] == "7\n"
                return
        assert time.monotonic() < deadline, first
        time.sleep(0.05)


@pytest.mark.parametrize("table", ["pool", "tenant"])
def test_connections_past_max_connections_are_refused_with_a_line(tmp_path: Path, run_dir: Path,
                                                                  table: str) -> None:
    """``[pool] max_connections`` bounds a listening pool's connections at once over every tenant, and a tenant's
    own ``max_connections`` its own: the one past either gets an error line and is closed, and once one closes
    a new one is served. The control: the connections up to the bound are served (and, for the tenant's bound,
    the pool's own default of 1,024 is far above it)."""
    path = run_dir / "pool.sock"
    config = tmp_path / "pynox.toml"
    config.write_text("[pool]\nmax_connections = 3\n" if table == "pool" else
                      f"[tenants.agents]\nuids = [{os.geteuid()}]\nmax_connections = 2\n")
    with pool_process("--workers=1", f"--listen=unix:{path}", f"--config={config}", cwd=tmp_path,
                      check_exit=False) as pool:
        served, refused = _connections_until_refused(path, 3)
        try:
            assert refused["event"] == "error" and refused["error"]["type"] == "PoolError", refused
            if table == "pool":
                assert len(served) == 3
                assert "serving as many connections as it serves at once (3," in refused["error"]["message"]
            else:
                assert len(served) == 2
                assert refused["error"]["message"] == ("tenant 'agents' has 2 connections open to this pool, its "
                                                       "max_connections; close one first")
            served.pop().close()
            _served_again(path)
        finally:
            for raw in served:
                raw.close()
        _stop(pool)


def test_a_connection_numbered_past_1024_is_served(tmp_path: Path, run_dir: Path) -> None:
    """Review of the open-file limit raised to the hard one: a connection's descriptor may now be numbered 1024
    or above, and each connection's reader waited with select.select, which refuses such a number
    (``ValueError``): the connection got its ready line and then no answer, its thread dead. The control: the
    first connection, numbered low, is served."""
    path = run_dir / "pool.sock"
    if shutil.which("prlimit") is None:
        pytest.skip("no prlimit(1) here")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 4096:
        pytest.skip(f"the test's own hard limit of open files ({hard}) is below 4096")
    resource.setrlimit(resource.RLIMIT_NOFILE, (4096, hard))
    command = ["prlimit", "--nofile=1024:4096", *POOL]  # a shell's soft limit, raised by the pool itself
    try:
        with pool_process("--workers=1", "--max-sessions=1", f"--listen=unix:{path}", cwd=tmp_path,
                          check_exit=False, command=command) as pool:
            held: list[socket.socket] = []
            try:
                for count in range(1024):  # the most a pool serves at once (listen._MOST_CONNECTIONS)
                    raw = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                    held.append(raw)
                    raw.connect(str(path))
                    assert _first_line(raw)["event"] == "ready", count
                    if count == 1023:  # the pool's own descriptors come first: this one is numbered past 1024
                        assert max(procfs.fds(pool.proc.pid)) >= 1024, "no connection numbered past 1024"
                    if count in (0, 1023):  # the first (the control) and the last
                        raw.sendall(b'{"id": 7, "code": "print(7)"}\n')
                        done = _first_line(raw)
                        assert done.get("stdout") == "7\n", (count, done)
            finally:
                for raw in held:
                    raw.close()
            _stop(pool)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_tenants_jobs_run_as_its_user(tmp_path: Path, run_dir: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("run_as needs a root pool")
    nobody = pwd.getpwnam("nobody")
    config = tmp_path / "pynox.toml"
    config.write_text(f'[tenants.ops]\nusers = ["root"]\n\n[tenants.ci]\nusers = ["{OTHER_USER}"]\nrun_as = "nobody"\n')
    path = run_dir / "pool.sock"
    code = "import os\nprint(os.getuid(), os.getgid())"
    with pool_process("--workers=1", f"--listen=unix:{path}", f"--config={config}", cwd=tmp_path,
                      check_exit=False) as pool:
        theirs = _as_other_user(path, [{"id": 1, "code": code}])
        assert theirs[1]["stdout"] == f"{nobody.pw_uid} {nobody.pw_gid}\n", theirs
        mine = ListenClient(str(path))  # the control: the other tenant's jobs run as the pool's user
        mine.wait_for(lambda m: True)
        mine.send(id=1, code=code)
        assert mine.result(1)["stdout"] == "0 0\n"
        mine.close()
        _stop(pool)


def test_a_forged_tag_in_a_bad_line_reaches_no_other_connection(tmp_path: Path, run_dir: Path) -> None:
    """The pool's own names for a connection's ids start with its tag; a line the pool cannot parse is answered
    with the id it recovers from it, and that answer goes to the line's sender whatever the id says."""
    path = run_dir / "pool.sock"
    gate = tmp_path / "gate"
    gate.mkdir()
    with pool_process("--workers=1", f"--listen=unix:{path}", cwd=tmp_path, check_exit=False) as pool:
        first = ListenClient(str(path))  # connection 1: its id 1 is "~1~1" inside the pool
        first.wait_for(lambda m: True)
        first.send(id=1, code=_gate(gate, "held"), allow_write=[str(gate)], timeout="60s")
        _wait_file(gate / "held")
        second = ListenClient(str(path))
        second.wait_for(lambda m: True)
        second.sock.sendall(b'{"id": "~1~1", "code": 5}\n')  # a bad request, with the other's inside id
        second.sock.sendall(b'{"id": "~1~1", "code": "' + b"x" * (1 << 21) + b'"}\n')  # a line too long
        second.sock.sendall(b'{"id": "~1~1", not json\n')
        end = time.monotonic() + DEADLINE
        while len(refusals := [m for m in second.messages if "exit" in m]) < 3:
            assert time.monotonic() < end, second.messages
            time.sleep(0.05)
        assert all(r["error"]["type"] == "RequestError" for r in refusals), refusals
        time.sleep(0.5)
        assert not [m for m in first.messages[1:]], first.messages  # nothing reached the first connection
        (gate / "open").touch()
        assert first.result(1)["exit"] == 0  # its one result, its own
        assert len([m for m in first.messages if m.get("id") == 1]) == 1
        first.close()
        second.close()
        _stop(pool)


def _scrape(path: Path) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The metrics socket's samples: (name, sorted labels) -> value."""
    samples = {}
    for line in metrics_text(path, DEADLINE).splitlines():
        if line and not line.startswith("#"):
            head, value = line.rsplit(" ", 1)
            name, _, inner = head.partition("{")
            labels = tuple(sorted((key, text) for key, text in re.findall(r'(\w+)="([^"]*)"', inner)))
            samples[(name, labels)] = float(value)
    return samples


def test_metrics_are_labelled_by_tenant_and_profile(tmp_path: Path, run_dir: Path) -> None:
    """Each tenant's results by profile and outcome on the metrics socket, as each client saw them; a session's
    steps under the profile it was opened with; the labelled counts add up to the pool's."""
    if os.geteuid() != 0:
        pytest.skip("two users need a root test process")
    config = tmp_path / "pynox.toml"
    config.write_text(f'[profiles.analysis]\ntimeout = "10s"\n\n[profiles.quick]\ntimeout = "5s"\n\n'
                      f'[tenants.ops]\nusers = ["root"]\n\n[tenants.ci]\nusers = ["{OTHER_USER}"]\n')
    path, metrics = run_dir / "pool.sock", run_dir / "metrics.sock"
    with pool_process("--workers=2", f"--listen=unix:{path}", f"--config={config}", f"--metrics-socket={metrics}",
                      "--log=json", cwd=tmp_path, check_exit=False) as pool:
        mine = ListenClient(str(path))
        mine.wait_for(lambda m: True)
        mine.send(id=1, code="print(1)", profile="analysis")
        mine.send(id=2, code="raise ValueError('no')")
        assert (mine.result(1)["exit"], mine.result(2)["exit"]) == (0, 1)
        mine.send(id=3, session="nb", code="x = 1", profile="analysis")
        assert mine.result(3)["exit"] == 0
        mine.send(id=4, session="nb", code="print(x)")
        assert mine.result(4)["stdout"] == "1\n"
        mine.send(id=5, code="print(1)", profile="no-such-profile")  # refused: a label is never a client's text
        assert mine.result(5)["exit"] == 2
        theirs = _as_other_user(path, [{"id": 1, "code": "print(1)", "profile": "quick"},
                                       {"id": 2, "code": "print(2)", "profile": "quick"},
                                       {"id": 3, "code": 5}])
        assert sorted(m["exit"] for m in theirs[1:]) == [0, 0, 2], theirs  # in completion order
        samples = _scrape(metrics)
        mine.close()
        _stop(pool)
    jobs = {(labels["tenant"], labels["profile"], labels["outcome"]): value
            for (name, pairs), value in samples.items() if name == "pynox_tenant_jobs_total" and value
            for labels in [dict(pairs)]}
    assert jobs == {("ops", "analysis", "ok"): 3, ("ops", "", "failed"): 1, ("ops", "", "request_errors"): 1,
                    ("ci", "quick", "ok"): 2, ("ci", "", "request_errors"): 1}, jobs
    for outcome in ("ok", "failed", "request_errors"):
        assert samples[("pynox_jobs_total", (("outcome", outcome),))] == sum(
            value for (_, _, counted), value in jobs.items() if counted == outcome)
    waits = {dict(pairs)["tenant"] + "/" + dict(pairs)["profile"]: value for (name, pairs), value in samples.items()
             if name == "pynox_tenant_queue_wait_seconds_count"}
    assert waits == {"ops/analysis": 3, "ops/": 1, "ci/quick": 2, "ci/": 0}, waits
    # The log lines say the same; the other user's dropped connection cost no refusal of its own.
    logged = sorted((line["tenant"], line["profile"] or "", line["exit"]) for line in pool.log_lines()
                    if line.get("event") == "job")
    assert logged == sorted([("ops", "analysis", 0)] * 3 + [("ops", "", 1), ("ops", "", 2), ("ci", "quick", 0),
                             ("ci", "quick", 0), ("ci", "", 2)]), logged


def test_a_profiles_jobs_and_sessions_run_as_its_user(tmp_path: Path) -> None:
    """[profiles.NAME] run_as: a job and a session naming the profile run as that user (its scratch directory its
    own to write); the control, a job naming no profile, runs as the pool's user. A stdin pool: no tenants."""
    if os.geteuid() != 0:
        pytest.skip("run_as needs a root pool")
    nobody = pwd.getpwnam("nobody")
    config = tmp_path / "pynox.toml"
    config.write_text('[profiles.low]\nrun_as = "nobody"\n\n[profiles.plain]\ntimeout = "5s"\n')
    code = "import os\nprint(os.getuid(), os.getgid())"
    with pool_process("--workers=1", f"--config={config}", cwd=tmp_path) as pool:
        assert pool.run(code, profile="low")["stdout"] == f"{nobody.pw_uid} {nobody.pw_gid}\n"
        assert pool.run(code)["stdout"] == "0 0\n"
        assert pool.run(code, profile="plain")["stdout"] == "0 0\n"
        opened = pool.run(code + "\nopen('out.txt', 'w').write('mine')", session="nb", profile="low", scratch=True)
        assert (opened["exit"], opened["stdout"]) == (0, f"{nobody.pw_uid} {nobody.pw_gid}\n"), opened
        assert pool.run(code, session="nb")["stdout"] == f"{nobody.pw_uid} {nobody.pw_gid}\n"
        assert pool.finish() == 0


def test_a_forks_copy_is_one_of_its_tenants_sessions(tmp_path: Path, run_dir: Path) -> None:
    """Through a listening pool the copy is the connection's session (its name comes back without the
    connection's tag) and counts against its tenant's max_sessions."""
    from pynox import Pool, RequestError

    config = tmp_path / "pynox.toml"
    config.write_text('[tenants.ops]\nusers = ["root"]\nmax_sessions = 2\n')
    if os.geteuid() != 0:
        pytest.skip("the tenant names root")
    path = run_dir / "pool.sock"
    with pool_process("--workers=1", f"--listen=unix:{path}", f"--config={config}", cwd=tmp_path,
                      check_exit=False) as pool:
        with Pool(connect=f"unix:{path}") as client, client.session() as original:
            original.run("x = 'root'").raise_for_error()
            copy = original.fork()
            copy.run("x = 'branch'").raise_for_error()
            assert (original.run("x").return_value, copy.run("x").return_value) == ("'root'", "'branch'")
            with pytest.raises(RequestError, match="tenant 'ops' has 2 sessions open, its max_sessions"):
                original.fork()
            copy.close()
            again = original.fork()
            assert again.run("x").return_value == "'root'"
        _stop(pool)


def _own_tenant(tmp_path: Path, max_jobs: int) -> Path:
    """A config whose one tenant, ``own``, is the test's own user, with ``max_jobs``."""
    config = tmp_path / "pynox.toml"
    config.write_text(f"[tenants.own]\nuids = [{os.geteuid()}]\nmax_jobs = {max_jobs}\n")
    return config


def _stats(path: Path) -> dict[str, Any]:
    client = ListenClient(str(path))
    client.wait_for(lambda m: True)
    client.send(id="stats", stats=True)
    stats = client.result("stats")
    client.close()
    return stats


def test_a_dropped_connection_is_read_no_more(tmp_path: Path, run_dir: Path) -> None:
    """A connection dropped because its results cannot be written (here: its client shut its own reading side,
    as a client that stopped reading does to the pool's outbox) is read no more: the lines its client goes on
    writing run nothing, and its tenant's max_jobs is not held by them. Before, the pool read on: each such job
    ran for nobody, its result had no connection to reach, and the tenant's count never came down: two of them
    and the tenant was refused for good ("has 2 jobs in flight")."""
    config = _own_tenant(tmp_path, max_jobs=2)
    ran = tmp_path / "ran"
    ran.mkdir()
    path = run_dir / "pool.sock"
    with pool_process("--workers=2", f"--listen=unix:{path}", f"--config={config}", cwd=tmp_path,
                      check_exit=False) as pool:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as raw:
            raw.connect(str(path))
            assert _first_line(raw)["event"] == "ready"
            raw.shutdown(socket.SHUT_RD)  # every line the pool writes to it from now on fails

            def job(number: int) -> bytes:
                code = f"open({str(ran / str(number))!r}, 'w').close()"
                return json.dumps({"id": number, "code": code, "allow_write": [str(ran)]}).encode() + b"\n"

            raw.sendall(job(0))  # runs; writing its result fails, and the connection is dropped
            end = time.monotonic() + DEADLINE
            while _stats(path)["jobs"] < 1:
                assert time.monotonic() < end, "the first job never ended"
                time.sleep(0.05)
            time.sleep(0.5)  # its result's write has failed by now
            for number in (1, 2, 3):
                try:
                    raw.sendall(job(number))
                except OSError:  # the pool closed it: as good
                    break
            time.sleep(1.0)
        assert sorted(os.listdir(ran)) == ["0"], "the pool ran jobs for a connection it had dropped"
        other = ListenClient(str(path))
        other.wait_for(lambda m: True)
        for number in (10, 11):
            other.send(id=number, code="print(1)")
        for number in (10, 11):
            result = other.result(number)
            assert result["exit"] == 0, result["error"]
        other.close()
        _stop(pool)


def test_a_sessions_file_requests_leave_its_tenants_max_jobs(tmp_path: Path, run_dir: Path) -> None:
    """A session's files, upload and download count among its tenant's requests in flight while they wait, and
    their answers (which carry no exit) end that. Before, each one held one of the tenant's max_jobs for good:
    after one listing, a tenant with max_jobs = 1 was refused every job and step until the pool restarted."""
    config = _own_tenant(tmp_path, max_jobs=1)
    path = run_dir / "pool.sock"
    with pool_process("--workers=1", f"--listen=unix:{path}", f"--config={config}", cwd=tmp_path,
                      check_exit=False) as pool:
        client = ListenClient(str(path))
        client.wait_for(lambda m: True)
        client.send(id="open", session="nb", open=True, scratch=True, code="open('a.txt', 'w').write('a')")
        assert client.result("open")["exit"] == 0
        client.send(id="files", session="nb", files=True)
        assert [entry["path"] for entry in client.result("files")["files"]] == ["a.txt"]
        client.send(id="up", session="nb", upload={"path": "b.txt", "data": "Yg=="})
        assert client.result("up")["uploaded"]["size"] == 1
        client.send(id="down", session="nb", download="b.txt")
        assert client.result("down")["downloaded"]["data"] == "Yg=="
        client.send(id="step", session="nb", code="print(open('b.txt').read())")
        step = client.result("step")
        assert step["stdout"] == "b\n", step["error"]
        client.send(id="job", code="print(1)")
        job = client.result("job")
        assert job["exit"] == 0, job["error"]
        client.close()
        _stop(pool)


def test_results_left_unread_by_all_clients_together_are_bounded(tmp_path: Path, run_dir: Path) -> None:
    """Ten connections each leave 56 MB of results unread (under the 64 MiB that drops one): past 256 MiB
    unread in all, the connection that left the most is dropped, so the pool's memory is bounded by that, not
    by its number of connections. Before, none was dropped and the pool held all 560 MB (64 GiB with the
    default 1,024 connections)."""
    path = run_dir / "pool.sock"
    code = "import sys\nsys.stdout.write('o' * 1_000_000)\nsys.stderr.write('e' * 1_000_000)"
    per_connection = 28  # results of 2 MB each
    with pool_process("--workers=2", f"--listen=unix:{path}", "--log=json", cwd=tmp_path,
                      check_exit=False) as pool:
        silent: list[socket.socket] = []
        for _ in range(10):
            raw = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            raw.connect(str(path))
            raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # the results wait in the pool, not here
            raw.sendall(b"".join(json.dumps({"id": i, "code": code}).encode() + b"\n"
                                 for i in range(per_connection)))
            silent.append(raw)
        end = time.monotonic() + DEADLINE * 4
        while (stats := _stats(path))["in_flight"] or stats["jobs"] < per_connection:
            assert time.monotonic() < end, stats
            time.sleep(0.2)
        peak_mib = procfs.status_number(pool.pid, "VmHWM") >> 10
        dropped = 0
        for raw in silent:
            raw.settimeout(DEADLINE)
            lines = raw.makefile("rb")
            results = 0
            while results < per_connection and (line := lines.readline()):  # all of them, or its end
                results += b'"exit"' in line
            dropped += results < per_connection
            raw.close()
        print(f"\n{dropped} of 10 connections dropped; the pool's peak resident memory {peak_mib} MiB")
        assert dropped, "no connection was dropped with 560 MB of results unread"
        assert peak_mib < 480, f"the pool's peak resident memory was {peak_mib} MiB"
        _stop(pool)
    # The operator sees each client cut off, and how many connections the pool serves.
    logged = pool.log_lines()
    cut = [line for line in logged if line.get("level") == "WARNING" and "for its clients together" in line["message"]]
    assert len(cut) == dropped, logged
    [listening] = [line for line in logged if line["event"] == "listening"]
    assert "at most 1024 connections at once" in listening["message"], listening


def test_a_request_under_the_line_limit_is_not_refused_for_the_connections_tag(tmp_path: Path,
                                                                             run_dir: Path) -> None:
    """The pool's own name of a request (the connection's tag, then the id as JSON) is longer than the line the
    client sent: an id of 300,000 quotes (600 KB on the wire) is 1.2 MB as the pool's, and a line just under
    the limit grows past it by the tag. Each runs, answered under the client's id. Before, each was refused as
    a line "of 1200036 bytes" the client never sent, answered with no id (a client waiting for its id waited
    for good), and held one of its tenant's max_jobs for good."""
    config = _own_tenant(tmp_path, max_jobs=1)
    path = run_dir / "pool.sock"
    with pool_process("--workers=1", f"--listen=unix:{path}", f"--config={config}", cwd=tmp_path,
                      check_exit=False) as pool:
        client = ListenClient(str(path))
        client.wait_for(lambda m: True)
        quotes = '"' * 300_000
        client.send(id=quotes, code="print(1)")
        result = client.result(quotes)
        assert result["exit"] == 0, result["error"]
        bare = len(json.dumps({"id": "near", "code": "print(2)\n#"}))
        client.send(id="near", code="print(2)\n#" + "#" * ((1 << 20) - 8 - bare))  # 8 bytes under the limit
        result = client.result("near")
        assert result["stdout"] == "2\n", result["error"]
        client.send(id="after", code="print(3)")
        assert client.result("after")["stdout"] == "3\n"
        client.close()
        _stop(pool)


def test_a_listening_pools_log_names_requests_as_their_clients_do(tmp_path: Path, run_dir: Path) -> None:
    """A job's log line carries the request's id and session as its client named them (the docs' "the request's
    id"), with its tenant beside them, and its message says what the client was told. Before, they were the
    pool's inner names: id '~1~"job"', session '~1~nb', and "no queued or running job has the id '~1~"gone"'"."""
    path = run_dir / "pool.sock"
    with pool_process("--workers=1", f"--listen=unix:{path}", "--log=json", cwd=tmp_path,
                      check_exit=False) as pool:
        client = ListenClient(str(path))
        client.wait_for(lambda m: True)
        client.send(id="job", code="print(1)")
        client.send(id=7, session="nb", code="x = 1")
        client.send(id="cancel", cancel="gone")
        told = client.result("cancel")["error"]["message"]
        for request_id in ("job", 7):
            assert client.result(request_id)["exit"] == 0
        client.close()
        _stop(pool)
    jobs = {json.dumps(line["id"]): line for line in pool.log_lines() if line.get("event") == "job"}
    assert set(jobs) == {'"job"', "7", '"cancel"'}, list(jobs)
    assert (jobs["7"]["session"], jobs["7"]["tenant"]) == ("nb", "default")
    assert jobs['"cancel"']["message"] == told
    assert "~" not in told and "the id 'gone';" in told, told  # the id as the client wrote it, not as JSON


def test_a_session_name_of_256_characters_opens_through_a_listening_pool(tmp_path: Path, run_dir: Path) -> None:
    """Session names of 1 to 256 characters are the client's, whatever its connection's tag adds in the pool.
    Before, 254 to 256 characters were refused on connection 1 ("a name of 1 to 256 characters is required"),
    and more of them on a connection of a larger number. 257 is refused, as on stdin."""
    path = run_dir / "pool.sock"
    with pool_process("--workers=1", f"--listen=unix:{path}", cwd=tmp_path, check_exit=False) as pool:
        client = ListenClient(str(path))
        client.wait_for(lambda m: True)
        client.send(id="long", session="n" * 256, code="print(1)")
        result = client.result("long")
        assert (result["exit"], result["session"]) == (0, "n" * 256), result["error"]
        client.send(id="over", session="n" * 257, code="print(1)")
        assert "1 to 256 characters" in client.result("over")["error"]["message"]
        client.close()
        _stop(pool)


def test_lines_left_unfinished_by_all_clients_together_are_bounded(tmp_path: Path, run_dir: Path) -> None:
    """300 connections each send a line of nearly 1 MiB but not its newline, and stall: past 256 MiB held for
    all clients together, the one held the most for is dropped, with a warning, and the others are served.
    Before, the pool held all 300 MiB for as long as they stalled (1 GiB under the default max_connections)."""
    path = run_dir / "pool.sock"
    head = b'{"id": 1, "code": "#'
    unfinished = head + b"x" * ((1 << 20) - 100 - len(head))
    with pool_process("--workers=1", f"--listen=unix:{path}", "--log=json", cwd=tmp_path,
                      check_exit=False) as pool:
        stalled: list[socket.socket] = []
        for _ in range(300):
            raw = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            raw.connect(str(path))
            raw.sendall(unfinished)
            stalled.append(raw)
        end = time.monotonic() + DEADLINE
        while not any(line.get("level") == "WARNING" for line in pool.log_lines()):
            assert time.monotonic() < end, "no connection was dropped"
            time.sleep(0.1)
        time.sleep(1.0)  # every line sent has been read by now
        held_mib = procfs.status_number(pool.pid, "VmRSS") >> 10
        client = ListenClient(str(path))
        client.wait_for(lambda m: True)
        client.send(id="served", code="print(1)")
        assert client.result("served")["exit"] == 0
        client.close()
        for raw in stalled:
            raw.close()
        _stop(pool)
    cut = [line for line in pool.log_lines() if line.get("level") == "WARNING"]
    print(f"\n{len(cut)} of 300 stalled connections dropped; the pool's resident memory {held_mib} MiB")
    assert all("lines unfinished" in line["message"] for line in cut), cut
    assert held_mib < 400, f"the pool's resident memory was {held_mib} MiB"


def test_a_tenants_refusals_are_counted_and_logged(tmp_path: Path, run_dir: Path) -> None:
    """A request refused for its tenant's bounds is one of the pool's refusals: in the stats' request_errors and
    a job log line with its tenant, as every other refusal is. Before, the operator saw none of them. Its id
    may be one the client has in flight: the refusal does not end that one's count (a third job is refused)."""
    config = _own_tenant(tmp_path, max_jobs=1)
    path = run_dir / "pool.sock"
    gate = tmp_path / "open"
    with pool_process("--workers=2", f"--listen=unix:{path}", f"--config={config}", "--log=json", cwd=tmp_path,
                      check_exit=False) as pool:
        client = ListenClient(str(path))
        client.wait_for(lambda m: True)
        client.send(id="x", code=f"import os, time\nwhile not os.path.exists({str(gate)!r}):\n    time.sleep(0.01)",
                    timeout="60s")
        client.send(id="x", code="print(2)")  # the same id: refused, and the first still counts
        client.send(id="y", code="print(3)")
        refused = client.wait_for(lambda m: m.get("id") == "y")
        assert "max_jobs" in (refused["error"] or {}).get("message", ""), refused
        client.send(id="stats", stats=True)
        assert client.result("stats")["request_errors"] == 2
        gate.touch()
        client.wait_for(lambda m: m.get("id") == "x" and m["exit"] == 0)
        client.close()
        _stop(pool)
    logged = [line for line in pool.log_lines() if line.get("event") == "job" and line["error"] == "RequestError"]
    assert sorted(line["id"] for line in logged) == ["x", "y"], logged
    assert all(line["tenant"] == "own" and "max_jobs" in line["message"] for line in logged), logged


def test_a_tenant_bound_to_profiles_opens_no_session_without_one(tmp_path: Path, run_dir: Path) -> None:
    """Every session's first request of a tenant with ``profiles`` names one of them. A code-only request (or a
    restore) to a name with no open session opens one, so it is a first request: it opened a session with the pool's
    defaults, past the tenant's profiles (a job naming none was refused). Later steps need no profile."""
    if os.geteuid() != 0:
        pytest.skip("the tenant names root")
    config = tmp_path / "pynox.toml"
    config.write_text('[profiles.analysis]\ntimeout = "5s"\n\n'
                      '[tenants.ops]\nusers = ["root"]\nprofiles = ["analysis"]\n')
    path = run_dir / "pool.sock"
    with pool_process("--workers=1", f"--listen=unix:{path}", f"--config={config}", cwd=tmp_path,
                      check_exit=False) as pool:
        client = ListenClient(str(path))
        try:
            assert client.wait_for(lambda m: True)["event"] == "ready"
            rule = "tenant 'ops' may run only under its profiles (analysis)"
            client.send(id="job", code="print(1)")
            assert rule in client.result("job")["error"]["message"]  # the control: a job naming none
            client.send(id="bare", session="nb", code="x = 1")
            refused = client.result("bare")
            assert rule in refused["error"]["message"] and refused["session_ended"] is True, refused
            client.send(id="restore", session="nb", restore="cHlub3g=")
            assert rule in client.result("restore")["error"]["message"]
            client.send(id="first", session="nb", code="x = 1", profile="analysis")
            assert client.result("first")["exit"] == 0
            client.send(id="later", session="nb", code="print(x)")  # a later step: code only
            later = client.result("later")
            assert (later["exit"], later["stdout"]) == (0, "1\n"), later
            client.send(id="ends", session="nb", code="import os\nos._exit(3)")
            assert client.result("ends")["session_ended"] is True
            client.send(id="again", session="nb", code="print('x' in dir())")  # would open a new one: refused
            assert rule in client.result("again")["error"]["message"]
        finally:
            client.close()
        _stop(pool)
