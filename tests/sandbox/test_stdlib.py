"""The standard library inside a job behaves as it does in a plain interpreter, where the contract does
not deny: temporary files follow TMPDIR, Python reads the job's environment, nothing Pynox loads
patches the standard library, a job may set its own limits by its own pid.

Each runs confined and, as the control, in a plain interpreter, and must print the same.
"""

from __future__ import annotations

import pytest

from pynox.protocol import Request

from .harness import Sandbox, World, run_unconfined

_TEMPORARY = """
import os, tempfile
made = [tempfile.mkdtemp(), tempfile.mkstemp()[1], tempfile.NamedTemporaryFile(delete=False).name]
with tempfile.TemporaryDirectory() as directory:
    made.append(directory)
    with tempfile.TemporaryFile() as anonymous:
        anonymous.write(b"x")
print(all(os.path.dirname(path) == tempfile.gettempdir() for path in made), tempfile.gettempdir())
"""


def test_temporary_files_go_where_tmpdir_points(sandbox: Sandbox, world: World) -> None:
    run = sandbox.run(Request(code=_TEMPORARY, allow_write=[str(world.work)]), cwd=str(world.root))
    assert run.result.stdout == f"True {world.work}\n", run.result.stderr
    assert len([p for p in world.work.iterdir() if p.name.startswith("tmp")]) == 3  # seen from the host
    plain = run_unconfined(_TEMPORARY, cwd=str(world.root), env={"TMPDIR": str(world.work)})
    assert plain.result.stdout == f"True {world.work}\n", plain.result.stderr


_ENVIRONMENT = "import sys\nbreakpoint()\nprint('after', sys.flags.ignore_environment, sys.flags.isolated)"


def test_python_reads_the_environment_the_job_was_given(sandbox: Sandbox, world: World) -> None:
    run = sandbox.run(Request(code=_ENVIRONMENT, env={"PYTHONBREAKPOINT": "0"}), cwd=str(world.root))
    assert run.result.stdout == "after 0 0\n", run.result.stderr
    plain = run_unconfined(_ENVIRONMENT, cwd=str(world.root), env={"PYTHONBREAKPOINT": "0"})
    assert plain.result.stdout == "after 0 0\n"


@pytest.mark.parametrize("code", [
    "import typing; print(typing._collect_parameters.__module__)",
    "import sys; print('typing_extensions' in sys.modules)",
])
def test_nothing_pynox_loads_patches_the_standard_library(code: str, sandbox: Sandbox, world: World) -> None:
    run = sandbox.run(Request(code=code), cwd=str(world.root))
    assert run.result.exit == 0, run.result.stderr
    assert run.result.stdout == run_unconfined(code, cwd=str(world.root)).result.stdout


def test_a_job_sets_its_own_limits_by_its_own_pid(sandbox: Sandbox, world: World) -> None:
    code = ("import os, resource\nresource.prlimit(os.getpid(), resource.RLIMIT_NOFILE, (100, 100))\n"
            "print(resource.getrlimit(resource.RLIMIT_NOFILE))")
    run = sandbox.run(Request(code=code), cwd=str(world.root))
    assert run.result.stdout == "(100, 100)\n", run.result.stderr
    assert run_unconfined(code, cwd=str(world.root)).result.stdout == "(100, 100)\n"


# Every attribute of sys.flags a plain interpreter has, by name, and as many in the tuple (3.13 adds gil,
# which does not unpack). Values may differ only where the job truly differs: it has no user site.
_FLAGS = """
import sys
names = [n for n in dir(sys.flags) if not n.startswith("_") and n not in dir(tuple)
         and n not in ("n_fields", "n_sequence_fields", "n_unnamed_fields")]
print(sorted((n, getattr(sys.flags, n)) for n in names if n != "no_user_site"), len(sys.flags))
"""


def test_sys_flags_are_a_plain_interpreters(sandbox: Sandbox, world: World) -> None:
    run = sandbox.run(Request(code=_FLAGS), cwd=str(world.root))
    assert run.result.exit == 0, run.result.stderr
    plain = run_unconfined(_FLAGS, cwd=str(world.root))
    assert run.result.stdout == plain.result.stdout, plain.result.stderr
