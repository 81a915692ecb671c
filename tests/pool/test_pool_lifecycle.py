"""Lifecycle: a fresh process per job, timeouts, broken templates, draining, client death, backpressure."""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness import procfs
from tests.harness.clients import owning_client, wait_for_jobs

from . import pool_driver as driver

pytestmark = pytest.mark.timeout(90)


@pytest.fixture(scope="module")
def serial(tmp_path_factory: pytest.TempPathFactory) -> Iterator[driver.PoolProcess]:
    """A one-worker pool: consecutive jobs are forked from the same template."""
    with driver.pool_process("--workers=1", cwd=tmp_path_factory.mktemp("serial")) as pool:
        yield pool


def _wait_for_jobs(pool: driver.PoolProcess, count: int, deadline: float = 10.0) -> dict[int, int]:
    """Wait until ``count`` job processes (depth 2 below the pool) are running; returns pid -> template pid."""
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        tree = pool.tree()
        jobs = [pid for pid, depth in tree.items() if depth == 2]
        if len(jobs) >= count:
            parents = {}
            for pid in jobs:
                parents[pid] = procfs.stat(pid).ppid
            return parents
        time.sleep(0.02)
    raise AssertionError(f"{count} jobs did not start within {deadline}s: {pool.tree()}")


# --- a new process per job -------------------------------------------------------------------------------


def test_each_job_is_a_new_process_forked_from_a_template(serial: driver.PoolProcess) -> None:
    code = "import os\nprint(os.getpid(), os.getppid(), os.getsid(0))"
    seen = []
    for _ in range(3):
        pid, ppid, sid = map(int, serial.run(code)["stdout"].split())
        assert ppid in serial.templates()
        assert sid == pid  # its own session and process group
        seen.append(pid)
    assert len(set(seen)) == 3


# What one job leaves in its interpreter, seen by it (the control) and not by the next job.
_LEFT_BEHIND = {
    "globals and builtins": (
        "import builtins\nleaked_global = 1\nbuiltins.leaked_builtin = 2\n"
        "print('leaked_global' in globals(), hasattr(builtins, 'leaked_builtin'))", "True True\n",
        "import builtins\nprint('leaked_global' in globals(), hasattr(builtins, 'leaked_builtin'))", "False False\n"),
    "modules it imported": (
        "import sys, colorsys, wave\nsys.modules['planted'] = sys\n"
        "print('colorsys' in sys.modules, 'planted' in sys.modules)", "True True\n",
        "import sys\nprint('colorsys' in sys.modules, 'wave' in sys.modules, 'planted' in sys.modules)",
        "False False False\n"),
}


@pytest.mark.parametrize("what", list(_LEFT_BEHIND))
def test_what_a_job_leaves_in_its_interpreter_never_reaches_the_next_job(serial: driver.PoolProcess,
                                                                         what: str) -> None:
    first_code, first_seen, second_code, second_seen = _LEFT_BEHIND[what]
    assert serial.run(first_code)["stdout"] == first_seen
    assert serial.run(second_code)["stdout"] == second_seen


def test_environment_never_reaches_the_next_job(serial: driver.PoolProcess) -> None:
    first = serial.run("import os\nos.environ['LEAKED'] = 'yes'\nos.putenv('PUTENV_LEAK', 'yes')\n"
                       "print(os.environ['LEAKED'], os.environ['K'])", env={"K": "first"})
    assert first["stdout"] == "yes first\n"
    second = serial.run("import os\nenviron = open('/proc/self/environ', 'rb').read()\n"
                        "print('LEAKED' in os.environ, b'LEAK' in environ, os.environ.get('K'))")
    assert second["stdout"] == "False False None\n"


def test_open_files_never_reach_the_next_job(serial: driver.PoolProcess) -> None:
    workdir = Path(serial.run("import os\nprint(os.getcwd())")["stdout"].strip())
    (workdir / "held").mkdir(exist_ok=True)
    first = serial.run("import os\nheld = open('held/open.txt', 'w')\nos.dup2(held.fileno(), 42)\n"
                       "print(os.readlink('/proc/self/fd/42'))", allow_write=["held"])
    assert first["stdout"].strip().endswith("held/open.txt"), first
    second = serial.run("import os\nfds = sorted(int(fd) for fd in os.listdir('/proc/self/fd'))\n"
                        "links = [f'/proc/self/fd/{fd}' for fd in fds]\n"
                        "targets = [os.readlink(link) for link in links if os.path.exists(link)]\n"
                        "print(fds)\nprint(any('open.txt' in t for t in targets))")
    fds_line, leaked = second["stdout"].splitlines()
    assert leaked == "False"
    assert 42 not in json.loads(fds_line)
    # stdin, stdout, stderr, the report and the child's copy of it, the display channel, the listing itself
    assert len(json.loads(fds_line)) <= 7, fds_line


