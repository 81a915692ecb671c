"""Isolation between jobs, proven from outside through a real ``pynox pool``.

Two rules, each attacked the way a job (or a host changing its own files
between jobs) would:

* A grant means what its path names when the job starts. A child confined
  ahead of its job, for the grants of the job before, may serve a job only if
  every granted path still names the very same file or directory; a symlink a
  job planted can never widen a later job.
* Nothing of one job (code, arguments, environment, host-call data) is in the
  memory of a later job: not in live frames, not in the heap it inherits.

The pool runs one worker, so every job goes through the same template and,
whenever the policy allows it, through the child it prepared ahead.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.pool.pool_driver import (
    PREPARED_PER_WORKER,
    PoolProcess,
    descendants,
    leftover_guard,
    new_id,
    pool_process,
    prepared_for_a_session,
    proc_table,
)

pytestmark = pytest.mark.timeout(120)

_subreaper = pytest.fixture(scope="module", autouse=True, name="_subreaper")(leftover_guard)

_PREPARED = "pynox-ready"


def _wait_prepared(pool: PoolProcess, timeout: float = 10.0) -> None:
    """Wait until the template has a child confined ahead of the next job (the case under attack)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        table = proc_table()
        if any(table[pid][3] == _PREPARED for pid in descendants(pool.pid, table)):
            return
        time.sleep(0.01)
    raise AssertionError("the template prepared no child ahead of the next job")


@pytest.fixture
def pool(tmp_path: Path) -> Iterator[PoolProcess]:
    with pool_process("--workers=1", cwd=tmp_path) as running:
        yield running


def _write(path: Path, text: str = "written") -> str:
    """Code that tries to write ``path`` and prints what happened."""
    return (f"try:\n    open({str(path)!r}, 'w').write({text!r})\n    print('wrote')\n"
            f"except OSError as exc:\n    print('denied', exc.errno)\n")


# -- grants bind to what the paths name when the job starts -----------------------------------------------


def test_a_renamed_grant_is_not_granted_under_its_new_name(pool: PoolProcess, tmp_path: Path) -> None:
    out, archive = tmp_path / "out", tmp_path / "archive"
    out.mkdir()
    first = pool.run("print('warm')", allow_write=[str(out)])
    assert first["exit"] == 0, first
    _wait_prepared(pool)
    out.rename(archive)  # the host archives the directory it granted and makes a fresh one
    out.mkdir()
    result = pool.run(_write(archive / "leak") + _write(out / "fresh"), allow_write=[str(out)])
    assert result["stdout"] == "denied 13\nwrote\n", result
    assert not (archive / "leak").exists()  # the archive was never granted under its new name
    assert (out / "fresh").read_text() == "written"
    assert result["policy"]["allow_write"] == [str(out)]
    # Control: granted by its own name, the archive is writable, so the denial above is the policy's.
    control = pool.run(_write(archive / "leak"), allow_write=[str(archive)])
    assert control["stdout"] == "wrote\n", control
    assert (archive / "leak").exists()


def test_a_removed_and_recreated_grant_is_granted_afresh(pool: PoolProcess, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "old.txt").write_text("old")
    assert pool.run("print('warm')", allow_write=[str(out)])["exit"] == 0
    _wait_prepared(pool)
    shutil.rmtree(out)
    out.mkdir()
    result = pool.run(_write(out / "fresh"), allow_write=[str(out)])
    assert result["stdout"] == "wrote\n", result
    assert (out / "fresh").read_text() == "written"


def test_an_atomically_replaced_file_grant_is_the_new_file(pool: PoolProcess, tmp_path: Path) -> None:
    state, backup = tmp_path / "state.json", tmp_path / "state.json.bak"
    state.write_text('{"v": 1}')
    assert pool.run("print('warm')", allow_write=[str(state)])["exit"] == 0
    _wait_prepared(pool)
    # The usual safe save: keep the old copy, write the new one beside it, rename it over the old name.
    os.link(state, backup)
    (tmp_path / "state.json.new").write_text('{"v": 2}')
    os.replace(tmp_path / "state.json.new", state)
    result = pool.run(_write(state, '{"v": 3}') + _write(backup, "clobbered"), allow_write=[str(state)])
    assert result["stdout"] == "wrote\ndenied 13\n", result
    assert state.read_text() == '{"v": 3}'
    assert backup.read_text() == '{"v": 1}'  # the old inode, now the backup, was not granted


_PLANT = """
import os, time
time.sleep({delay})
os.rename({sub!r}, {sub!r} + '-old')
os.symlink({outside!r}, {sub!r})
print('planted')
"""


