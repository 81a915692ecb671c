"""The ``packages`` grant through the protocol: the pool installs what a request names, the job imports it.

Every package here is built by the test (tests/wheelhouse.py) and installed from a wheelhouse directory or a
simple index served on loopback: no network beyond this machine. What the pool did is judged from outside:
uv's invocations (logged by a wrapper the config names as ``[pool] uv``), the environments on disk, and the
marker a source distribution's build would have written.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.wheelhouse import Wheelhouse, make_wheelhouse, pool_config, serve_index, uv_logger

from .pool_driver import PoolProcess, pool_process, refused

pytestmark = pytest.mark.timeout(180)


class Setup:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.house: Wheelhouse = make_wheelhouse(root)
        self.packages_dir = root / "packages"
        self.uv_log = root / "uv.log"
        self.uv = uv_logger(root / "bin", self.uv_log)
        self.work = root / "work"  # where the ceiling lets a job write (the controls')
        self.work.mkdir()

    def config(self, name: str = "pynox.toml", **kwargs: Any) -> Path:
        kwargs.setdefault("find_links", [str(self.house.dir)])
        extra = kwargs.pop("extra_pool", "")
        kwargs.setdefault("extra_limits", f"allow_write = [{str(self.work)!r}]")
        return pool_config(self.root / name, packages_dir=self.packages_dir,
                           extra_pool=f"uv = {str(self.uv)!r}\n{extra}", **kwargs)

    def installs(self) -> list[str]:
        """The pool's ``uv pip install`` invocations so far (each one an environment built)."""
        if not self.uv_log.exists():
            return []
        return [line for line in self.uv_log.read_text().splitlines() if line.startswith("pip install")]

    def environments(self) -> list[Path]:
        envs = self.packages_dir / "envs"
        return sorted(path for path in envs.iterdir() if not path.name.startswith(".")) if envs.exists() else []


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Setup:
    return Setup(tmp_path_factory.mktemp("packages"))


@pytest.fixture(scope="module")
def pool(setup: Setup) -> Iterator[PoolProcess]:
    with pool_process(f"--config={setup.config()}", "--workers=2", cwd=setup.root) as pool:
        yield pool


def _tree(root: Path) -> dict[str, str]:
    """Every file beneath ``root``, by its path, with its mode and the hash of its content."""
    found = {}
    for directory, _, files in os.walk(root):
        for name in files:
            path = os.path.join(directory, name)
            found[path] = f"{oct(os.stat(path).st_mode)} {hashlib.sha256(Path(path).read_bytes()).hexdigest()}"
    return found


def test_a_job_imports_a_package_the_pool_installed_for_it(pool: PoolProcess, setup: Setup) -> None:
    assert pool.ready["installs_packages"] is True
    result = pool.run("import tinypkg, tinydep\nprint(tinypkg.VALUE, tinypkg.__file__)", packages=["tinypkg"])
    assert result["exit"] == 0, result
    value, where = result["stdout"].split()
    # 2.0, the newest, which needs tinydep: the pool installed the dependency too, into the same environment.
    assert value == "42"
    [env] = [env for env in setup.environments() if Path(where).is_relative_to(env)]
    assert (env / "tinydep" / "__init__.py").is_file()
    # The control: the same code without the grant finds no such module, and its hint names the grant.
    plain = pool.run("import tinypkg")
    assert plain["error"]["type"] == "ModuleNotFoundError"
    assert 'packages=["tinypkg"]' in plain["error"]["hint"], plain


def test_the_ceiling_bounds_the_versions(pool: PoolProcess, setup: Setup, tmp_path: Path) -> None:
    config = setup.config("pinned.toml", allowed=["tinypkg<2"])
    with pool_process(f"--config={config}", "--workers=1", cwd=setup.root) as pinned:
        result = pinned.run("import tinypkg\nprint(tinypkg.VALUE)", packages=["tinypkg"])
        assert result["stdout"] == "41\n", result
        # A request cannot widen the ceiling: no version is both >=2 and <2.
        refused(pinned.run("print(1)", packages=["tinypkg>=2"]), "tinypkg>=2 conflicts with tinypkg<2",
                "[pool.limits] ceiling")