def test_authorized_writes_persist(serial: driver.PoolProcess) -> None:
    workdir = Path(serial.run("import os\nprint(os.getcwd())")["stdout"].strip())
    (workdir / "persist").mkdir(exist_ok=True)
    written = serial.run("open('persist/note.txt', 'w').write('kept')", allow_write=["persist"])
    assert written["exit"] == 0
    assert (workdir / "persist" / "note.txt").read_text() == "kept"
    read = serial.run("print(open('persist/note.txt').read())", allow_read=["persist"])
    assert read["stdout"] == "kept\n"


# --- timeouts -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("code", ["while True:\n    pass", "import time\ntime.sleep(60)"], ids=["cpu", "sleep"])
def test_a_timeout_kills_the_job_and_the_pool_keeps_serving(serial: driver.PoolProcess, code: str) -> None:
    result = serial.run(code, timeout="1s")
    assert result["exit"] == 124 and result["error"]["type"] == "TimeoutError"
    # The killed job is gone (a child the template forks ahead for the next job is not a job: jobs_of
    # leaves it out, named or not yet named).
    assert driver.wait_gone(driver.jobs_of(serial.pid), 3) == []
    assert serial.run("print('next')")["stdout"] == "next\n"


def test_an_interrupted_job_is_not_retried(serial: driver.PoolProcess) -> None:
    workdir = Path(serial.run("import os\nprint(os.getcwd())")["stdout"].strip())
    (workdir / "attempts").mkdir(exist_ok=True)
    code = "open('attempts/log', 'a').write('started\\n')\nwhile True:\n    pass"
    result = serial.run(code, timeout="500ms", allow_write=["attempts"])
    assert result["error"]["type"] == "TimeoutError"
    serial.run("print('after')")
    assert (workdir / "attempts" / "log").read_text() == "started\n"


# --- broken templates -----------------------------------------------------------------------------------


def test_template_killed_while_jobs_run(tmp_path: Path) -> None:
    """kill -9 a template mid-job: one PoolWorkerError, every other request answered once, and service goes on."""
    (tmp_path / "starts").mkdir()
    with driver.pool_process("--workers=2", cwd=tmp_path) as pool:
        before = pool.templates()
        long_ids = [driver.new_id("long") for _ in range(2)]
        for request_id in long_ids:
            pool.submit(id=request_id, allow_write=["starts"],
                        code=f"import time\nopen('starts/{request_id}', 'a').write('x')\ntime.sleep(2)\nprint('done')")
        queued = [pool.submit(code=f"print({i})") for i in range(4)]
        # Both jobs' code has run (a process alone may still be applying its policy).
        end = time.monotonic() + 10
        while not all((tmp_path / "starts" / request_id).exists() for request_id in long_ids):
            assert time.monotonic() < end, "the long jobs did not start"
            time.sleep(0.02)
        jobs = _wait_for_jobs(pool, 2)
        victim = next(iter(jobs.values()))
        victim_jobs = [pid for pid, parent in jobs.items() if parent == victim]
        os.kill(victim, signal.SIGKILL)

        results = {request_id: pool.result(request_id) for request_id in [*long_ids, *queued]}
        pool.quiet_for(lambda m: False, 0.5)  # and no second answer to any of them
        for request_id in [*long_ids, *queued]:
            assert len(pool.responses(request_id)) == 1, pool.responses(request_id)
        errors = [r for r in results.values() if r["error"] is not None]
        assert len(errors) == 1, errors
        assert errors[0]["error"]["type"] == "PoolWorkerError" and errors[0]["id"] in long_ids
        assert errors[0]["exit"] != 0
        survivor = next(r for r in results.values() if r["id"] in long_ids and r["error"] is None)
        assert survivor["stdout"] == "done\n"
        assert [results[i]["stdout"] for i in queued] == ["0\n", "1\n", "2\n", "3\n"]
        # The interrupted job was not retried, and its process is gone.
        assert (tmp_path / "starts" / errors[0]["id"]).read_text() == "x"
        assert driver.wait_gone(victim_jobs, 3) == []
        # The broken template was replaced; the pool serves the next request.
        after = pool.templates()
        assert victim not in after and len(after) == 2 and set(before) - {victim} <= set(after)
        assert pool.run("print('served')")["stdout"] == "served\n"
        stats = pool.stats()
        assert stats["worker_errors"] == 1 and stats["errors"]["PoolWorkerError"] == 1