def _work_outside_and_a_ceiling(tmp_path: Path) -> tuple[Path, Path, Path]:
    """``work/sub`` and ``outside``, and a config whose ceiling lets jobs write ``work`` only."""
    work, outside = tmp_path / "work", tmp_path / "outside"
    (work / "sub").mkdir(parents=True)
    outside.mkdir()
    config = tmp_path / "etc" / "pynox.toml"
    config.parent.mkdir()
    config.write_text(f'[pool.limits]\nallow_write = ["{work}"]\n')
    return work, outside, config


@pytest.mark.parametrize("queued", [False, True], ids=["sent-after", "queued-behind"])
def test_a_planted_symlink_never_widens_a_later_job_under_a_ceiling(tmp_path: Path, queued: bool) -> None:
    work, outside, config = _work_outside_and_a_ceiling(tmp_path)
    grants = [str(work), str(work / "sub")]
    with pool_process("--workers=1", f"--config={config}", cwd=tmp_path) as pool:
        assert pool.run("print('warm')", allow_write=grants)["exit"] == 0
        _wait_prepared(pool)
        plant = pool.submit(code=_PLANT.format(delay=0.5 if queued else 0, sub=str(work / "sub"),
                                               outside=str(outside)), allow_write=grants)
        if not queued:
            assert pool.result(plant)["stdout"] == "planted\n"
        # Queued: accepted (and its paths checked) while the planting job still runs.
        victim = pool.submit(code=_write(work / "sub" / "escape"), allow_write=grants)
        assert pool.result(plant)["stdout"] == "planted\n"
        result = pool.result(victim)
        assert not (outside / "escape").exists(), result  # the harm, seen from the host
        assert result["error"]["type"] == "RequestError", result
        assert "symlink" in result["error"]["message"] or "outside" in result["error"]["message"], result
        # Control: the operator's ceiling is what makes the outside directory unreachable.
        assert pool.run(_write(outside / "escape"), allow_write=[str(outside)])["error"]["type"] == "RequestError"
    with pool_process("--workers=1", cwd=tmp_path) as unlimited:
        assert unlimited.run(_write(outside / "escape"), allow_write=[str(outside)])["stdout"] == "wrote\n"


def test_a_planted_symlink_never_widens_a_later_job_without_a_ceiling(pool: PoolProcess, tmp_path: Path) -> None:
    work, outside = tmp_path / "work", tmp_path / "outside"
    (work / "sub").mkdir(parents=True)
    outside.mkdir()
    grants = [str(work), str(work / "sub")]
    assert pool.run("print('warm')", allow_write=grants)["exit"] == 0
    planted = pool.run(_PLANT.format(delay=0, sub=str(work / "sub"), outside=str(outside)), allow_write=grants)
    assert planted["stdout"] == "planted\n", planted
    result = pool.run(_write(work / "sub" / "escape"), allow_write=grants)
    assert not (outside / "escape").exists(), result
    assert result["error"]["type"] == "RequestError", result
    assert "symlink" in result["error"]["message"], result
    # Control: a symlink the host made outside every write grant is followed, as the host meant it.
    link = tmp_path / "link"
    link.symlink_to(outside)
    control = pool.run(_write(outside / "escape"), allow_write=[str(link)])
    assert control["stdout"] == "wrote\n", control
    assert control["policy"]["allow_write"] == [str(outside)]


# -- nothing of one job reaches the next --------------------------------------------------------------------

# Searches everything the process can read of itself for tokens: "pynox", then "tok" or "env", then 32 hex
# digits. The pattern is assembled at run time, so this code never holds a whole token of its own.
_SCAN = r"""
import re
pattern = re.compile(('pynox' + '(?:tok|env)').encode() + rb'[0-9a-f]{32}')
found = set()
with open('/proc/self/maps') as maps, open('/proc/self/mem', 'rb', buffering=0) as mem:
    for line in maps:
        fields = line.split()
        if 'r' not in fields[1] or (len(fields) > 5 and fields[5] in ('[vvar]', '[vsyscall]', '[vvar_vclock]')):
            continue
        start, end = (int(x, 16) for x in fields[0].split('-'))
        try:
            mem.seek(start)
            data = mem.read(end - start)
        except (OSError, OverflowError, ValueError):
            continue
        found.update(m.decode() for m in pattern.findall(data))
print(sorted(found))
"""

_FRAMES = r"""
import sys
seen = []
frame = sys._getframe()
while frame is not None:
    seen.append(repr(frame.f_code.co_name) + repr(list(frame.f_locals.items())))
    frame = frame.f_back
print('\n'.join(seen))
"""


