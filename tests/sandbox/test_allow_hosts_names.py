"""allow_hosts names, resolved through the host's own resolver files: a hosts file of the test's own,
bind-mounted over /etc/hosts in a private mount namespace that the pool runs in.

In a module of its own: the pool here is driven over its pipes (tests.pool.pool_driver), which checks that
nothing of any pool is left once it ends, so no other pool may be alive meanwhile.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from typing import Any

import pytest

from tests.pool.pool_driver import POOL, PoolProcess

from .harness import Listener
from .test_allow_hosts import CONNECT

pytestmark = pytest.mark.timeout(180)


@pytest.mark.needs_root("a private mount namespace with a hosts file of the test's own")
def test_a_name_keeps_the_addresses_it_had_when_its_session_started(tmp_path: Any,
                                                                    listeners: dict[str, Listener]) -> None:
    """Names resolve through the host's own resolver files: here a hosts file bind-mounted over /etc/hosts in
    a private mount namespace the pool runs in. index.test is 127.0.0.1 when the session starts; the file
    then says 127.0.0.2. The session's next step still reaches 127.0.0.1 by that name and is refused
    127.0.0.2, whose listener sees nothing; a new job, resolved after the change, reaches 127.0.0.2 (the
    control: the pool's resolver did see the change)."""
    listed, other = listeners["listed"], listeners["other_address"]
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1 index.test\n")
    unshare = shutil.which("unshare")
    if unshare is None or subprocess.run([unshare, "--mount", "true"], capture_output=True).returncode != 0:
        pytest.skip("no private mount namespace here (unshare --mount fails)")
    command = [unshare, "--mount", "--propagation", "private", "sh", "-c",
               'mount --bind "$0" /etc/hosts && exec "$@"', str(hosts), *POOL]
    pool = PoolProcess("--workers=1", command=command)
    grant = {"allow_hosts": [f"index.test:{listed.port}"]}
    connect = CONNECT + f"print(socket.getaddrinfo('index.test', {listed.port})[0][4][0])\n" + \
        f"attempt('index.test', {listed.port})\nattempt('127.0.0.2', {listed.port})\n"
    try:
        pool.send({"id": "first", "session": "s", "code": connect, **grant})
        first = pool.result("first")
        assert first["exit"] == 0 and first["stdout"].splitlines()[0] == "127.0.0.1", first
        hosts.write_text("127.0.0.2 index.test\n")  # in place: the bind mount shows the same inode
        pool.send({"id": "second", "session": "s", "code": connect})
        second = pool.result("second")
        assert second["stdout"].splitlines()[0] == "127.0.0.1", second
        assert "reached index.test" in second["stdout"]
        assert f"refused 127.0.0.2 {listed.port} PermissionError" in second["stdout"], second
        assert listed.connections() == 2 and other.connections() == 0
        pool.send({"id": "new", "code": CONNECT + f"attempt('index.test', {listed.port})", **grant})
        new = pool.result("new")
        assert "reached index.test" in new["stdout"], new
        assert other.connections() == 1
    finally:
        pool.finish()


# A DNS server that never answers, on a loopback address of its own: the pool's resolver waits on it, for
# every name not in the hosts file.
_DEAF_DNS = "127.0.0.153"
# How long another job's lookup of a name in the hosts file may take while a job's dead names wait: the pool
# bounds each job's lookups in flight, so a name of another job never waits behind them (a loaded machine
# gets a second; without the bound it waits the 5 s a job's names may take, and gets nothing).
_OTHER_JOB_BOUND = 1.5


@pytest.mark.needs_root("a private mount namespace with a resolv.conf of the test's own, port 53 on loopback")
def test_one_jobs_dead_names_do_not_delay_another_jobs_lookup(tmp_path: Any, listeners: dict[str, Listener]) -> None:
    """One job lists 200 names whose DNS server never answers. Another job, listing localhost (in the hosts
    file), is resolved at once while the first waits, and so is one sent once the first gave up: its
    lookups still queued were dropped. Control: the pool did ask the deaf server, and the dead names have no
    address in the first job."""
    listed = listeners["listed"]
    unshare = shutil.which("unshare")
    if unshare is None or subprocess.run([unshare, "--mount", "true"], capture_output=True).returncode != 0:
        pytest.skip("no private mount namespace here (unshare --mount fails)")
    deaf = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    deaf.bind((_DEAF_DNS, 53))
    resolv = tmp_path / "resolv.conf"
    resolv.write_text(f"nameserver {_DEAF_DNS}\n")
    command = [unshare, "--mount", "--propagation", "private", "sh", "-c",
               'mount --bind "$0" /etc/resolv.conf && exec "$@"', str(resolv), *POOL]
    pool = PoolProcess("--workers=3", command=command)
    dead = [f"n{index}.dead.test:80" for index in range(200)]
    other = {"allow_hosts": [f"localhost:{listed.port}"],
             "code": CONNECT + f"attempt('localhost', {listed.port})\n"}
    try:
        pool.send({"id": "dead", "allow_hosts": dead, "code": CONNECT + "attempt('n0.dead.test', 80)\n"})
        time.sleep(0.5)  # its names wait on the deaf server
        taken = []
        for request_id in ("while", "after"):
            if request_id == "after":
                first = pool.result("dead")
                assert "refused n0.dead.test 80 gaierror" in first["stdout"], first  # control: no address
            start = time.monotonic()
            pool.send({"id": request_id, **other})
            result = pool.result(request_id)
            taken.append(time.monotonic() - start)
            assert f"reached localhost {listed.port}" in result["stdout"], (request_id, taken[-1], result)
        assert max(taken) < _OTHER_JOB_BOUND, f"the other jobs took {taken[0]:.2f} s and {taken[1]:.2f} s"
        deaf.setblocking(False)
        assert deaf.recv(512), "the pool never asked the deaf server"  # control: its lookups were real
    finally:
        pool.finish()
        deaf.close()
