"""The escape suite: every case of ``cases.py`` run denied and run as its control, on the real kernel.

A denied run must fail as its case says *and* leave the world alone: nothing
outside the grants changed (contents, modes, times, links, xattrs), the canary
token and the host secret nowhere in the result, the template still alive.
A control run must succeed, so the denial provably comes from the policy.
A control that only root can run is marked ``needs_root`` (see ``tests/conftest.py``).
"""

from __future__ import annotations

import functools
import os
import platform
import string
import subprocess
import sys
import textwrap
from typing import Any

import msgspec
import pytest

from pynox.errors import RequestError
from pynox.protocol import Request
from pynox.server.jobs import to_job
from pynox.server.templates import Template
from tests.setup_facts import OUTER_SECCOMP, require_landlock

from .cases import _INT80, CASES, WORKS, Case, Expect
from .harness import SECRET, Run, Sandbox, World, run_unconfined


def _fill(value: Any, world: World) -> Any:
    """Substitute ``$name`` in every string of a request, a grant or an expectation."""
    if isinstance(value, str):
        return string.Template(value).substitute({k: str(v) for k, v in world.values().items()})
    if isinstance(value, list):
        return [_fill(item, world) for item in value]
    if isinstance(value, dict):
        return {_fill(k, world): _fill(v, world) for k, v in value.items()}
    return value


def _require(needs: tuple[str, ...], world: World) -> None:
    for need in needs:
        kind, _, arg = need.partition(":")
        if kind == "landlock":
            require_landlock(int(arg))
        if kind == "unfiltered" and OUTER_SECCOMP:
            pytest.skip("an outer seccomp filter (a container's profile) refuses this call to the control too")
        if kind == "home_canary" and world.home_canary is None:
            pytest.skip(f"cannot write a canary into this uid's home, {world.real_home}")
        if kind == "ipv6" and world.tcp6 is None:
            pytest.skip("no IPv6 loopback on this host")
        if kind == "syscall" and int(world.values()[f"nr_{arg}"]) < 0:  # type: ignore[call-overload]
            pytest.skip(f"this architecture has no {arg} system call")
        if kind == "ia32" and not _ia32():
            pytest.skip("no i386 system calls here (not x86-64, no IA32 emulation, or a profile refuses them)")


@functools.cache
def _ia32() -> bool:
    """Whether an x86-64 process's int 0x80 reaches the kernel's i386 calls (an unconfined getpid answers its pid).

    A container's profile may refuse the i386 ABI outright (every call EPERM): the controls cannot work there.
    """
    if platform.machine() != "x86_64":
        return False
    probe = subprocess.run([sys.executable, "-c", textwrap.dedent(_INT80.replace("CALL", "20"))], capture_output=True,
                           text=True, timeout=30, check=False)
    return probe.returncode == 0 and "answered own pid" in probe.stdout


def _request(case: Case, world: World, *, control: bool) -> Request:
    fields = dict(case.request)
    if control and case.grant:
        for key, value in case.grant.items():
            fields[key] = [*fields.get(key, []), *value] if isinstance(value, list) else value
    return Request(code=case.source(world, control=control), **_fill(fields, world))


def _check(expect: Expect, run: Run, world: World, *, confined: bool) -> None:
    result = run.result
    shown = (f"exit={result.exit} error={result.error}\nstdout={result.stdout[-1500:]!r}\n"
             f"stderr={result.stderr[-1500:]!r}")
    if expect.exit is not None:
        assert result.exit == expect.exit, shown
    if confined:
        if expect.error:
            assert result.error is not None and result.error.type in expect.error, shown
        else:
            assert result.error is None, shown
    for hint in expect.hint:
        assert result.error is not None and result.error.hint is not None, shown
        assert _fill(hint, world) in result.error.hint, shown
    for text in expect.stdout:
        assert _fill(text, world) in result.stdout, shown
    for text in expect.stderr:
        assert _fill(text, world) in result.stderr, shown
    if expect.host is not None:
        expect.host(world, run)


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.id)
def test_denied(case: Case, sandbox: Sandbox, world: World) -> None:
    _require(case.needs, world)
    if case.prepare is not None:
        case.prepare(world)
    before = world.snapshot()
    run = sandbox.run(_request(case, world, control=False), cwd=str(world.root))
    _check(case.denied, run, world, confined=True)
    assert world.snapshot() == before, "the job changed something outside its grants"
    everything = msgspec.json.encode(run.result).decode()
    assert world.token not in everything, "canary content reached the result"
    assert SECRET not in everything, "the host's secret reached the result"
    assert sandbox.alive(), "the job killed its template"


