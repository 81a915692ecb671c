"""allow_hosts names, resolved through the host's own resolver files: a hosts file of the test's own,
bind-mounted over /etc/hosts in a private mount namespace that the pool runs in.

In a module of its own: the pool here is driven over its pipes (tests.pool.pool_driver), which checks that
nothing of any pool is left once it ends, so no other pool may be alive meanwhile.
"""

from __future__ import annotations

import shutil
import subprocess
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