def test_a_package_outside_the_ceiling_is_refused_with_the_ceiling_named(pool: PoolProcess, setup: Setup) -> None:
    before = setup.installs()
    message = refused(pool.run("import scipy", packages=["scipy"]), "scipy", "[pool.limits]", "tinypkg")
    assert "ask the operator" in message
    assert setup.installs() == before  # refused before anything was asked of uv


@pytest.mark.parametrize("entry", ["tinypkg @ file:///etc", "--index-url=http://127.0.0.1:1/", "tinypkg[extra]",
                                   "./tinypkg", "tinypkg; python_version > '3'", ""])
def test_a_packages_entry_of_any_other_form_is_refused(pool: PoolProcess, entry: str) -> None:
    refused(pool.run("print(1)", packages=[entry]), "packages:", "no extras, markers, URLs, paths or options")


def test_a_source_distribution_is_refused_and_never_built(pool: PoolProcess, setup: Setup) -> None:
    message = refused(pool.run("import onlysrc", packages=["onlysrc"]), "onlysrc", "only a source distribution",
                      "wheels only")
    assert "Ask for a version that has a wheel" in message
    assert not setup.house.sdist_marker.exists()  # its setup.py never ran on the host


def test_a_package_not_in_the_index_is_refused_as_not_found(pool: PoolProcess, setup: Setup, tmp_path: Path) -> None:
    config = setup.config("open.toml", allowed=None)  # no [pool.limits]: any name the wheelhouse has
    with pool_process(f"--config={config}", "--workers=1", cwd=setup.root) as open_pool:
        refused(open_pool.run("print(1)", packages=["nosuchpkg"]), "nosuchpkg", "was not found", "check the name")
        assert open_pool.run("import tinydep\nprint(tinydep.BASE)", packages=["tinydep"])["stdout"] == "40\n"


def test_an_environment_larger_than_the_cap_is_refused(setup: Setup) -> None:
    config = setup.config("small.toml", extra_pool='max_install_size = "100k"')
    with pool_process(f"--config={config}", "--workers=1", cwd=setup.root) as small:
        refused(small.run("import bigpkg", packages=["bigpkg"]), "bigpkg",
                "1.0 MiB, more than this pool's max_install_size", "100k")
        assert small.run("import tinydep", packages=["tinydep"])["exit"] == 0  # the control: a small one fits
    assert not any((env / "bigpkg").exists() for env in setup.environments())


def test_ten_jobs_asking_for_the_same_set_at_once_share_one_install(setup: Setup) -> None:
    config = setup.config("ten.toml", allowed=["tinypkg", "tinydep", "bigpkg"])
    fresh = ["bigpkg", "tinydep"]  # a set no other test installs
    with pool_process(f"--config={config}", "--workers=2", cwd=setup.root) as pool:
        before = len(setup.installs())
        ids = [pool.submit(code="import bigpkg, tinydep\nprint(len(bigpkg.DATA) + tinydep.BASE)", packages=fresh)
               for _ in range(10)]
        results = [pool.result(request_id, timeout=60) for request_id in ids]
        assert [result["stdout"] for result in results] == [f"{(1 << 20) + 40}\n"] * 10, results
        assert len(setup.installs()) == before + 1, setup.installs()
        # A later job asking for it again costs a path entry: no uv at all (not even to resolve).
        invocations = setup.uv_log.read_text()
        assert pool.run("import bigpkg", packages=list(reversed(fresh)))["exit"] == 0
        assert setup.uv_log.read_text() == invocations