def _controls() -> list[Any]:
    return [pytest.param(case, marks=[pytest.mark.needs_root(case.control_needs_root)] if case.control_needs_root
                         else [], id=case.id) for case in CASES]


@pytest.mark.parametrize("case", _controls())
def test_control(case: Case, sandbox: Sandbox, world: World) -> None:
    _require((*case.needs, *case.control_needs), world)
    if case.prepare is not None:
        case.prepare(world)
    if case.grant is None:
        env = _fill(case.request.get("env", {}), world)
        run = run_unconfined(case.source(world, control=True), cwd=str(world.root), env=env)
        _check(case.control, run, world, confined=False)
    else:
        run = sandbox.run(_request(case, world, control=True), cwd=str(world.root))
        _check(case.control, run, world, confined=True)


@pytest.mark.parametrize("works", WORKS, ids=lambda works: works.id)
def test_works_inside(works: Any, sandbox: Sandbox, world: World) -> None:
    code = _fill(works.code, world)
    run = sandbox.run(Request(code=code, **_fill(works.request, world)), cwd=str(world.root))
    assert run.result.exit == 0 and run.result.error is None, run.result.stderr
    assert run.result.stdout.strip() == works.stdout
    # Unconfined the same code prints the same thing: the case tests the sandbox, not the code.
    for leftover in ("renamed.txt",):
        (world.work / leftover).unlink(missing_ok=True)
    plain = run_unconfined(code, cwd=str(world.root))
    assert plain.result.stdout.strip() == works.stdout, plain.result.stderr


def test_template_survives_every_denial(sandbox: Sandbox) -> None:
    # Runs after the cases above in this module: none of them may have cost a template.
    assert sandbox.replaced == 0


def test_write_grant_over_runtime_is_refused(sandbox: Sandbox, world: World) -> None:
    run = sandbox.run(Request(code="pass"), cwd=str(world.root))  # starts the template if needed
    assert run.result.exit == 0
    assert sandbox.template is not None
    runtime = sandbox.template.ready.read_paths
    for path in (sys.prefix, os.path.dirname(os.__file__), "/usr/lib"):
        with pytest.raises(RequestError, match="runtime"):
            to_job(Request(code="pass", allow_write=[path]), cwd=str(world.root), runtime_paths=runtime)


def test_missing_grant_is_refused(world: World) -> None:
    with pytest.raises(RequestError, match="does not exist"):
        to_job(Request(code="pass", allow_read=[str(world.root / "typo")]), cwd=str(world.root), runtime_paths=[])


def test_prngs_are_reseeded_per_job(world: World) -> None:
    # Preloaded generators are in the template's memory: without a reseed every job would draw the same.
    template = Template(["random", "numpy"], [])
    try:
        spec, max_output = to_job(Request(code="import random, numpy\nprint(random.random(), numpy.random.rand())",
                                          memory="512m"),
                                  cwd=str(world.root), runtime_paths=template.ready.read_paths)
        draws = [bytes(template.run(spec, max_output=max_output).stdout).split() for _ in range(3)]
    finally:
        template.close()
    # Each generator on its own: one reseeded would make every line differ while the other repeats.
    assert len({python for python, _ in draws}) == 3, draws
    assert len({numpy for _, numpy in draws}) == 3, draws
