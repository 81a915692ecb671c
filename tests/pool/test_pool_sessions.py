"""Sessions: one confined process per name whose ``__main__`` survives between steps."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from tests.harness import fd_audit

from .pool_driver import (
    READY_CHILD,
    PoolProcess,
    descendants,
    new_id,
    pool_process,
    prepared_for_a_session,
    proc_table,
    refused,
    wait_gone,
)

pytestmark = pytest.mark.timeout(90)


def _session() -> str:
    return new_id("notebook")


def _ok(result: dict[str, Any]) -> dict[str, Any]:
    assert result["exit"] == 0 and result["error"] is None, result
    return result


def _session_children(pool: PoolProcess) -> list[int]:
    return [pid for pid, depth in pool.tree().items() if depth == 2]


def test_a_variable_survives_between_steps(pool: PoolProcess) -> None:
    name = _session()
    first = _ok(pool.run("import json\nx = 41", session=name))
    second = _ok(pool.run("print(x + 1, json.dumps([1]))", session=name))
    assert second["stdout"] == "42 [1]\n"
    assert (first["session"], first["step"], first["session_ended"]) == (name, 1, False)
    assert (second["session"], second["step"], second["session_ended"]) == (name, 2, False)
    assert second["runtime"]["mode"] == "session"
    pool.run(session=name, close=True)


def test_the_session_is_one_process(pool: PoolProcess) -> None:
    name = _session()
    pids = [int(_ok(pool.run("import os\nprint(os.getpid())", session=name))["stdout"]) for _ in range(3)]
    assert len(set(pids)) == 1
    pool.run(session=name, close=True)


def test_a_python_exception_keeps_the_session(pool: PoolProcess) -> None:
    name = _session()
    _ok(pool.run("x = 'kept'", session=name))
    failed = pool.run("print(undefined_name)", session=name, name="cell2.py")
    assert failed["error"]["type"] == "NameError" and failed["exit"] == 1
    assert failed["error"]["file"] == "cell2.py" and failed["error"]["line"] == 1
    assert failed["session_ended"] is False
    assert _ok(pool.run("print(x)", session=name))["stdout"] == "kept\n"
    pool.run(session=name, close=True)


def test_a_timeout_ends_the_session_and_the_next_step_starts_fresh(pool: PoolProcess) -> None:
    name = _session()
    _ok(pool.run("x = 1", session=name))
    timed_out = pool.run("while True:\n    pass", session=name, timeout="1s")
    assert timed_out["exit"] == 124 and timed_out["error"]["type"] == "TimeoutError"
    assert timed_out["session_ended"] is True and timed_out["session"] == name
    fresh = pool.run("print(x)", session=name)
    assert fresh["error"]["type"] == "NameError", fresh
    assert fresh["step"] == 1 and fresh["session_ended"] is False
    pool.run(session=name, close=True)


@pytest.mark.parametrize("code, error_type", [
    ("import os\nos.abort()", "SignalError"),
    ("import sys\nsys.exit(0)", None),
    ("exit(3)", None),
    ("import os\nos._exit(5)", None),
], ids=["crash", "sys.exit", "exit-3", "os._exit"])
def test_a_crash_or_an_exit_ends_the_session(pool: PoolProcess, code: str, error_type: str | None) -> None:
    name = _session()
    _ok(pool.run("x = 1", session=name))
    ended = pool.run(code, session=name)
    assert ended["session_ended"] is True, ended
    assert (ended["error"] or {}).get("type") == error_type
    assert pool.run("print(x)", session=name)["error"]["type"] == "NameError"
    pool.run(session=name, close=True)


def test_a_memory_kill_ends_the_session_or_leaves_it_usable(pool: PoolProcess) -> None:
    name = _session()
    _ok(pool.run("x = 1", session=name, memory="256m"))
    hit = pool.run("y = bytearray(600 << 20)", session=name)
    assert hit["error"]["type"] == "MemoryError" and hit["error"]["hint"]
    # A MemoryError is a Python exception: the session lives on.
    if not hit["session_ended"]:
        assert _ok(pool.run("print(x)", session=name))["stdout"] == "1\n"
    pool.run(session=name, close=True)


def test_the_first_request_fixes_permissions_limits_and_environment(pool: PoolProcess, workdir: Path) -> None:
    (workdir / "session-out").mkdir(exist_ok=True)
    name = _session()
    first = _ok(pool.run("import os\nprint(os.environ['MODE'])", session=name, allow_write=["session-out"],
                         env={"MODE": "notebook"}, memory="512m"))
    assert first["stdout"] == "notebook\n"
    later = _ok(pool.run("import os\nopen('session-out/later.txt', 'w').write(os.environ['MODE'])", session=name))
    assert later["policy"]["allow_write"] == [str((workdir / "session-out").resolve())]
    assert later["policy"]["memory_bytes"] == 512 << 20
    assert (workdir / "session-out" / "later.txt").read_text() == "notebook"
    pool.run(session=name, close=True)


@pytest.mark.parametrize("field, value", [
    ("allow_write", ["session-out"]),
    ("allow_read", ["."]),
    ("allow_network", True),
    ("allow_network", False),
    ("env", {"K": "v"}),
    ("memory", "512m"),
    ("max_file_size", "1m"),
    ("package_dirs", ["."]),
    ("profile", "analysis"),
    ("functions", ["search"]),
])
def test_a_later_step_with_a_permission_field_is_a_request_error(pool: PoolProcess, workdir: Path, field: str,
                                                                 value: object) -> None:
    (workdir / "session-out").mkdir(exist_ok=True)
    name = _session()
    _ok(pool.run("x = 'still here'", session=name))
    refused(pool.run("print('never')", session=name, **{field: value}), field)
    assert _ok(pool.run("print(x)", session=name))["stdout"] == "still here\n"
    pool.run(session=name, close=True)


def test_a_later_step_may_carry_code_name_args_timeout_and_max_output(pool: PoolProcess) -> None:
    name = _session()
    _ok(pool.run("x = 'y' * 50", session=name, timeout="10s"))
    step = _ok(pool.run("import sys\nprint(sys.argv)\nprint(x)", session=name, name="cell.py", args=["a", "b"],
                        timeout="5s", max_output=30))
    assert step["stdout"].startswith("['cell.py', 'a', 'b']\n")
    assert len(step["stdout"]) == 30 and step["stdout_truncated"] is True
    assert step["policy"]["timeout_ms"] == 5000
    full = _ok(pool.run("print(x)", session=name))
    assert full["stdout"] == "y" * 50 + "\n" and full["stdout_truncated"] is False
    pool.run(session=name, close=True)


def test_script_in_a_session_is_a_request_error(pool: PoolProcess, workdir: Path) -> None:
    (workdir / "session_script.py").write_text("print('never')\n")
    name = _session()
    refused(pool.run(script="session_script.py", session=name), "script")
    _ok(pool.run("x = 1", session=name))
    refused(pool.run(script="session_script.py", session=name), "script")
    pool.run(session=name, close=True)


def test_each_steps_output_is_captured_per_step(pool: PoolProcess) -> None:
    name = _session()
    first = _ok(pool.run("import os, sys\nprint('one')\nos.write(2, b'err-one')", session=name))
    second = _ok(pool.run("import os\nos.write(1, b'two\\n')", session=name))
    assert (first["stdout"], first["stderr"]) == ("one\n", "err-one")
    assert (second["stdout"], second["stderr"]) == ("two\n", "")
    pool.run(session=name, close=True)


def test_steps_queue_behind_each_other(pool: PoolProcess) -> None:
    name = _session()
    slow = pool.submit(session=name, code="import time\ntime.sleep(0.5)\norder = ['slow']\nprint('slow')")
    fast = pool.submit(session=name, code="order.append('fast')\nprint(order)")
    slow_result, fast_result = pool.result(slow), pool.result(fast)
    assert pool.index_of(slow_result) < pool.index_of(fast_result)
    assert fast_result["stdout"] == "['slow', 'fast']\n"
    assert (slow_result["step"], fast_result["step"]) == (1, 2)
    pool.run(session=name, close=True)


def test_sessions_and_plain_jobs_do_not_wait_for_each_other(pool: PoolProcess) -> None:
    name, other_name = _session(), _session()
    busy = pool.submit(session=name, code="import time\ntime.sleep(1.5)")
    other = pool.submit(session=other_name, code="print('other session')")
    jobs = [pool.submit(code=f"print({i})") for i in range(4)]
    for request_id in [other, *jobs]:
        assert pool.result(request_id)["exit"] == 0
    assert pool.responses(busy) == []
    pool.result(busy)
    pool.run(session=name, close=True)
    pool.run(session=other_name, close=True)


def test_the_ninth_pending_step_is_refused_until_the_session_catches_up(pool: PoolProcess) -> None:
    name = _session()
    ids = [pool.submit(session=name, code="import time\ntime.sleep(1)")]
    ids += [pool.submit(session=name, code=f"print({i})") for i in range(1, 8)]
    ninth = pool.result(pool.submit(session=name, code="print('ninth')"))
    refused(ninth, "pending")
    assert all(pool.responses(i) == [] for i in ids[:1]), "the ninth was refused only after the first finished"
    results = [pool.result(i) for i in ids]
    assert [r["step"] for r in results] == list(range(1, 9))
    assert [r["stdout"] for r in results[1:]] == [f"{i}\n" for i in range(1, 8)]
    caught_up = _ok(pool.run("print('caught up')", session=name))
    assert caught_up["step"] == 9
    pool.run(session=name, close=True)


def test_close_answers_closed_and_the_next_request_starts_fresh(pool: PoolProcess) -> None:
    name = _session()
    _ok(pool.run("x = 1", session=name))
    children_before = set(_session_children(pool))
    request_id = new_id("close")
    pool.send({"id": request_id, "session": name, "close": True})
    closed = pool.result(request_id)
    assert closed == {"id": request_id, "session": name, "closed": True}
    fresh = pool.run("print(x)", session=name)
    assert fresh["error"]["type"] == "NameError" and fresh["step"] == 1
    pool.run(session=name, close=True)
    assert children_before  # the session's process existed


def test_close_waits_for_the_running_step(pool: PoolProcess) -> None:
    name = _session()
    step = pool.submit(session=name, code="import time\ntime.sleep(0.5)\nprint('finished')")
    close = pool.submit(session=name, close=True)
    step_result, closed = pool.result(step), pool.result(close)
    assert step_result["stdout"] == "finished\n"
    assert closed["closed"] is True and pool.index_of(step_result) < pool.index_of(closed)


def test_refused_session_requests_carry_the_session(pool: PoolProcess, workdir: Path) -> None:
    (workdir / "session_script.py").write_text("print('never')\n")
    name = _session()
    _ok(pool.run("x = 1", session=name))
    for answer in (pool.run("print(1)", session=name, memory="1g"), pool.run(script="session_script.py",
                                                                              session=name)):
        refused(answer)
        assert (answer["session"], answer["step"], answer["session_ended"]) == (name, None, False), answer
    assert _ok(pool.run("print(x)", session=name))["step"] == 2
    pool.run(session=name, close=True)


def test_close_of_an_unknown_session_is_a_request_error(pool: PoolProcess) -> None:
    refused(pool.run(session="never-opened", close=True), "never-opened")


def test_close_takes_only_the_session(pool: PoolProcess) -> None:
    name = _session()
    _ok(pool.run("x = 1", session=name))
    refused(pool.run("print(1)", session=name, close=True))
    pool.run(session=name, close=True)


def _processes_of_the_session(pool: PoolProcess, plain: set[int]) -> list[int]:
    """The one session's child (new since ``plain``) and the template it was forked from (not a child the
    template waiting for the next session is forking, which carries the template's name until it is named)."""
    tree, table = pool.tree(), proc_table()
    children = [pid for pid, depth in tree.items()
                if depth == 2 and pid not in plain and table[pid][3] == "pynox-session"]
    assert len(children) == 1, tree
    return [table[children[0]][0], children[0]]


