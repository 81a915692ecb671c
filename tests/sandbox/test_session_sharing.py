"""Sessions whose templates are forked from one zygote stay as isolated from each other as separate pools'.

Each session's template is a fork of the pool's zygote (server/zygote.py): the sessions share the pages of
one warm interpreter copy-on-write. These tests drive a real pool and check from outside that two such
sessions share no state (variables, files) and cannot reach each other (signals, ``/proc``), and that each
keeps its own cgroup and memory limit: the kernel's kill for one session's memory takes that session only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pynox.policy import cgroups
from tests.harness import procfs
from tests.pool.pool_driver import ZYGOTE, PoolProcess, leftover_guard, pool_process, proc_table

pytestmark = pytest.mark.timeout(120)

_subreaper = pytest.fixture(scope="module", autouse=True, name="_subreaper")(leftover_guard)


def _ok(result: dict[str, Any]) -> dict[str, Any]:
    assert result["exit"] == 0 and result["error"] is None, result
    return result


def _pid(pool: PoolProcess, session: str, **grants: Any) -> int:
    """The session child's pid, as it says, checked from outside: a pynox-session process of this pool."""
    pid = int(_ok(pool.run("import os\nprint(os.getpid())", session=session, **grants))["stdout"])
    table = proc_table()
    assert table[pid][3] == "pynox-session", table[pid]
    return pid


def _zygote_of(pid: int) -> int:
    """The zygote the session child ``pid`` comes from: its template's parent (seen in /proc)."""
    table = proc_table()
    template = table[pid][0]
    zygote = table[template][0]
    assert table[zygote][3] == ZYGOTE, (table[template], table[zygote])
    return zygote


def _memory_cgroup(pid: int, version: int) -> str:
    """The process's memory cgroup, from /proc: v1's memory line, or v2's one line."""
    for line in procfs.read(pid, "cgroup").splitlines():
        _, controllers, path = line.split(":", 2)
        if (version == 1 and "memory" in controllers.split(",")) or (version == 2 and controllers == ""):
            return path
    raise AssertionError(f"no memory cgroup for {pid}")


def test_two_sessions_forked_from_one_zygote_see_nothing_of_each_other(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with pool_process("--workers=1", cwd=tmp_path) as pool:
        a, b = _pid(pool, "a", allow_write=["a"]), _pid(pool, "b", allow_write=["b"])
        assert _zygote_of(a) == _zygote_of(b)  # the case: both from one warm interpreter
        _ok(pool.run("secret = 'only a'\nopen('a/note', 'w').write('a wrote this')", session="a"))
        probe = pool.run(f"""
import os, signal
print('secret' in dir())
for attempt in (lambda: open('a/note').read(), lambda: open('/proc/{a}/environ').read(),
                lambda: os.kill({a}, signal.SIGKILL)):
    try:
        attempt()
        print('reached')
    except OSError as exc:
        print(type(exc).__name__)
""", session="b")
        assert probe["exit"] == 0, probe
        # Not a's variable, not a's file (b's grants do not name a/), not a's /proc, not a's process.
        lines = probe["stdout"].split()
        assert lines[0] == "False" and "reached" not in lines, probe
        # Control: a still runs, with its variable, and its file is there for whoever is granted it.
        assert _ok(pool.run("print(secret, open('a/note').read())", session="a"))["stdout"] == \
            "only a a wrote this\n"
        assert procfs.exists(a) and proc_table()[a][3] == "pynox-session"
        for name in ("a", "b"):
            pool.run(session=name, close=True)


def test_each_forked_session_keeps_its_own_cgroup_and_memory_limit(tmp_path: Path) -> None:
    bounds = cgroups.available()
    if bounds.memory is None:
        pytest.skip(bounds.memory_reason)
    # Pipe buffers of 1 MiB each (as test_memory_counted's): they count in the cgroup, against no rlimit.
    hoard = ("import fcntl, os\npipes = []\ntry:\n    while True:\n        r, w = os.pipe()\n"
             "        pipes.append((r, w))\n        try:\n            fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, 1 << 20)\n"
             "        except OSError:\n            pass\n        os.set_blocking(w, False)\n        try:\n"
             "            while True:\n                os.write(w, bytes(65536))\n        except BlockingIOError:\n"
             "            pass\nexcept OSError as exc:\n    print('stopped by', type(exc).__name__)\n")
    with pool_process("--workers=1", cwd=tmp_path) as pool:
        small = pool.run("import os\nprint(os.getpid())", session="small", memory="48m")
        big = pool.run("import os\nkept = 'big kept this'\nprint(os.getpid())", session="big", memory="1g")
        small_pid, big_pid = int(_ok(small)["stdout"]), int(_ok(big)["stdout"])
        assert _zygote_of(small_pid) == _zygote_of(big_pid)
        # From outside: each session's child is in a memory cgroup of its own, neither the zygote's.
        groups = {_memory_cgroup(pid, bounds.memory.version) for pid in (small_pid, big_pid, _zygote_of(small_pid))}
        assert len(groups) == 3, groups
        # Pipe buffers count in the cgroup only (no rlimit sees them): the kernel kills the small session.
        killed = pool.run(hoard, session="small", timeout="30s", wait=60)
        assert killed["error"] is not None and killed["error"]["type"] == "MemoryError", killed
        assert killed["session_ended"] is True, killed
        # Only that session: the other, forked from the same zygote, goes on with its state.
        assert _ok(pool.run("import os\nprint(kept, os.getpid())", session="big"))["stdout"] == \
            f"big kept this {big_pid}\n"
        # Control: with the memory to hold them, the same step fills its pipes and the session lives on.
        fine = pool.run(hoard, session="big", timeout="30s", wait=60)
        assert fine["exit"] == 0 and fine["session_ended"] is False, fine
        assert procfs.exists(big_pid)
        pool.run(session="big", close=True)


def test_a_session_cannot_signal_the_zygote_or_its_template(tmp_path: Path) -> None:
    with pool_process("--workers=1", cwd=tmp_path) as pool:
        child = _pid(pool, "s")
        template = proc_table()[child][0]
        zygote = _zygote_of(child)
        probe = pool.run(f"""
import os, signal
for pid in ({template}, {zygote}):
    try:
        os.kill(pid, signal.SIGKILL)
        print('reached')
    except OSError as exc:
        print(type(exc).__name__)
""", session="s")
        assert probe["exit"] == 0 and "reached" not in probe["stdout"], probe
        table = proc_table()
        assert table[zygote][3] == ZYGOTE and table[template][0] == zygote
        _ok(pool.run("x = 1", session="other"))  # the zygote still forks templates
        for name in ("s", "other"):
            pool.run(session=name, close=True)
