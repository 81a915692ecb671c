"""What every job's child runs after its fork because of what its template loaded.

A module whose import registers an after-fork hook makes every child of the template run it, whether its job
needs it or not: threading's (Python that rebuilds its locks and thread registry) costs a child ~110
copy-on-write faults (docs/performance.md). pynox's own modules leave threading unloaded in a template (the job's
host-call channel waits on _thread's locks, pyseccomp loads without it, see policy/seccomp.py), so a job of a
default template finds it not loaded, and a job that uses threads imports it as any interpreter does. Controls:
the probe sees threading once a preload loads it, and threads work as in any interpreter, a non-daemon one
outliving the job's code included.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .pool_driver import pool_process

pytestmark = pytest.mark.timeout(120)

PROBE = "import sys\nprint(sorted(m for m in ('threading', 'logging', 'subprocess') if m in sys.modules))"


def test_a_default_templates_job_finds_threading_not_loaded(tmp_path: Path) -> None:
    with pool_process("--workers=1", cwd=tmp_path) as pool:
        for _ in range(3):  # the first job's child, forked for it, then children prepared ahead
            result = pool.run(PROBE)
            assert result["exit"] == 0 and result["stdout"] == "[]\n", result
        for _ in range(2):  # with host functions: the child's channel, and a prepared child's rehearsal of it
            result = pool.run("from pynox_host import f\nf()\n" + PROBE, host={"f": lambda: None})
            assert result["exit"] == 0 and result["stdout"] == "[]\n", result
    # Control: a template whose preload loads threading (logging does) gives its jobs threading, and the probe says so.
    with pool_process("--workers=1", "--preload=logging", cwd=tmp_path) as pool:
        result = pool.run(PROBE)
        assert result["exit"] == 0 and result["stdout"] == "['logging', 'threading']\n", result



# What a template leaves to the jobs that need it: each would be imported into every template, so that every job's
# fork copies (and each child's exit unmaps) its memory, for a rare path or none (docs/performance.md, "The
# template, smaller"). dataclasses brings inspect, dis and their own imports; ipaddress was the resolver's alone;
# typing_extensions is kept out of msgspec's import (server/templates.py); ctypes.util, shutil, subprocess, tempfile
# and random of pyseccomp's (policy/seccomp.py); threading and logging as above.
LEFT_TO_JOBS = ("ctypes.util", "dataclasses", "dis", "inspect", "ipaddress", "logging", "random", "shutil",
                "subprocess", "tempfile", "threading", "typing_extensions")
LOADED = f"import sys\nprint(sorted(m for m in {LEFT_TO_JOBS!r} if m in sys.modules))"


def test_a_templates_jobs_find_what_it_leaves_to_them_not_loaded(tmp_path: Path) -> None:
    with pool_process("--workers=1", cwd=tmp_path) as pool:
        for _ in range(3):  # the first job's child, forked for it, then children prepared ahead
            result = pool.run(LOADED)
            assert result["exit"] == 0 and result["stdout"] == "[]\n", result
        result = pool.run("from pynox_host import f\nf()\n" + LOADED, host={"f": lambda: None})
        assert result["exit"] == 0 and result["stdout"] == "[]\n", result
        for _ in range(2):  # a session's template, forked from the zygote, and its child's later step
            result = pool.run(LOADED, session="left-to-jobs")
            assert result["exit"] == 0 and result["stdout"] == "[]\n", result
        pool.run(session="left-to-jobs", close=True)
    # Control: a template that preloads dataclasses holds it and what it imports, and its jobs see them.
    with pool_process("--workers=1", "--preload=dataclasses", cwd=tmp_path) as pool:
        result = pool.run(LOADED)
        assert result["exit"] == 0 and result["stdout"] == "['dataclasses', 'dis', 'inspect']\n", result


THREADS = """
import threading, time
def late():
    time.sleep(0.3)
    print("the thread ended", flush=True)
threading.Thread(target=late).start()  # not a daemon: the job ends after it, as an interpreter's exit waits for it
main = threading.main_thread()
print(main is threading.current_thread(), main.ident == threading.get_ident(), threading.active_count(), flush=True)
"""


@pytest.mark.parametrize("preload", [None, "logging"], ids=["threading unloaded", "threading preloaded"])
def test_a_job_that_uses_threads_runs_them_as_any_interpreter(tmp_path: Path, preload: str | None) -> None:
    with pool_process("--workers=1", *([f"--preload={preload}"] if preload else []), cwd=tmp_path) as pool:
        for _ in range(3):  # a child forked for its job, then prepared ones
            result = pool.run(THREADS)
            assert result["exit"] == 0, result
            assert result["stdout"] == "True True 2\nthe thread ended\n", result