def _prepared_ahead(pool: PoolProcess, plain: set[int]) -> list[tuple[int, int]]:
    """(template, child) for each child prepared ahead below a template started since ``plain``: the template
    waiting for the next session, and the child it confined for it (which the pool's tree leaves out)."""
    table = proc_table()
    return [(table[pid][0], pid) for pid, depth in descendants(pool.pid, table).items()
            if depth == 2 and pid not in plain and table[pid][3] == READY_CHILD and prepared_for_a_session(pid)]


def test_closing_a_session_ends_its_processes(tmp_path: Path) -> None:
    with pool_process("--workers=1", cwd=tmp_path) as pool:
        plain = set(pool.tree())
        name = _session()
        _ok(pool.run("x = 1", session=name))
        added = _processes_of_the_session(pool, plain)
        assert pool.stats()["sessions_active"] == 1
        pool.run(session=name, close=True)
        assert wait_gone(added, 5) == []
        assert pool.stats()["sessions_active"] == 0


def test_a_new_session_is_handed_a_child_prepared_ahead_by_a_template_that_served_nothing(tmp_path: Path) -> None:
    """After a pool's first session, one fresh template waits for the next (a template takes ~150 ms to
    start), with a child forked and confined ahead with the first session's confinement: the next session
    confined the same way is handed that child, so its first step pays neither a fork nor a confinement.
    Neither served anything before; once taken, another pair is made for the session after."""
    with pool_process("--workers=1", cwd=tmp_path) as pool:
        plain = set(pool.tree())
        first = _session()
        _ok(pool.run("x = 1", session=first))
        deadline = time.monotonic() + 30
        while not (ready := _prepared_ahead(pool, plain)):
            assert time.monotonic() < deadline, pool.tree()
            time.sleep(0.02)
        assert len(ready) == 1, pool.tree()
        spare, waiting = ready[0]
        assert [pid for pid, (ppid, *_) in proc_table().items() if ppid == spare] == [waiting]  # nothing else ran there
        second = _session()
        pid = pool.run("import os\nprint(os.getpid())", session=second)
        assert pid["stdout"] == f"{waiting}\n", (pid, pool.tree())  # the child that waited runs the second session
        assert proc_table()[waiting][3] == "pynox-session"
        fresh = pool.run("print('x' in dir())", session=second)
        assert fresh["stdout"] == "False\n", fresh  # a session of its own: nothing of the first one
        while not (again := [pair for pair in _prepared_ahead(pool, plain) if pair[0] != spare]):
            assert time.monotonic() < deadline, pool.tree()
            time.sleep(0.02)
        assert len(again) == 1 and again[0][1] != waiting, pool.tree()  # the next pair is new
        for name in (first, second):
            pool.run(session=name, close=True)