def test_the_installed_environment_cannot_be_written_by_a_job(pool: PoolProcess, setup: Setup) -> None:
    assert pool.run("import tinypkg", packages=["tinypkg"])["exit"] == 0
    [env] = [env for env in setup.environments() if (env / "tinypkg").exists() and (env / "tinydep").exists()]
    before = _tree(env)
    attempt = ("import os, tinypkg\n"
               "here = os.path.dirname(tinypkg.__file__)\n"
               "for how in (lambda: open(tinypkg.__file__, 'a').write('VALUE = 0'),\n"
               "            lambda: open(os.path.join(here, 'planted.py'), 'w').write('x = 1'),\n"
               "            lambda: os.chmod(tinypkg.__file__, 0o777),\n"
               "            lambda: os.remove(tinypkg.__file__)):\n"
               "    try:\n"
               "        how()\n"
               "        print('wrote')\n"
               "    except OSError as exc:\n"
               "        print(type(exc).__name__)\n")
    result = pool.run(attempt, packages=["tinypkg"])
    assert result["exit"] == 0, result
    assert "wrote" not in result["stdout"], result["stdout"]
    assert _tree(env) == before  # checked from outside: not a byte or a mode changed
    assert all(not os.stat(path).st_mode & 0o222 for path in before)  # and nothing in it has a write bit
    # The control: the same attempts where the job may write do write.
    work = setup.work
    (work / "tinypkg").mkdir(parents=True)
    (work / "tinypkg" / "__init__.py").write_text("VALUE = 1\n")
    control = pool.run(attempt.replace("import os, tinypkg\n", f"import os, sys\nsys.path.insert(0, {str(work)!r})\n"
                                                                "import tinypkg\n"), allow_write=[str(work)])
    assert control["stdout"].count("wrote") == 4, control


def test_a_session_imports_its_packages_in_every_step(pool: PoolProcess) -> None:
    first = pool.run("import tinypkg\nvalue = tinypkg.VALUE", session="with-packages", packages=["tinypkg"])
    assert first["exit"] == 0, first
    assert pool.run("print(value, tinypkg.VALUE)", session="with-packages")["stdout"] == "42 42\n"
    refused(pool.run("print(1)", session="with-packages", packages=["tinydep"]), "permissions are fixed",
            "packages")
    pool.run(session="with-packages", close=True)


def test_a_pool_that_installs_nothing_refuses_packages_and_its_hints_do_not_offer_them(tmp_path: Path) -> None:
    with pool_process("--workers=1", cwd=tmp_path) as plain:
        assert plain.ready["installs_packages"] is False
        refused(plain.run("print(1)", packages=["tinypkg"]), "installs no packages", "package_index or find_links")
        refused(plain.run("print(1)", session="s", pip_install=True), "pip_install: this pool installs no packages")
        hint = plain.run("import tinypkg")["error"]["hint"]
        assert "tinypkg is not installed" in hint and "packages=" not in hint, hint


def test_installing_from_a_local_index_on_loopback(setup: Setup) -> None:
    with serve_index(setup.house.dir) as url:
        config = setup.config("index.toml", find_links=[], index=url)
        with pool_process(f"--config={config}", "--workers=1", cwd=setup.root) as pool:
            result = pool.run("import tinypkg\nprint(tinypkg.VALUE)", packages=["tinypkg==1.0"])
            assert result["stdout"] == "41\n", result
            refused(pool.run("print(1)", packages=["onlysrc"]), "only a source distribution")
    assert not setup.house.sdist_marker.exists()


def test_the_model_is_told_what_it_can_import_and_what_does_not_run(pool: PoolProcess) -> None:
    importable = pool.ready["importable"]
    # numpy and pandas (in the test environment) lead the list, before the dependencies it also holds.
    assert importable[:2] == ["numpy", "pandas"] and "pynox" not in importable and "pip" not in importable
    for code, words in (("import pip\npip.main(['install', 'scipy'])", ("pip does not run", "packages=[")),
                        ("!pip install scipy", ("shell commands (!...)", "packages=[")),
                        ("%timeit sum(range(10))", ("magics (%...) do not run", "time.perf_counter"))):
        result = pool.run(code)
        assert result["exit"] == 1 and result["error"]["hint"] is not None, result
        for word in words:
            assert word in result["error"]["hint"], result["error"]["hint"]


