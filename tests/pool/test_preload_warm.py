"""The template's warm-up of preloaded modules (job/preload_warm.py) leaves a job nothing it could see.

With pandas preloaded, the template builds a few DataFrames before any job exists, so that each child finds
pandas' and numpy's lazily built state ready instead of writing it (copy-on-write faults). A job must still
find the operator's modules as a plain import leaves them: no object of the warm-up alive, no module imported
beyond what ``import pandas`` imports, no output. Each check has its control: a job that keeps a DataFrame,
or uses a path that imports a module, is seen by the same probe.
"""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

from tests.harness import procfs

from .pool_driver import pool_process

pytestmark = pytest.mark.timeout(120)

PROBE = """
import gc, json, sys, pandas
gc.unfreeze()  # the template's heap, frozen before the fork: list its objects too
print(json.dumps({
    "frames": sum(isinstance(o, pandas.core.generic.NDFrame) for o in gc.get_objects()),
    "modules": sorted(m for m in sys.modules if m.split(".")[0] in ("pandas", "numpy")),
}))
"""


def _plain_import() -> dict[str, Any]:
    """The same probe in a plain interpreter that only imported pandas: what a job must see."""
    done = subprocess.run([sys.executable, "-I", "-c", PROBE], capture_output=True, text=True, timeout=60,
                          check=True)
    return dict(json.loads(done.stdout))


def test_a_job_sees_pandas_as_a_plain_import_leaves_it(tmp_path: Path) -> None:
    pytest.importorskip("pandas")
    plain = _plain_import()
    assert plain["frames"] == 0, plain
    with pool_process("--workers=1", "--preload=pandas", cwd=tmp_path) as pool:
        for _ in range(2):  # the first job and a child prepared ahead
            result = pool.run(PROBE)
            assert result["exit"] == 0, result
            seen = json.loads(result["stdout"])
            assert seen == plain, (seen, plain)
            assert result["stderr"] == ""
        # Controls: the probe sees a DataFrame a job keeps, and a module a path imports lazily.
        kept = pool.run("import pandas as pd\ndf = pd.DataFrame({'a': [1, 2]})\nrepr(df)\n" + PROBE)
        assert kept["exit"] == 0, kept
        seen = json.loads(kept["stdout"])
        assert seen["frames"] >= 1, seen
        assert set(seen["modules"]) > set(plain["modules"]), seen  # repr imports pandas' string formatting
    assert b"Warning" not in pool.stderr, pool.stderr


def test_a_preload_without_a_warm_up_still_works(tmp_path: Path) -> None:
    with pool_process("--workers=1", "--preload=json", cwd=tmp_path) as pool:
        result = pool.run("import sys\nprint('json' in sys.modules, 'pandas' in sys.modules)")
        assert result["stdout"] == "True False\n", result


def test_a_warm_up_that_fails_or_warns_is_ignored_and_leaves_the_filters(monkeypatch: pytest.MonkeyPatch) -> None:
    from pynox.job import preload_warm

    calls: list[str] = []

    def fails() -> None:
        calls.append("fails")
        raise ValueError("broken in this environment")

    def warns() -> None:
        calls.append("warns")
        warnings.warn("from a warm-up", DeprecationWarning, stacklevel=1)

    filters = list(warnings.filters)
    monkeypatch.setattr(preload_warm, "_WARM_UPS", {"json": fails, "sys": warns, "no_such_module_pynox": fails})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert preload_warm.warm_preloaded(runs=3) == ["sys"]
    assert caught == []
    assert calls == ["fails", "warns", "warns", "warns"]  # a failed one is not run again; a missing one never
    assert warnings.filters == filters


# Extension modules that only ctypes.util's imports bring (shutil: zlib, bz2, lzma; subprocess): pyseccomp is
# imported without it (policy/seccomp.py), so that no template holds them and no fork copies their mappings.
_CTYPES_UTIL_ONLY = {"zlib", "_bz2", "_lzma", "_posixsubprocess"}


def _extension_modules(pid: int) -> set[str]:
    return {line.split()[-1].rsplit("/", 1)[-1].split(".")[0] for line in procfs.read(pid, "maps").splitlines()
            if "/lib-dynload/" in line}


def test_a_template_maps_no_module_only_ctypes_util_would_bring(tmp_path: Path) -> None:
    with pool_process("--workers=1", cwd=tmp_path) as pool:
        assert pool.run("print(1)")["exit"] == 0
        [template] = pool.templates()
        mapped = _extension_modules(template)
        assert "_socket" in mapped, mapped  # the reading sees what the template does load
        assert not mapped & _CTYPES_UTIL_ONLY, mapped
        # A job that imports them itself gets them, and ctypes.util as it is.
        result = pool.run("import zlib, lzma, bz2, subprocess, ctypes.util\n"
                          "print(zlib.crc32(b'x'), callable(ctypes.util.find_library))")
        assert result["stdout"] == "2363233923 True\n", result
    # Control: preloaded, they are mapped, and the same reading finds them.
    with pool_process("--workers=1", "--preload=shutil,subprocess", cwd=tmp_path) as pool:
        assert pool.run("print(1)")["exit"] == 0
        [template] = pool.templates()
        assert _extension_modules(template) >= _CTYPES_UTIL_ONLY


def test_a_template_imports_no_logging(tmp_path: Path) -> None:
    """logging, once imported, runs fork hooks around each of the template's forks (its lock taken and released
    in the template, set up again in the child): no template imports it for the jobs (policy/runtime.py logs
    through a lazy import)."""
    probe = "import sys\nprint('logging' in sys.modules)"
    with pool_process("--workers=1", cwd=tmp_path) as pool:
        for _ in range(2):  # the first job and a child prepared ahead
            assert pool.run(probe)["stdout"] == "False\n"
        assert pool.run("import logging, sys\nlogging.getLogger('job').warning('seen')\n" + probe)["stdout"] == "True\n"
    # Control: preloaded, the same probe sees it.
    with pool_process("--workers=1", "--preload=logging", cwd=tmp_path) as pool:
        assert pool.run(probe)["stdout"] == "True\n"
