"""Starting: the command line, the ready event, preloads and the template's self-checks."""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.harness import procfs
from tests.setup_facts import KERNEL_ABI

from .pool_driver import POOL, PoolProcess, assert_no_leftovers, own_commands_env, pool_process, proc_table, zygotes

pytestmark = pytest.mark.timeout(90)

READY_FIELDS = {"event", "workers", "runtime", "preloaded_modules", "package_dirs", "config", "profiles"}


def test_ready_event_is_the_first_line_with_every_field(pool: PoolProcess) -> None:
    ready = pool.messages[0]
    assert ready is pool.ready
    assert set(ready) >= READY_FIELDS, ready
    assert ready["event"] == "ready"
    assert ready["workers"] == 2
    assert ready["runtime"] == "pynox"
    assert ready["preloaded_modules"] == []
    assert ready["package_dirs"] == []
    assert ready["config"] is None
    assert ready["profiles"] == []


def test_workers_flag_sets_the_number_of_templates(tmp_path: Path) -> None:
    with pool_process("--workers=3", cwd=tmp_path) as pool:
        assert pool.ready["workers"] == 3
        assert len(pool.templates()) == 3
        assert pool.run("print('ok')")["stdout"] == "ok\n"


def test_printf_one_liner_from_the_issue(tmp_path: Path) -> None:
    """`printf '{"id":1,"code":"print(2+2)"}\\n' | pynox pool --workers=2`: ready, the result, exit 0."""
    env = own_commands_env()
    pynox = shutil.which("pynox", path=env["PATH"])
    assert pynox == os.path.join(os.path.dirname(sys.executable), "pynox"), \
        f"the pynox console script must be installed beside {sys.executable}, found {pynox}"
    done = subprocess.run(["sh", "-c", """printf '{"id":1,"code":"print(2+2)"}\\n' | pynox pool --workers=2"""],
                          capture_output=True, timeout=60, cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(lines) == 2, lines
    assert lines[0]["event"] == "ready"
    assert lines[1]["id"] == 1 and type(lines[1]["id"]) is int
    assert lines[1]["stdout"] == "4\n"
    assert lines[1]["exit"] == 0
    assert_no_leftovers()


def _module(directory: Path, name: str, source: str) -> Path:
    directory.mkdir(exist_ok=True)
    path = directory / f"{name}.py"
    path.write_text(textwrap.dedent(source))
    return path


def _refused_start(*args: str, cwd: Path, command: list[str] = POOL) -> tuple[dict[str, object], str]:
    """Start a pool that must refuse to start: its error event, its stderr; no ready, exit non-zero."""
    pool = PoolProcess(*args, cwd=cwd, expect_ready=False, command=command)
    try:
        first = pool.wait_for(lambda m: True, timeout=60)
        status = pool.wait_exit()
    finally:
        pool.kill()
    assert first.get("event") == "error", first
    assert status != 0
    assert not any(m.get("event") == "ready" for m in pool.messages)
    return first, pool.stderr.decode()


@pytest.mark.parametrize("daemon", [True, False], ids=["daemon-thread", "non-daemon-thread"])
def test_preload_that_leaves_a_thread_is_rejected_naming_it(tmp_path: Path, daemon: bool) -> None:
    _module(tmp_path / "pkgs", "chatty_poller", f"""
        import threading, time
        threading.Thread(target=time.sleep, args=(3600,), name="poller", daemon={daemon}).start()
    """)
    event, stderr = _refused_start("--workers=2", f"--package-dir={tmp_path / 'pkgs'}", "--preload=chatty_poller",
                                   cwd=tmp_path)
    message = event["error"]["message"]  # type: ignore[index]
    assert "chatty_poller" in message and "thread" in message, message
    assert "chatty_poller" in stderr


def test_preload_that_leaves_a_descriptor_open_is_rejected(tmp_path: Path) -> None:
    _module(tmp_path / "pkgs", "keeps_a_file", """
        _held = open(__file__)
    """)
    event, _ = _refused_start(f"--package-dir={tmp_path / 'pkgs'}", "--preload=keeps_a_file", cwd=tmp_path)
    message = event["error"]["message"]  # type: ignore[index]
    assert "keeps_a_file" in message and "descriptor" in message, message


def test_preload_of_a_missing_module_is_a_clear_startup_error(tmp_path: Path) -> None:
    event, _ = _refused_start("--preload=no_such_module_pynox_test", cwd=tmp_path)
    assert "no_such_module_pynox_test" in event["error"]["message"]  # type: ignore[index]


def test_a_hard_open_file_limit_below_a_jobs_refuses_the_start(tmp_path: Path) -> None:
    # Every job's RLIMIT_NOFILE is 1024, soft and hard, and no process may raise its hard limit: under a pool
    # with less, every job failed in its setup with "setrlimit: Operation not permitted".
    if shutil.which("prlimit") is None:
        pytest.skip("no prlimit(1) here")
    error, _ = _refused_start("--workers=1", cwd=tmp_path, command=["prlimit", "--nofile=200", *POOL])
    assert "hard limit of open files is 200" in json.dumps(error), error
    # The control: at 1024 the pool starts and its jobs run.
    with pool_process("--workers=1", cwd=tmp_path, command=["prlimit", "--nofile=1024", *POOL]) as pool:
        assert pool.run("print(7)")["stdout"] == "7\n"


def test_preload_numpy_works_with_blas_pinned(tmp_path: Path) -> None:
    pytest.importorskip("numpy")  # a dev dependency of the workspace
    with pool_process("--workers=2", "--preload=numpy", cwd=tmp_path) as pool:
        assert pool.ready["preloaded_modules"] == ["numpy"]
        # Single-threaded templates, as the self-check proved: no BLAS thread pool is running.
        for template in pool.templates():
            assert len(procfs.tasks(template)) == 1
        result = pool.run("import sys\nprint('numpy' in sys.modules)\nimport numpy as np\n"
                          "a = np.arange(16.0).reshape(4, 4)\nprint((a @ a.T).trace())")
        assert result["exit"] == 0, result
        assert result["stdout"] == "True\n1240.0\n"
        assert result["runtime"]["preloaded_modules"] == ["numpy"]


def test_package_dir_is_importable_and_readable_in_every_job(tmp_path: Path) -> None:
    module = _module(tmp_path / "site", "operator_helpers", "VALUE = 42\n")
    site = os.path.realpath(tmp_path / "site")
    with pool_process("--workers=2", f"--package-dir={tmp_path / 'site'}", cwd=tmp_path) as pool:
        assert pool.ready["package_dirs"] == [site]
        for _ in range(3):  # whichever template serves it
            result = pool.run(f"import operator_helpers\nprint(operator_helpers.VALUE)\n"
                              f"print(open({str(module)!r}).read(), end='')")
            assert result["stdout"] == "42\nVALUE = 42\n", result


def test_no_job_may_write_over_preloaded_runtime_paths(tmp_path: Path) -> None:
    numpy = pytest.importorskip("numpy")
    _module(tmp_path / "site", "operator_helpers", "VALUE = 42\n")
    with pool_process("--workers=1", "--preload=numpy", f"--package-dir={tmp_path / 'site'}", cwd=tmp_path) as pool:
        for target in (str(tmp_path / "site"), os.path.dirname(numpy.__file__), sys.prefix):
            refused = pool.run("print('never')", allow_write=[target])
            assert refused["error"]["type"] == "RequestError", refused
            assert refused["stdout"] == ""
        # And without a grant, the preloaded module's files are read-only to the job.
        denied = pool.run(f"open({numpy.__file__!r}, 'a')")
        assert denied["error"]["type"] == "PermissionError", denied


@pytest.mark.parametrize("args, named", [
    (["--workers=0"], "--workers"),
    (["--session-idle=soon"], "soon"),
    (["--package-dir=/no/such/dir"], "/no/such/dir"),
], ids=["workers", "session-idle", "package-dir"])
def test_bad_command_line_values_refuse_the_start(tmp_path: Path, args: list[str], named: str) -> None:
    event, stderr = _refused_start(*args, cwd=tmp_path)
    assert named in event["error"]["message"] and named in stderr  # type: ignore[index]


def test_templates_run_the_pool_interpreter(pool: PoolProcess) -> None:
    result = pool.run("import platform, sys\nprint(platform.python_version())")
    assert result["stdout"] == platform.python_version() + "\n"
    # The templates are forks of the pool's zygote, itself the pool's child: each a separate process.
    table = proc_table()
    [zygote] = zygotes(pool.pid)
    assert table[zygote][0] == pool.pid
    assert pool.templates() and all(table[pid][0] == zygote for pid in pool.templates())


# A rename between two directories of one write grant: Landlock ABI 1 has no refer right and refuses every
# rename across directories (EXDEV); from ABI 2 it is allowed inside a write grant.
_RENAME = """
import os
os.makedirs("a", exist_ok=True); os.makedirs("b", exist_ok=True)
open("a/f", "w").close()
try:
    os.rename("a/f", "b/f")
    print("renamed")
except OSError as exc:
    print("errno", exc.errno)
"""


@pytest.mark.skipif(KERNEL_ABI < 2, reason="needs a kernel of Landlock ABI 2 to tell ABI 1 from it")
def test_landlock_abi_caps_what_the_kernel_enforces(tmp_path: Path) -> None:
    # The cap is not a label: the kernel enforces ABI 1's rules on the capped pool's jobs, and the control,
    # the same job on an uncapped pool, shows the kernel's own ABI allowing it.
    with pool_process("--landlock-abi=1", cwd=tmp_path) as pool:
        result = pool.run(_RENAME, allow_write=[str(tmp_path)])
        assert result["stdout"] == "errno 18\n", result
        assert result["policy"]["landlock_abi"] == 1
    (tmp_path / "a" / "f").unlink()
    env = {k: v for k, v in os.environ.items() if k != "PYNOX_LANDLOCK_ABI"}
    with pool_process(cwd=tmp_path, env=env) as pool:
        result = pool.run(_RENAME, allow_write=[str(tmp_path)])
        assert result["stdout"] == "renamed\n", result
        assert result["policy"]["landlock_abi"] == KERNEL_ABI
