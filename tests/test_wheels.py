"""The install a new user makes: wheels built by ``make wheel``, installed in a fresh environment outside the
checkout with ``pip install --find-links dist <adapters>`` (our packages from the files, their
dependencies from the package index), then ``pynox check``, one confined job and every adapter imported.

Marked ``wheels`` (a few minutes of installing): ``.ci/run`` runs it after the README's test command.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = [pytest.mark.wheels, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[1]
ADAPTERS = ["pynox-pydantic-ai", "pynox-strands", "pynox-smolagents", "pynox-monty", "pynox-mcp", "pynox-langchain",
            "pynox-jupyter"]
# Their frameworks cannot share an environment with the others' (requirements-separate.txt says why): a user
# installs them in one of their own, as here.
SEPARATE = ["pynox-openai-agents", "pynox-autogen", "pynox-adk"]


def _run(*command: str | os.PathLike[str], cwd: Path, timeout: float = 600) -> str:
    done = subprocess.run([os.fspath(part) for part in command], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, check=False, env={"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(cwd)})
    assert done.returncode == 0, f"{command} failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def test_wheels_install_and_run_outside_the_checkout(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    _run("make", "-C", ROOT, "wheel", f"DIST={dist}", f"PYTHON={sys.executable}", cwd=tmp_path)
    wheels = sorted(path.name.split("-")[0] for path in dist.glob("*.whl"))
    assert wheels == ["pynox_adk", "pynox_autogen", "pynox_core", "pynox_jupyter", "pynox_langchain", "pynox_mcp",
                      "pynox_monty", "pynox_openai_agents", "pynox_pydantic_ai", "pynox_ray", "pynox_smolagents",
                      "pynox_strands"], wheels
    for wheel in dist.glob("*.whl"):  # each package's types reach its users (PEP 561)
        with zipfile.ZipFile(wheel) as archive:
            assert any(name.endswith("/py.typed") for name in archive.namelist()), wheel.name
    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", venv, cwd=tmp_path)
    python = venv / "bin" / "python"
    _run(python, "-m", "pip", "install", "--quiet", "--find-links", dist, *(f"{name}==0.1.0" for name in ADAPTERS),
         cwd=tmp_path)
    # Our packages came from the wheels, not from the checkout or an editable path.
    where = json.loads(_run(python, "-c", "import json, pynox, pynox_pydantic_ai, pynox_strands, pynox_smolagents, "
                                          "pynox_monty, pynox_mcp, pynox_langchain\nprint(json.dumps([pynox.__file__, "
                                          "pynox_monty.__file__, pynox_mcp.__file__, pynox_langchain.__file__]))",
                            cwd=tmp_path))
    assert all(path.startswith(str(venv)) for path in where), where
    report = json.loads(_run(venv / "bin" / "pynox", "check", "--json", cwd=tmp_path))
    assert report["ok"] is True, report
    # The core's wheel carries the child's confinement in one native call, and its jobs take it.
    assert report["facts"]["confinement"] == "native", report["facts"]
    # Both extensions as built, with no C source beside them to hash in every process the pool starts.
    assert report["facts"]["native"] == {"_confine": "loaded", "_fork_loop": "loaded"}, report["facts"]
    core = Path(where[0]).parent
    assert not [*core.rglob("*.c")], "a wheel carries no C source"
    job = json.loads(_run(venv / "bin" / "pynox", "run", "--json", "-c", "print(6 * 7)", cwd=tmp_path))
    assert job["stdout"] == "42\n" and job["policy"]["backend"] == "landlock+seccomp", job
    # The MCP server's console script is installed, and its help names the grants.
    assert "--allow-read" in _run(venv / "bin" / "pynox-mcp", "--help", cwd=tmp_path)
    # The wheel's kernelspec makes a "pynox" kernel visible to Jupyter in that environment, as ipykernel's does.
    specs = json.loads(_run(venv / "bin" / "jupyter", "kernelspec", "list", "--json", cwd=tmp_path))["kernelspecs"]
    assert specs["pynox"]["resource_dir"].startswith(str(venv)), specs

    # The adapters of requirements-separate.txt, in an environment of their own.
    separate = tmp_path / "separate"
    _run(sys.executable, "-m", "venv", separate, cwd=tmp_path)
    _run(separate / "bin" / "python", "-m", "pip", "install", "--quiet", "--find-links", dist,
         *(f"{name}==0.1.0" for name in SEPARATE), cwd=tmp_path)
    imports = ("import json, pynox, pynox_openai_agents, pynox_autogen, pynox_adk\nprint(json.dumps([pynox.__file__, "
               "pynox_openai_agents.__file__, pynox_autogen.__file__, pynox_adk.__file__]))")
    where = json.loads(_run(separate / "bin" / "python", "-c", imports, cwd=tmp_path))
    assert all(path.startswith(str(separate)) for path in where), where