def _slow(setup: Setup, name: str, delay: float, extra: str = "") -> Path:
    """A config whose uv takes ``delay`` seconds before each step (a slow index), installing into a
    directory of its own (so no set is in place already)."""
    slow_uv = uv_logger(setup.root / f"bin-{name}", setup.root / f"{name}.log", delay=delay)
    return pool_config(setup.root / f"{name}.toml", packages_dir=setup.root / f"packages-{name}",
                       find_links=[str(setup.house.dir)], allowed=["tinypkg", "tinydep"],
                       extra_pool=f"uv = {str(slow_uv)!r}\n{extra}",
                       extra_limits=f"allow_write = [{str(setup.work)!r}]")


def test_an_install_blocks_neither_intake_nor_the_workers_and_its_wait_is_queue_time(setup: Setup) -> None:
    with pool_process(f"--config={_slow(setup, 'slow', 1.5)}", "--workers=1", cwd=setup.root) as pool:
        waiting = pool.submit(code="import tinypkg\nprint(tinypkg.VALUE)", packages=["tinypkg"])
        # While the set installs (two uv steps of 1.5 s each), plain jobs are read and run on the one worker.
        for _ in range(3):
            assert pool.run("print(1)", wait=2.5)["stdout"] == "1\n"
        assert pool.run(stats=True)["jobs"] == 3
        result = pool.result(waiting, timeout=30)
        assert result["stdout"] == "42\n", result
        assert result["queue_us"] >= 3_000_000 and result["duration_us"] < 3_000_000, result


def test_a_job_cancelled_while_its_set_installs_is_answered_once_and_never_runs(setup: Setup) -> None:
    with pool_process(f"--config={_slow(setup, 'cancel', 1.5)}", "--workers=1", cwd=setup.root) as pool:
        marker = setup.work / "cancelled-job-ran"
        waiting = pool.submit(code=f"open({str(marker)!r}, 'w')", packages=["tinydep"],
                              allow_write=[str(setup.work)])
        assert pool.run(cancel=waiting)["cancelled"] == waiting
        result = pool.result(waiting, timeout=5)
        assert result["error"]["type"] == "CancelledError", result
        later = pool.run("import tinydep\nprint(tinydep.BASE)", packages=["tinydep"], wait=30)
        assert later["stdout"] == "40\n", later  # the install went on, for whoever asks next
        assert not marker.exists()
        assert [m for m in pool.messages if m.get("id") == waiting and "exit" in m] == [result]


def test_an_install_past_its_own_budget_is_refused_and_the_job_timeout_is_not_what_bounds_it(setup: Setup) -> None:
    config = _slow(setup, "budget", 3, 'install_timeout = "1s"')
    with pool_process(f"--config={config}", "--workers=1", cwd=setup.root) as pool:
        result = pool.run("import tinypkg", packages=["tinypkg"], timeout="60s", wait=30)
        refused(result, "took longer than this pool's install_timeout of 1s", "nothing ran")
        assert pool.run("print(2)")["stdout"] == "2\n"  # the pool goes on


def test_the_input_ending_while_a_set_installs_still_answers_its_job(setup: Setup) -> None:
    with pool_process(f"--config={_slow(setup, 'eof', 1)}", "--workers=1", cwd=setup.root) as pool:
        waiting = pool.submit(code="import tinypkg\nprint(tinypkg.VALUE)", packages=["tinypkg"])
        assert pool.finish() == 0  # EOF: the pool drains, which waits for the install and runs the job
        [result] = [m for m in pool.messages if m.get("id") == waiting]
        assert result["stdout"] == "42\n", result