def _token(kind: str = "tok") -> str:
    return f"pynox{kind}" + secrets.token_hex(16)


# The earlier job's environment: a later job sending the same one may hold it, never its code or host data.
_ENV_TOKEN = _token("env")


def _leave_traces(pool: PoolProcess, token: str, grants: list[str]) -> None:
    """A job whose code, arguments and host call (both ways) carry ``token``, its environment ``_ENV_TOKEN``."""
    code = f"# {token}\nimport sys\nfrom pynox_host import echo\nprint(len(echo(sys.argv[1])))"
    result = pool.run(code, args=[token], env={"API_TOKEN": _ENV_TOKEN}, allow_write=grants,
                      host={"echo": lambda value: value + "-" + token})
    assert result["exit"] == 0 and result["stdout"] == f"{2 * len(token) + 1}\n", result


def _scanned(result: dict[str, object]) -> list[str]:
    assert result["exit"] == 0, result
    return json.loads(str(result["stdout"]).replace("'", '"'))


def test_a_prepared_child_holds_nothing_of_the_job_before(pool: PoolProcess, tmp_path: Path) -> None:
    token = _token()
    _leave_traces(pool, token, [str(tmp_path)])
    _wait_prepared(pool)
    # The very same grants, functions and environment: the job the prepared child was made for.
    result = pool.run(_FRAMES, allow_write=[str(tmp_path)], functions=["echo"], env={"API_TOKEN": _ENV_TOKEN})
    assert result["exit"] == 0, result
    assert token not in result["stdout"], result["stdout"][:2000]


@pytest.mark.parametrize("same_policy", [True, False], ids=["prepared-child", "fresh-child"])
def test_no_later_job_finds_an_earlier_jobs_payload_in_its_memory(pool: PoolProcess, tmp_path: Path,
                                                                   same_policy: bool) -> None:
    token = _token()
    _leave_traces(pool, token, [str(tmp_path)])
    _wait_prepared(pool)
    if same_policy:
        found = _scanned(pool.run(_SCAN, allow_write=[str(tmp_path)], functions=["echo"],
                                  env={"API_TOKEN": _ENV_TOKEN}))
        assert token not in found, found
    else:
        other = tmp_path / "other"
        other.mkdir()
        found = _scanned(pool.run(_SCAN, allow_write=[str(other)]))
        assert token not in found and _ENV_TOKEN not in found, found
    # Control: the scan finds a token that is really in the job's memory (its own environment).
    own = _token()
    assert own in _scanned(pool.run(_SCAN, allow_write=[str(tmp_path)], env={"MINE": own}))


# What a job sees of its own interpreter that a child's warm-up (job/child.py) could have left: the sources kept
# for tracebacks, open descriptors, argv, modules, the environment (os.environ and the C library's own, which a
# subprocess inherits), threads, uncollectable garbage, the last traceback, builtins, stdout's buffering, import
# hooks, warning filters, a pending exception, signal state, ``__main__``'s names.
_OWN_VIEW = r"""
import builtins, ctypes, gc, linecache, os, signal, sys, threading, warnings
environ = ctypes.POINTER(ctypes.c_char_p).in_dll(ctypes.CDLL(None), "environ")
c_environ = []
while environ[len(c_environ)]:
    c_environ.append(environ[len(c_environ)].decode())
print(os.getpid())
print(sorted(linecache.cache), sorted(os.listdir('/proc/self/fd')), sys.argv, sorted(sys.modules),
      sorted(os.environ.items()), sorted(c_environ), threading.active_count(), len(gc.garbage),
      [getattr(sys, name, None) for name in ('last_type', 'last_value')], sorted(vars(builtins)),
      sys.stdout.line_buffering, [type(finder).__name__ for finder in sys.meta_path], len(warnings.filters),
      sys.exc_info(), signal.getsignal(signal.SIGINT), signal.pthread_sigmask(signal.SIG_BLOCK, []),
      sorted(vars(sys.modules['__main__'])), os.umask(0o22), sys.path)
"""


def _views(pool: PoolProcess, first: Path, other: Path, ready: set[int], **fields: Any) -> dict[Path, tuple[bool, str]]:
    """What ``_OWN_VIEW`` printed in a job granted ``first`` and in one granted ``other`` (each a session's first
    step, with ``session``), and whether the job ran in a child of ``ready``."""
    views = {}
    for grant in (first, other):  # the first goes to a prepared child, the second (another grant) to a fresh one
        session = {"session": new_id("warm")} if fields.get("session") else {}
        result = pool.run(_OWN_VIEW, allow_write=[str(grant)], **{**fields, **session})
        assert result["exit"] == 0, result
        pid, view = result["stdout"].split("\n", 1)
        views[grant] = (int(pid) in ready, view.replace(str(grant), "GRANT"))
    return views