def test_a_session_confined_otherwise_is_not_handed_the_child_prepared_ahead(tmp_path: Path) -> None:
    """The child waiting for the next session was confined with the last session's grants: a session whose
    grants differ (a read grant more here) never gets it. It is discarded and the session's own child is
    forked, and the grant is the session's own (a control read of the granted file, which the session
    before could not read)."""
    secret = tmp_path / "granted"
    secret.mkdir()
    (secret / "file.txt").write_text("only for the second session")
    with pool_process("--workers=1", cwd=tmp_path) as pool:
        plain = set(pool.tree())
        first = _session()
        denied = pool.run(f"print(open({str(secret / 'file.txt')!r}).read())", session=first)
        assert denied["error"]["type"] == "PermissionError", denied  # not granted: the policy denies it
        deadline = time.monotonic() + 30
        while not (ready := _prepared_ahead(pool, plain)):
            assert time.monotonic() < deadline, pool.tree()
            time.sleep(0.02)
        spare, waiting = ready[0]
        second = _session()
        granted = pool.run(f"import os\nprint(os.getpid(), open({str(secret / 'file.txt')!r}).read())",
                           session=second, allow_read=[str(secret)])
        assert granted["error"] is None, granted
        pid, text = granted["stdout"].split(" ", 1)
        assert text == "only for the second session\n"
        assert int(pid) != waiting  # a child of its own, forked for it by the same template
        assert proc_table()[int(pid)][0] == spare
        assert wait_gone([waiting], 5) == []  # the child confined otherwise was discarded
        # Its end was read before the session's own child was forked: between steps, the template has nothing
        # to say but that child's end, so the idle reaper (once a second) does not take the session for ended.
        time.sleep(1.5)
        later = pool.run("print('still here')", session=second)
        assert later["stdout"] == "still here\n" and later["step"] == 2, later
        for name in (first, second):
            pool.run(session=name, close=True)