def test_idle_templates_killed_are_replaced_before_the_next_request(tmp_path: Path) -> None:
    with driver.pool_process("--workers=2", cwd=tmp_path) as pool:
        before = pool.templates()
        for template in before:
            os.kill(template, signal.SIGKILL)
        assert driver.wait_gone(before, 3) == []
        results = [pool.result(pool.submit(code="print('fresh')")) for _ in range(4)]
        assert [r["stdout"] for r in results] == ["fresh\n"] * 4, results
        after = pool.templates()
        assert len(after) == 2 and not set(after) & set(before)


def test_a_template_that_cannot_be_replaced_fails_jobs_clearly_until_it_can(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    module = site / "operator_preload.py"
    module.write_text("X = 1\n")
    with driver.pool_process("--workers=1", f"--package-dir={site}", "--preload=operator_preload",
                             cwd=tmp_path) as pool:
        assert pool.run("import operator_preload\nprint(operator_preload.X)")["stdout"] == "1\n"
        hidden = module.rename(tmp_path / "operator_preload.off")
        shutil.rmtree(site / "__pycache__", ignore_errors=True)
        # The zygote templates are forked from too: it holds the preload, so forks of it could still replace them.
        table = driver.proc_table()
        templates = pool.templates() + [pid for pid in driver.descendants(pool.pid, table)
                                        if table[pid][3] == driver.ZYGOTE]
        for template in templates:
            os.kill(template, signal.SIGKILL)
        assert driver.wait_gone(templates, 3) == []  # dead before the next request: the pool must notice
        for _ in range(2):  # every job gets an answer saying why, and the pool keeps trying
            failed = pool.run("print(1)")
            assert failed["error"]["type"] == "PoolWorkerError", failed
            assert "operator_preload" in failed["error"]["message"], failed["error"]["message"]
        hidden.rename(module)
        assert pool.run("print('back')")["stdout"] == "back\n"


# --- draining and exiting -------------------------------------------------------------------------------


def test_eof_drains_accepted_jobs_and_exits_0(tmp_path: Path) -> None:
    with driver.PoolProcess("--workers=1", cwd=tmp_path) as pool:
        ids = [pool.submit(code=f"import time\ntime.sleep(0.3)\nprint({i})") for i in range(3)]
        pool.close_stdin()
        status = pool.wait_exit()
        assert [pool.result(request_id)["stdout"] for request_id in ids] == ["0\n", "1\n", "2\n"]
        assert status == 0


def test_eof_exit_status_is_0_even_when_jobs_failed(tmp_path: Path) -> None:
    with driver.PoolProcess("--workers=2", cwd=tmp_path) as pool:
        failing = pool.submit(code="raise SystemExit(9)")
        refused = pool.submit(code="print(1)", bogus=1)
        pool.close_stdin()
        assert pool.wait_exit() == 0
        assert pool.result(failing)["exit"] == 9
        assert pool.result(refused)["error"]["type"] == "RequestError"


def test_sigterm_drains_accepted_jobs_too(tmp_path: Path) -> None:
    with driver.PoolProcess("--workers=1", cwd=tmp_path) as pool:
        assert pool.run("x = 'open'", session="left-open")["exit"] == 0
        ids = [pool.submit(code=f"import time\ntime.sleep(0.4)\nprint({i})") for i in range(3)]
        step = pool.submit(session="left-open", code="import time\ntime.sleep(0.4)\nprint(x)")
        pool.stats()  # answered after the lines before it were read: they are accepted
        family = list(pool.tree())
        pool.proc.send_signal(signal.SIGTERM)
        status = pool.wait_exit()
        assert [pool.result(request_id)["stdout"] for request_id in ids] == ["0\n", "1\n", "2\n"]
        assert pool.result(step)["stdout"] == "open\n"
        assert status == 0
        assert driver.wait_gone(family, 5) == []


_CLIENT = """
import json, subprocess, sys, time
pool = subprocess.Popen(sys.argv[1:], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
ready = pool.stdout.readline()
pool.stdin.write(b'{"id": "long", "code": "import time\\\\ntime.sleep(60)"}\\n')
pool.stdin.write(b'{"id": "step", "session": "nb", "open": true, "code": "import time\\\\ntime.sleep(60)"}\\n')
pool.stdin.flush()
print(json.dumps({"pool": pool.pid, "ready": json.loads(ready)}), flush=True)
time.sleep(120)
"""


def test_when_the_client_dies_the_pool_and_all_its_processes_exit(tmp_path: Path) -> None:
    with owning_client(_CLIENT, *driver.POOL, "--workers=2", cwd=tmp_path) as (client, pool_pid):
        wait_for_jobs(pool_pid, 2, 10, "the job and the session step")
        # The pool, its three templates (two workers, one session), the job and the session's child,
        # and any child prepared ahead of its job.
        family = [pool_pid, *driver.descendants(pool_pid)]
        assert len(driver.jobs_of(pool_pid)) == 2 and len(family) >= 6
        os.kill(client.pid, signal.SIGKILL)
        client.wait(10)
        assert driver.wait_gone(family, 3) == [], "the pool or its processes outlived their client"
    driver.assert_no_leftovers()


# --- flow control ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("workers", [1, 2])
def test_intake_reads_past_the_queue_of_twice_the_workers(tmp_path: Path, workers: int) -> None:
    """The queue holds at least twice the worker count (the protocol's), and intake never stops reading to wait
    for a worker: a stats line behind more jobs than that is answered before any worker comes free (it used to
    wait until one did). The bound is [pool] max_queued, beyond which a job is refused: test_pool_admission."""
    with driver.pool_process(f"--workers={workers}", cwd=tmp_path) as pool:
        busy = [pool.submit(code="import time\ntime.sleep(1.5)") for _ in range(workers)]
        _wait_for_jobs(pool, workers)
        waiting = [pool.submit(code="print('queued')") for _ in range(3 * workers + 1)]
        answer = pool.stats()
        assert answer["queue_capacity"] >= 2 * workers and answer["queued"] == 3 * workers + 1
        first_busy = min(pool.index_of(pool.result(i)) for i in busy)
        assert pool.index_of(answer) < first_busy  # answered while every worker was still busy
        for request_id in [*busy, *waiting]:
            assert pool.result(request_id)["exit"] == 0


def test_stdout_backpressure_blocks_the_pool_without_growing_its_memory(tmp_path: Path) -> None:
    (tmp_path / "marks").mkdir()
    size, count = 256 * 1024, 60
    code = "import sys\nopen('marks/' + sys.argv[1], 'w')\nsys.stdout.write('x' * {size})"
    with driver.pool_process("--workers=2", cwd=tmp_path) as pool:
        for _ in range(4):  # warm up the allocator with results of this size
            assert len(pool.run(code.format(size=size), args=["warmup"], allow_write=["marks"])["stdout"]) == size
        baseline = driver.rss_kb(pool.pid)
        pool.pause_reading()
        ids = [driver.new_id("bp") for _ in range(count)]
        sender = threading.Thread(target=lambda: [
            pool.send({"id": i, "code": code.format(size=size), "args": [i], "allow_write": ["marks"]}) for i in ids
        ], daemon=True)
        sender.start()
        time.sleep(3)
        ran = len(list((tmp_path / "marks").iterdir())) - 1
        grown = driver.rss_kb(pool.pid) - baseline
        pool.resume_reading()
        sender.join(20)
        assert not sender.is_alive()
        results = [pool.result(i) for i in ids]
        assert all(len(r["stdout"]) == size for r in results)
        # Two workers each blocked on a result the pipe cannot take: a few jobs, not all sixty.
        assert ran <= 6, f"{ran} jobs ran while nobody read the results"
        assert grown < 16 * 1024, f"the pool grew by {grown} KiB while its client did not read"