def test_a_child_prepared_ahead_shows_its_job_nothing_of_its_warm_up(pool: PoolProcess, tmp_path: Path) -> None:
    """A child prepared ahead runs a job's path once before its job (its warm-up): the job finds its interpreter
    as a child forked for it finds it."""
    first, other = tmp_path / "first", tmp_path / "other"
    first.mkdir()
    other.mkdir()
    assert pool.run("print('warm')", allow_write=[str(first)])["exit"] == 0
    _wait_prepared(pool)
    table = proc_table()
    ready = {pid for pid in descendants(pool.pid, table) if table[pid][3] == _PREPARED}
    views = _views(pool, first, other, ready)
    assert views[first][0] and not views[other][0], views  # the case and its control
    assert views[first][1] == views[other][1]


def test_a_child_prepared_ahead_for_host_functions_shows_its_job_nothing_of_its_rehearsal(
        pool: PoolProcess, tmp_path: Path) -> None:
    """A child prepared for a job with host functions also rehearses their calls (pynox_host.warm_up: the module
    installed, a function imported and called): its job finds its interpreter, and its channel numbered from its
    first call, as a child forked for it finds them."""
    first, other = tmp_path / "first", tmp_path / "other"
    first.mkdir()
    other.mkdir()
    assert pool.run("print('warm')", allow_write=[str(first)], host={"echo": lambda value: value})["exit"] == 0
    _wait_prepared(pool)
    table = proc_table()
    ready = {pid for pid in descendants(pool.pid, table) if table[pid][3] == _PREPARED}
    code = ("import pynox_host\nfrom pynox_host import echo\n"
            "print(echo(1), pynox_host.__all__, sorted(vars(pynox_host)))\n")
    views = {}
    for grant in (first, other):
        result = pool.run(code + _OWN_VIEW, allow_write=[str(grant)], host={"echo": lambda value: value})
        assert result["exit"] == 0, result
        head, pid, view = result["stdout"].split("\n", 2)
        views[grant] = (int(pid) in ready, head + view.replace(str(grant), "GRANT"))
    assert views[first][0] and not views[other][0], views  # the case and its control
    assert views[first][1] == views[other][1]


def test_a_session_handed_a_child_prepared_ahead_sees_nothing_of_its_warm_up(tmp_path: Path) -> None:
    """The child a template prepares for the next session warms up as a job's does: that session's first step finds
    its interpreter as a session's own child finds it (another grant: the control)."""
    first, other = tmp_path / "first", tmp_path / "other"
    first.mkdir()
    other.mkdir()
    with pool_process("--workers=1", cwd=tmp_path) as pool:
        plain = set(pool.tree())
        assert pool.run("x = 1", session=new_id("warm"), allow_write=[str(first)])["exit"] == 0
        deadline = time.monotonic() + 30
        while True:
            table = proc_table()
            ready = {pid for pid, depth in descendants(pool.pid, table).items()
                     if depth == 2 and pid not in plain and table[pid][3] == _PREPARED and prepared_for_a_session(pid)}
            if ready:
                break
            assert time.monotonic() < deadline, pool.tree()
            time.sleep(0.02)
        views = _views(pool, first, other, ready, session=True)
    assert views[first][0] and not views[other][0], views  # the case and its control
    assert views[first][1] == views[other][1]


# -- found by the adversarial review of the redesign ---------------------------------------------------------


def test_a_symlink_planted_where_an_earlier_job_wrote_never_widens_a_narrower_grant(
        pool: PoolProcess, tmp_path: Path) -> None:
    # The later job is granted only the subdirectory, not the directory the planting job could write.
    work, outside = tmp_path / "work", tmp_path / "outside"
    (work / "sub").mkdir(parents=True)
    outside.mkdir()
    planted = pool.run(_PLANT.format(delay=0, sub=str(work / "sub"), outside=str(outside)), allow_write=[str(work)])
    assert planted["stdout"] == "planted\n", planted
    for field in ("allow_write", "allow_read"):
        result = pool.run(_write(work / "sub" / "escape"), **{field: [str(work / "sub")]})
        assert result["error"]["type"] == "RequestError" and "symlink" in result["error"]["message"], result
    assert not (outside / "escape").exists()


_FLIP = """
import ctypes, os, time
libc = ctypes.CDLL(None, use_errno=True)
os.symlink({outside!r}, {link!r})
end = time.monotonic() + {seconds}
flips = 0
while time.monotonic() < end:  # swap the real directory and the symlink, atomically, again and again
    libc.renameat2(-100, {sub!r}.encode(), -100, {link!r}.encode(), 2)
    flips += 1
print('flipped', flips)
"""