def test_a_spare_template_being_prepared_as_the_pool_closes_is_closed_once(tmp_path: Path) -> None:
    """The pool closes while its spare template prepares a child for the next session: the spare's thread is
    using it, and it alone closes it. The pool's drain closed it too, and the second close closed descriptor
    numbers that were another's by then (CI saw the drain die on EBADF from the spare's memory cgroup
    descriptor). The spare is stopped, so that the preparation lasts until the pool closes; the pool runs under
    the descriptor audit, which reports a close of a number its closer no longer owns. (Two closes one after the
    other close nothing twice: the audit sees the two closers when they overlap, most runs with both; the
    table's own test, tests/pool/test_spare_life.py, fails on two closers every time.)"""
    audit, first, second = tmp_path / "audit", tmp_path / "first", tmp_path / "second"
    for directory in (audit, first, second):
        directory.mkdir()
    go = second / "go"
    with pool_process("--workers=1", cwd=tmp_path, env=fd_audit.audited(audit)) as pool:
        plain = set(pool.tree())
        # The pool's first session finds no template waiting and starts its own; its answer, once ``go``
        # exists, brings a want the spare was not prepared for, and the spare's thread prepares a child for it.
        held = pool.submit(code=f"import os, time\nwhile not os.path.exists({str(go)!r}): time.sleep(0.01)",
                           session=_session(), allow_write=[str(second)])
        deadline = time.monotonic() + 30
        while not [pid for pid, depth in pool.tree().items() if depth == 2 and pid not in plain]:
            assert time.monotonic() < deadline, pool.tree()
            time.sleep(0.02)
        _ok(pool.run("x = 1", session=_session(), allow_write=[str(first)]))
        while not (ready := _prepared_ahead(pool, plain)):
            assert time.monotonic() < deadline, pool.tree()
            time.sleep(0.02)
        os.kill(ready[0][0], signal.SIGSTOP)  # the spare reads nothing more: its next preparation lasts
        go.touch()
        _ok(pool.result(held))
        assert pool.finish(timeout=60) == 0, bytes(pool.stderr[-2000:])
    assert pool.pid in fd_audit.audited_pids(audit)  # the audit was on: its silence means something
    found = fd_audit.reports(audit)
    assert not found, "\n\n".join(found)
    assert b"Traceback" not in pool.stderr, bytes(pool.stderr[-2000:])


