"""A job that names no path is resolved once per everything its request says but its code (server/jobs.py
``Resolver._alike_key``): each later one like it takes that resolution with its own code. These tests send
requests that differ from the one before in one field each, and check that every job ran under its own: its
code, its environment, its name, its limits, its profile's grants (a path of the profile is resolved again for
every job: removed, the next job is refused), and the user its profile runs it as. The tenant's user is checked
by ``test_pool_listen.test_a_tenants_jobs_run_as_its_user`` (two tenants send the very same request)."""

from __future__ import annotations

import os
import pwd
import shutil
from pathlib import Path

import pytest

from .pool_driver import pool_process, refused

pytestmark = pytest.mark.timeout(120)

_CONFIG = """
[profiles.short]
timeout = "7s"

[profiles.reader]
allow_read = ["{data}"]

[profiles.low]
run_as = "nobody"
"""


def test_jobs_alike_but_for_one_field_each_run_under_their_own(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "note.txt").write_text("kept")
    config = tmp_path / "pynox.toml"
    config.write_text(_CONFIG.format(data=data))
    with pool_process("--workers=1", f"--config={config}", cwd=tmp_path) as pool:
        # Its code: the same request but for it, twice, and each ran its own.
        assert pool.run("print(1)")["stdout"] == "1\n"
        assert pool.run("print(2)")["stdout"] == "2\n"
        # Its environment and its name.
        show = "import os, sys\nprint(os.environ.get('WHO'), sys.modules['__main__'].__file__)"
        assert pool.run(show, env={"WHO": "a"}, name="a.py")["stdout"] == "a a.py\n"
        assert pool.run(show, env={"WHO": "b"}, name="a.py")["stdout"] == "b a.py\n"
        assert pool.run(show, env={"WHO": "b"}, name="b.py")["stdout"] == "b b.py\n"
        # Its limits, its own or its profile's (the control: the pool's default before and after).
        default = pool.run("pass")["policy"]["timeout_ms"]
        assert pool.run("pass", timeout="5s")["policy"]["timeout_ms"] == 5000
        assert pool.run("pass", profile="short")["policy"]["timeout_ms"] == 7000
        assert pool.run("pass", timeout="5s")["policy"]["timeout_ms"] == 5000
        assert pool.run("pass")["policy"]["timeout_ms"] == default
        # Its profile's user, then the pool's for the same request without the profile.
        if os.geteuid() == 0:
            nobody = pwd.getpwnam("nobody")
            who = "import os\nprint(os.getuid())"
            assert pool.run(who, profile="low")["stdout"] == f"{nobody.pw_uid}\n"
            assert pool.run(who)["stdout"] == "0\n"
            assert pool.run(who, profile="low")["stdout"] == f"{nobody.pw_uid}\n"
        # A profile's path is found again for each job: read while it is there, refused once it is gone.
        read = f"print(open({str(data / 'note.txt')!r}).read())"
        assert pool.run(read, profile="reader")["stdout"] == "kept\n"
        assert pool.run(read, profile="reader")["stdout"] == "kept\n"
        shutil.rmtree(data)
        gone = pool.run(read, profile="reader")
        refused(gone, "does not exist")