def test_a_path_flipping_between_directory_and_symlink_never_escapes_the_ceiling(tmp_path: Path) -> None:
    work, outside, config = _work_outside_and_a_ceiling(tmp_path)
    victims = 150
    with pool_process("--workers=2", f"--config={config}", cwd=tmp_path) as pool:
        flipper = pool.submit(code=_FLIP.format(outside=str(outside), link=str(work / "link"), sub=str(work / "sub"),
                                                seconds=6), allow_write=[str(work)], timeout="20s")
        ids = [pool.submit(code=f"open({str(outside)!r} + '/escape-{i}', 'w').write('x'); print('ESCAPED')",
                           allow_write=[str(work), str(work / "sub")]) for i in range(victims)]
        results = [pool.result(request_id, timeout=60) for request_id in ids]
        assert pool.result(flipper, timeout=30)["stdout"].startswith("flipped"), "the flipper did not run"
    assert sorted(os.listdir(outside)) == []  # the harm, seen from the host
    assert not any(r["stdout"] == "ESCAPED\n" for r in results)
    for result in results:
        assert all(not path.startswith(str(outside)) for path in (result.get("policy") or {}).get("allow_write", []))


def test_a_chain_of_symlinks_is_refused_and_the_pool_goes_on(pool: PoolProcess, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    chain = ("import os\nos.mkdir('end')\nfor i in range(2000):\n"
             "    os.symlink(f'l{i + 1}' if i < 1999 else 'end', f'l{i}')\nos.symlink('l0', 'sub')\nprint('chained')")
    made = pool.run(f"import os\nos.chdir({str(work)!r})\n" + chain, allow_write=[str(work)])
    assert made["stdout"] == "chained\n", made
    refused = pool.run("print('ran')", allow_read=[str(work / "sub")])
    assert refused["error"]["type"] == "RequestError" and "symlinks" in refused["error"]["message"], refused
    assert pool.run("print('next')")["stdout"] == "next\n"


def test_a_package_directory_replaced_on_the_host_is_the_new_one(tmp_path: Path) -> None:
    packages = tmp_path / "site"
    packages.mkdir()
    (packages / "first.py").write_text("NAME = 'first'\n")
    with pool_process("--workers=1", f"--package-dir={packages}", cwd=tmp_path) as pool:
        assert pool.run("import first; print(first.NAME)")["stdout"] == "first\n"
        _wait_prepared(pool)
        packages.rename(tmp_path / "site.old")  # a deploy moves the old release aside
        packages.mkdir()
        (packages / "second.py").write_text("NAME = 'second'\n")
        # The children prepared before the move still have the old rule: none of them takes a job (the pool saw
        # the directory replaced; see the test below, which checks the very next jobs).
        for _ in range(PREPARED_PER_WORKER):
            pool.run("pass")
        _wait_prepared(pool)
        result = pool.run("import second; print(second.NAME)")
        assert result["stdout"] == "second\n", result
        old = pool.run(_write(tmp_path / "site.old" / "first.py"))
        assert old["stdout"].startswith("denied"), old


def test_no_job_after_a_package_directory_is_replaced_gets_the_old_rules(tmp_path: Path) -> None:
    """The review's finding on prepared children: a deploy that moves a package directory aside must not leave
    the old release readable, nor the new one unreadable, to the jobs that come next. Children prepared before
    the move hold the old rule; a job whose package directories name other files than when its child was
    prepared from an earlier job's is forked afresh. Control: the old release is readable before the move."""
    packages = tmp_path / "site"
    packages.mkdir()
    (packages / "first.py").write_text("NAME = 'first'\n")
    read_old = (f"try:\n    print(open({str(tmp_path / 'site.old' / 'first.py')!r}).read().strip())\n"
                f"except OSError as exc:\n    print('denied', exc.errno)\n")
    read_now = read_old.replace("site.old", "site")
    with pool_process("--workers=1", f"--package-dir={packages}", cwd=tmp_path) as pool:
        assert pool.run(read_now)["stdout"] == "NAME = 'first'\n"  # the control: granted, it is readable
        _wait_prepared(pool)
        packages.rename(tmp_path / "site.old")  # a deploy moves the old release aside
        packages.mkdir()
        (packages / "second.py").write_text("NAME = 'second'\n")
        for _ in range(PREPARED_PER_WORKER + 1):
            result = pool.run("import second; print(second.NAME)\n" + read_old)
            assert result["stdout"] == "second\ndenied 13\n", result