def test_a_session_ended_by_a_timeout_releases_its_slot_and_processes(tmp_path: Path) -> None:
    with pool_process("--workers=1", "--max-sessions=1", cwd=tmp_path) as pool:
        plain = set(pool.tree())
        name = _session()
        _ok(pool.run("x = 1", session=name))
        added = _processes_of_the_session(pool, plain)
        assert pool.run("import time\ntime.sleep(30)", session=name, timeout="500ms")["session_ended"] is True
        assert wait_gone(added, 5) == []
        assert pool.stats()["sessions_active"] == 0
        _ok(pool.run("x = 2", session=_session()))  # the only slot is free again


def test_steps_queued_behind_a_step_that_ended_the_session_are_answered(pool: PoolProcess) -> None:
    """Each accepted step gets exactly one answer, even when the session died under it."""
    name = _session()
    ending = pool.submit(session=name, code="while True:\n    pass", timeout="1s")
    queued = pool.submit(session=name, code="print('queued')")
    assert pool.result(ending)["session_ended"] is True
    answer = pool.result(queued)
    assert answer["session"] == name
    assert answer["error"] is None or answer["error"]["type"] == "RequestError", answer
    pool.quiet_for(lambda m: False, 0.2)
    assert len(pool.responses(ending)) == 1 and len(pool.responses(queued)) == 1
    pool.run(session=name, close=True) if answer["error"] is None else None


