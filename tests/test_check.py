"""``pynox check``: kernel facts and a self-test that must prove every enforced rule on this machine."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pynox import check
from pynox.check import CheckReport, Probe, run_check
from pynox.cli import main
from pynox.errors import KernelSupportError
from tests.harness import procfs
from tests.setup_facts import KERNEL_ABI, LANDLOCK_ABI

PROBES = [spec.name for spec in check._PROBES]
EXPECTED = {"granted_read", "granted_write", "read_outside", "write_outside", "file_metadata", "granted_metadata",
            "subprocess", "fork", "socket", "tcp_connect", "signal_parent", "signal_owner", "truncate_read_only",
            "kernel_surface", "capabilities",
            "environment", "memory_limit", "other_process", "own_proc", "sysinfo", "datagram_pair", "timeout",
            "listed_host", "unlisted_port"}


def test_every_promised_rule_has_a_probe() -> None:
    assert set(PROBES) == EXPECTED


def test_run_check_passes_here() -> None:
    report = run_check()
    assert report.ok, report.render()
    assert [probe.name for probe in report.probes] == PROBES
    assert all(probe.status == "pass" for probe in report.probes), report.render()
    # Every probe passes in every setup CI runs (root or not, a container's profile, any Landlock ABI).
    assert report.facts["landlock_abi"] == LANDLOCK_ABI and report.facts["landlock_abi_kernel"] == KERNEL_ABI
    assert report.facts["seccomp"] is True
    assert report.facts["seccomp_unresolved"] == []
    assert report.facts["native"] == _native_expected(), report.facts["native"]
    if os.geteuid() == 0:  # root may make the pids cgroup this machine has; an ordinary user may not
        assert report.facts["threads_bounded"] is True, report.facts["threads"]
    # Root may make the memory cgroup this machine has; an ordinary user may not, and the check warns.
    assert report.facts["memory_counted"] is (os.geteuid() == 0), report.facts["memory"]
    assert ("no cgroup counts a job's memory" in report.render()) is not report.facts["memory_counted"]
    # About 0.8 s here; the margin is for a loaded CI machine, not for a slower check.
    assert report.seconds < 3.0, f"check took {report.seconds:.2f}s"
    data = report.as_dict()
    assert json.loads(json.dumps(data))["ok"] is True
    assert {probe["name"] for probe in data["probes"]} == EXPECTED
    text = report.render()
    assert "Verdict: OK" in text and "Landlock       ABI" in text and "libseccomp" in text
    for name in EXPECTED:
        assert f"PASS  {name}" in text


def test_pynox_check_command() -> None:
    done = subprocess.run([sys.executable, "-m", "pynox", "check"], capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    for name in EXPECTED:
        assert name in done.stdout
    assert done.stdout.strip().splitlines()[-1].startswith("Verdict: OK")


def test_pynox_check_json() -> None:
    done = subprocess.run([sys.executable, "-m", "pynox", "check", "--json"], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["ok"] is True and data["error"] is None
    assert {probe["name"]: probe["status"] for probe in data["probes"]} == dict.fromkeys(EXPECTED, "pass")
    assert {level["abi"] for level in data["facts"]["landlock_coverage"]} == set(range(1, 8))


def test_a_rule_that_does_not_hold_fails_the_check(monkeypatch: pytest.MonkeyPatch) -> None:
    # A probe that expects a granted read to be refused must fail: the judges are not rubber stamps.
    wrong = check._ProbeSpec("granted_read_refused", "a granted read is refused (deliberately false)",
                             check._PROBES[0].request, check._refused("PermissionError"))
    monkeypatch.setattr(check, "_PROBES", (check._PROBES[0], wrong))
    report = run_check()
    assert not report.ok
    assert [p.status for p in report.probes] == ["pass", "fail"]
    assert "expected PermissionError" in report.probes[1].detail
    assert report.verdict.startswith("FAIL") and "granted_read_refused" in report.verdict


def test_a_kernel_that_cannot_confine_fails_closed(monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    def no_landlock(*args: object, **kwargs: object) -> None:
        raise KernelSupportError("this kernel has no Landlock (or it is disabled)")

    monkeypatch.setattr(check, "Template", no_landlock)
    report = run_check()
    assert not report.ok and report.probes == []
    assert "cannot confine code" in report.verdict and "no Landlock" in report.verdict
    assert main(["check"]) == 1
    assert "Verdict: FAIL" in capsys.readouterr().out


def test_skipped_probes_do_not_fail_but_are_reported() -> None:
    report = CheckReport(facts={}, probes=[Probe("a", "rule a", "pass"), Probe("b", "rule b", "skip", "old")])
    assert report.ok
    assert "1 not applicable" in report.verdict
    assert not CheckReport(facts={}).ok  # no probe ran: nothing was proven


@pytest.mark.skipif(KERNEL_ABI < 6, reason="needs a kernel with Landlock ABI 6 to cap below it")
def test_a_capped_abi_is_named_with_what_it_weakens() -> None:
    env = {**os.environ, "PYNOX_LANDLOCK_ABI": "2"}
    done = subprocess.run([sys.executable, "-m", "pynox", "check"], capture_output=True, text=True, timeout=60,
                          check=False, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"ABI 2 (capped by $PYNOX_LANDLOCK_ABI; the kernel has ABI {KERNEL_ABI})" in done.stdout
    for weaker in ("does not govern truncation", "no TCP rules", "ioctl on devices", "no scoping"):
        assert weaker in done.stdout, done.stdout
    assert "no refer right" not in done.stdout  # ABI 2 has it
    # Held at every ABI, by seccomp where Landlock cannot: these pass under the cap too.
    for probe in ("signal_parent", "signal_owner", "truncate_read_only"):
        assert f"PASS  {probe}" in done.stdout, done.stdout


@pytest.mark.parametrize("value", ["0", "seven", "-1"])
def test_a_bad_abi_cap_is_one_clear_line(value: str) -> None:
    env = {**os.environ, "PYNOX_LANDLOCK_ABI": value}
    done = subprocess.run([sys.executable, "-m", "pynox", "check"], capture_output=True, text=True, timeout=60,
                          check=False, env=env)
    assert done.returncode == 1
    assert done.stderr.startswith("pynox check: ConfigError: $PYNOX_LANDLOCK_ABI must be"), done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1


# --- pynox check --config: a config validated without serving -------------------------------------


def _config(tmp_path: os.PathLike[str], text: str) -> str:
    path = os.path.join(tmp_path, "pynox.toml")
    with open(path, "w") as handle:
        handle.write(text)
    return path


@pytest.mark.parametrize(("text", "words"), [
    ('[pool.limits]\nmemory = "10m"\n', ["[pool.limits] memory", "SandboxSetupError"]),
    ('[pool.limits]\nmemory = "512"\n', ["[pool.limits] memory", "512 bytes"]),
    ("[pool]\nworkers = 1000\n", ["[pool] workers", "256"]),
    ("[pool]\nworker = 2\n", ["[pool]", "unknown key 'worker'"]),
    ('[pool]\npreload = ["no_such_module_anywhere"]\n', ["[pool]", "no_such_module_anywhere"]),
])
def test_check_config_refuses_a_config_naming_the_file_and_key(tmp_path: os.PathLike[str], text: str,
                                                               words: list[str],
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    path = _config(tmp_path, text)
    assert main(["check", "--config", path]) == 1
    error = capsys.readouterr().err
    assert error.startswith(f"pynox check: ConfigError: {path}: "), error
    assert "--workers" not in error
    for word in words:
        assert word in error, error


def test_check_config_refuses_a_memory_floor_raised_by_preloads_that_a_pool_start_refuses_too(
        tmp_path: os.PathLike[str], capsys: pytest.CaptureFixture[str]) -> None:
    # 48m loads (above the static floor), but a template that preloads numpy holds more than that already.
    text = '[pool]\npreload = ["numpy"]\n[pool.limits]\nmemory = "48m"\n'
    path = _config(tmp_path, text)
    code = main(["check", "--config", path])
    error = capsys.readouterr().err
    assert code == 1 and "[pool.limits] memory" in error and "preloaded" in error, error
    pool = subprocess.run([sys.executable, "-m", "pynox", "pool", "--workers=1", f"--config={path}"],
                          input=b"", capture_output=True, timeout=120)
    first = json.loads(pool.stdout.splitlines()[0])
    assert pool.returncode == 1 and first["event"] == "error", first
    assert first["error"]["type"] == "ConfigError" and "[pool.limits] memory" in first["error"]["message"]


def test_check_config_passes_a_good_config_and_checks_the_named_profile(
        tmp_path: os.PathLike[str], capsys: pytest.CaptureFixture[str]) -> None:
    os.mkdir(os.path.join(tmp_path, "data"))
    path = _config(tmp_path, '[pool.limits]\nmemory = "512m"\ntimeout = "7d"\nallow_read = ["data"]\n'
                             '[profiles.ok]\nallow_read = ["data"]\n[profiles.wide]\nallow_read = ["/etc"]\n')
    assert main(["check", "--config", path]) == 0
    assert f"{path}: valid" in capsys.readouterr().out
    assert main(["check", "--config", path, "--profile", "ok"]) == 0
    capsys.readouterr()
    assert main(["check", "--config", path, "--profile", "wide"]) == 1
    assert "[profiles.wide]" in capsys.readouterr().err
    assert main(["check", "--config", path, "--profile", "nope"]) == 1
    assert "no [profiles.nope]" in capsys.readouterr().err


def test_check_names_each_per_job_bound_not_in_force_here() -> None:
    """The facts say whether a CPU quota and the count of TCP buffers are in force, and every bound that is not
    is a warning, as the pool's ready event says it. Judged from outside: the cpu and memory cgroup mounts this
    process could write in (a root process with cgroup v1 mounts can; an ordinary user, as CI's, cannot)."""
    done = subprocess.run([sys.executable, "-m", "pynox", "check", "--json"], capture_output=True, text=True,
                          timeout=60, check=False)
    facts = json.loads(done.stdout)["facts"]
    human = subprocess.run([sys.executable, "-m", "pynox", "check"], capture_output=True, text=True, timeout=60,
                           check=False).stdout
    assert ("no CPU quota per job here" in human) == (not facts["cpu_bounded"]), human
    assert "cpu            " in human and "tcp buffers    " in human
    if not facts["cpu_bounded"]:
        assert any("no CPU quota per job" in bound for bound in facts["bounds_not_in_force"])
    mounted_v1 = {line.split(" - ")[1].split()[2] for line in procfs.read("self", "mountinfo").splitlines()
                  if " - cgroup " in line}
    if os.geteuid() == 0 and any("cpu" in options.split(",") for options in mounted_v1):
        assert facts["cpu_bounded"], facts["cpu"]
    if os.geteuid() == 0 and any("memory" in options.split(",") for options in mounted_v1):
        assert facts["tcp_counted"], facts["tcp"]


def _native_expected() -> dict[str, str]:
    """What the check must say of the native paths in this run: CI builds both and runs them, but for its
    fallback leg ($PYNOX_NATIVE=0)."""
    if os.environ.get("PYNOX_NATIVE") == "0":
        return dict.fromkeys(("_confine", "_fork_loop"), "disabled by $PYNOX_NATIVE=0")
    return dict.fromkeys(("_confine", "_fork_loop"), "loaded")


def test_check_says_whether_the_native_paths_serve() -> None:
    done = subprocess.run([sys.executable, "-m", "pynox", "check"], capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    for name, state in _native_expected().items():
        assert f"    {name:<11} {state} (" in done.stdout, done.stdout


def _copy_of_pynox(tmp_path: Path, edit: str) -> Path:
    """This checkout's pynox, copied with its built extensions, and ``edit`` made to it: the directory to put on
    PYTHONPATH."""
    import pynox

    installed = Path(pynox.__file__).parent
    if not list(installed.glob("template/_fork_loop.*.so")) or not (installed / "template" / "_fork_loop.c").exists():
        pytest.skip("no extension built beside its source here (a wheel, or no compiler)")
    shutil.copytree(installed, tmp_path / "pynox", ignore=shutil.ignore_patterns("__pycache__"))
    if edit == "a source changed since its build":
        source = tmp_path / "pynox" / "template" / "_fork_loop.c"
        source.write_bytes(source.read_bytes() + b"/* an edit since the build */\n")
    elif edit == "an extension not built":
        for built in (tmp_path / "pynox" / "policy").glob("_confine.*.so"):
            built.unlink()
    return tmp_path


@pytest.mark.parametrize(("edit", "native", "expected"), [
    ("none", "0", {"_confine": "disabled by $PYNOX_NATIVE=0", "_fork_loop": "disabled by $PYNOX_NATIVE=0"}),
    ("a source changed since its build", "", {"_confine": "loaded", "_fork_loop": "refused: _fork_loop"}),
    ("an extension not built", "", {"_confine": "not built: No module named 'pynox.policy._confine'",
                                    "_fork_loop": "loaded, unused: children confine through the Python steps"}),
])
def test_check_names_each_native_path_not_in_use_and_why(tmp_path: Path, edit: str, native: str,
                                                         expected: dict[str, str]) -> None:
    """Each state a native path can be in, as ``pynox check --json`` reports it from a copy of the package (its
    template started from the copy too); the control, the check of this checkout, says both are loaded."""
    root = _copy_of_pynox(tmp_path, edit)
    done = subprocess.run([sys.executable, "-m", "pynox", "check", "--json"], capture_output=True, text=True,
                          timeout=120, check=False, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(root), "PYNOX_NATIVE": native})
    data = json.loads(done.stdout)
    said = data["facts"]["native"]
    assert set(said) == set(expected), said
    for name, start in expected.items():
        assert said[name].startswith(start), said
    refused = [warning for warning in data["warnings"] if "was built from another" in warning]
    assert bool(refused) is (edit == "a source changed since its build"), data["warnings"]
    assert data["ok"] is True, data  # the Python paths serve, under the same rules