def test_a_session_opened_with_pip_install_installs_on_a_pip_line(pool: PoolProcess, setup: Setup) -> None:
    session = "pip-session"
    first = pool.run("try:\n    import tinypkg\nexcept ImportError:\n    print('not yet')\n%pip install tinypkg\n"
                     "import tinypkg\nprint(tinypkg.VALUE)", session=session, pip_install=True, wait=60)
    assert first["exit"] == 0, first
    assert first["stdout"] == "not yet\nInstalled for this session: tinydep 0.1, tinypkg 2.0\n42\n", first
    assert pool.run("print(tinypkg.VALUE + 1)", session=session)["stdout"] == "43\n"
    # The same ceiling as the packages grant, and the same form: no options, no URLs.
    outside = pool.run("%pip install scipy", session=session)
    assert outside["error"]["type"] == "HostError" and "[pool.limits] ceiling" in outside["error"]["message"]
    option = pool.run("%pip install tinydep --index-url http://127.0.0.1:1/", session=session)
    assert "no extras, markers, URLs, paths or options" in option["error"]["message"], option
    assert option["error"]["traceback"][0]["source"].startswith("%pip install tinydep")  # the model's own line
    # What was installed is the session's to read, never to write (checked from outside too).
    [directory] = list((setup.packages_dir / "sessions").iterdir())
    before = _tree(directory)
    attempt = pool.run("import os, tinypkg\ntry:\n    open(tinypkg.__file__, 'a').write('VALUE = 0')\n"
                       "except OSError as exc:\n    print(type(exc).__name__)", session=session)
    assert attempt["stdout"] == "PermissionError\n", attempt
    assert _tree(directory) == before
    pool.run(session=session, close=True)


def test_a_pip_line_without_the_opt_in_is_a_syntax_error_whose_hint_says_how(pool: PoolProcess) -> None:
    result = pool.run("%pip install tinypkg", session="no-pip", open=True)
    assert result["error"]["type"] == "SyntaxError", result
    assert "pip_install" in result["error"]["hint"] and 'packages=["PACKAGE"]' in result["error"]["hint"]
    pool.run(session="no-pip", close=True)
    refused(pool.run("print(1)", pip_install=True), "pip_install: only a session takes it")


def test_a_sessions_pip_installs_run_one_at_a_time_across_its_steps(setup: Setup) -> None:
    """A step starts `%pip install` on a thread and ends at once; the install goes on after it, as it should. The
    next step's `%pip install` is refused while that one runs: one install at a time per session, not per step.
    Before, every step started one more (each a thread of the pool's and, past max_installs, a wait for a slot
    every other session's and job's install queued behind), so one session could hold the pool's installs."""
    with pool_process(f"--config={_slow(setup, 'steps', 2)}", "--workers=1", cwd=setup.root) as pool:
        session = "pip-steps"
        started = pool.run("import threading, pynox_host\n"
                           "threading.Thread(target=pynox_host._pynox_pip, args=('install tinypkg',), daemon=True)"
                           ".start()\nimport time\ntime.sleep(0.5)\nprint('left running')",
                           session=session, pip_install=True, wait=30)
        assert started["stdout"] == "left running\n", started
        second = pool.run("import pynox_host\ntry:\n    print(pynox_host._pynox_pip('install tinydep'))\n"
                          "except pynox_host.HostError as exc:\n    print('refused:', exc)",
                          session=session, wait=60)
        assert second["stdout"].startswith("refused: %pip install: another install of this session"), second
        # Once it is over, the session installs again.
        deadline = time.monotonic() + 60
        while True:
            third = pool.run("%pip install tinydep\nimport tinydep\nprint(tinydep.BASE)", session=session, wait=60)
            if third["exit"] == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert third["stdout"].endswith("40\n"), third
        pool.run(session=session, close=True)