def test_sessions_end_with_the_pool(tmp_path: Path) -> None:
    with PoolProcess("--workers=1", cwd=tmp_path) as pool:
        for _ in range(2):
            _ok(pool.run("x = 1", session=_session()))
        pending = pool.submit(session=_session(), code="import time\ntime.sleep(0.5)\nprint('answered')")
        session_processes = list(pool.tree())
        pool.close_stdin()
        assert pool.wait_exit() == 0
        assert pool.result(pending)["stdout"] == "answered\n"
        assert wait_gone(session_processes, 5) == []


def test_max_sessions_and_session_idle(tmp_path: Path) -> None:
    # strict_session_reopen: the operator's opt-in under which a code-only step to a name the pool ended is
    # refused (the protocol itself opens a new session for it: see test_pool_sessions_as_written.py).
    with pool_process("--workers=1", "--max-sessions=2", "--session-idle=1s", "--strict-session-reopen",
                      cwd=tmp_path) as pool:
        a, b = _session(), _session()
        _ok(pool.run("x = 'a'", session=a))
        _ok(pool.run("x = 'b'", session=b))
        refused(pool.run("x = 'c'", session=_session()), "max_sessions")
        assert pool.stats()["sessions_active"] == 2
        # Steps keep a session alive; idleness closes it.
        for _ in range(3):
            time.sleep(0.4)
            assert _ok(pool.run("print(x)", session=a))["stdout"] == "a\n"
        deadline = time.monotonic() + 5
        while pool.stats()["sessions_active"] and time.monotonic() < deadline:
            time.sleep(0.1)
        assert pool.stats()["sessions_active"] == 0
        # The next step finds no session: refused, never run in one opened with the defaults.
        refused(pool.run("print(x)", session=a), "strict_session_reopen", "session_idle")
        _ok(pool.run("x = 'c'", session=_session()))


def test_max_sessions_defaults_to_16(tmp_path: Path) -> None:
    with pool_process("--workers=1", cwd=tmp_path) as pool:
        names = [_session() for _ in range(16)]
        ids = [pool.submit(session=name, code="x = 1") for name in names]
        for request_id in ids:
            _ok(pool.result(request_id, timeout=60))
        refused(pool.run("x = 1", session=_session()), "16")
        assert pool.stats()["sessions_active"] == 16
        closes = [pool.submit(session=name, close=True) for name in names]
        assert all(pool.result(request_id)["closed"] is True for request_id in closes)
        assert pool.stats()["sessions_active"] == 0


def test_a_session_name_is_required(pool: PoolProcess) -> None:
    refused(pool.run("x = 1", session=""))


def test_a_step_to_a_session_the_pool_does_not_hold_is_refused_not_opened_with_the_defaults(
        pool: PoolProcess) -> None:
    # After session_idle or a restart of the pool, a client's next step is code only: run with the defaults,
    # it would have other grants and limits than the session was opened with, and none of its state. A
    # client that will not have that says so with "open": false (the Python client does, on every later step).
    name = _session()
    answer = pool.run("print('ran')", session=name, timeout="5s", open=False)
    refused(answer, "no open session", name, '"open": false')
    assert answer["session_ended"] is True and answer["session"] == name
    # Nothing was opened under that name: closing it is refused too.
    refused(pool.run(session=name, close=True), "no open session")


def test_under_strict_session_reopen_a_code_only_step_to_an_ended_session_is_refused(tmp_path: Path) -> None:
    (tmp_path / "pynox.toml").write_text("[pool]\nstrict_session_reopen = true\n")
    with pool_process("--workers=1", "--config=pynox.toml", cwd=tmp_path) as pool:
        name = _session()
        pool.open_sessions.add(name)  # every request below goes out as given: code only
        # A name the pool never ended opens as the protocol says, even here.
        assert _ok(pool.run("x = 1", session=name))["step"] == 1
        assert pool.run("while True:\n    pass", session=name, timeout="500ms")["session_ended"] is True
        pool.open_sessions.add(name)
        answer = pool.run("print('ran')", session=name)
        refused(answer, "strict_session_reopen", "timed out", name)
        assert answer["session_ended"] is True
        # Its first request again, with its grants (or "open": true), opens it, and says the state is gone.
        reopened = _ok(pool.run("print('again')", session=name, open=True))
        assert reopened["session_reopened"] == "step 2 timed out" and reopened["step"] == 1, reopened
        pool.run(session=name, close=True)


def test_a_session_opens_with_open_true_or_with_its_grants(pool: PoolProcess) -> None:
    name, other = _session(), _session()
    opened = _ok(pool.run("x = 1", session=name))  # the driver says "open": true, as the Python client does
    assert opened["step"] == 1 and opened["policy"]["allow_read"] == []
    assert _ok(pool.run("print(x)", session=name))["stdout"] == "1\n"
    refused(pool.run("x = 2", session=name, open=True), "already open")
    # A request with a grant can only be a first request: it opens the session, as the protocol's example does.
    assert _ok(pool.run("y = 1", session=other, memory="256m"))["policy"]["memory_bytes"] == 256 << 20
    for session in (name, other):
        pool.run(session=session, close=True)
    refused(pool.run("print(1)", open=True), "open needs the session")


def test_the_child_waiting_for_the_next_session_is_confined_again_as_the_latest_session_was(tmp_path: Path) -> None:
    """Two sessions open at once, confined otherwise (B has a read grant): A is answered first, and the template
    waiting for the next session confines a child as A was; B is answered later, and the same template confines
    a child as B was in its place (the first one discarded). The next session confined as B is handed it."""
    granted = tmp_path / "granted"
    granted.mkdir()
    with pool_process("--workers=1", cwd=tmp_path) as pool:
        plain = set(pool.tree())
        # B's first step waits for the gate, opened once the child confined as A is seen: A is answered first
        # however slowly the template confines (a 4 s sleep here lost that race under load).
        gate = granted / "open"
        slow = pool.submit(code=f"import os, time\nwhile not os.path.exists({str(gate)!r}):\n    time.sleep(0.01)",
                           session="B", allow_read=[str(granted)])
        _ok(pool.run("x = 1", session="A"))
        deadline = time.monotonic() + 30
        while not (first := _prepared_ahead(pool, plain)):
            assert time.monotonic() < deadline, pool.tree()
            time.sleep(0.02)
        gate.touch()
        assert pool.result(slow)["error"] is None
        while not (again := [pair for pair in _prepared_ahead(pool, plain) if pair != first[0]]):
            assert time.monotonic() < deadline, pool.tree()
            time.sleep(0.02)
        assert again[0][0] == first[0][0], (first, again)  # the same template, which lives on
        assert wait_gone([first[0][1]], 5) == []
        step = pool.run("import os\nprint(os.getpid())", session="C", allow_read=[str(granted)])
        assert step["stdout"] == f"{again[0][1]}\n", (step, again)
        for name in ("A", "B", "C"):
            pool.run(session=name, close=True)
