"""``pynox run``: the command line around one confined job."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

RUN = [sys.executable, "-m", "pynox", "run"]


def pynox_run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*RUN, *args], capture_output=True, text=True, timeout=60, check=False, cwd=cwd)


def test_etc_passwd_is_denied_with_a_hint_naming_the_flag() -> None:
    done = pynox_run("-c", "print(open('/etc/passwd').read())")
    assert done.returncode == 1
    assert "root:" not in done.stdout
    assert "PermissionError" in done.stderr
    assert "hint:" in done.stderr and "--allow-read /etc/passwd" in done.stderr


def test_allow_read_grants_it() -> None:
    done = pynox_run("--allow-read", "/etc/passwd", "-c", "print(open('/etc/passwd').read())")
    assert done.returncode == 0, done.stderr
    assert "root:" in done.stdout


def test_json_prints_the_result_object() -> None:
    done = pynox_run("--json", "-c", "print('hi'); raise SystemExit(3)")
    assert done.returncode == 3
    result = json.loads(done.stdout)
    assert result["exit"] == 3 and result["stdout"] == "hi\n" and result["error"] is None
    assert result["policy"]["backend"] == "landlock+seccomp" and result["policy"]["network"] == "deny"
    for key in ("id", "stderr", "stdout_truncated", "stderr_truncated", "duration_ms", "runtime"):
        assert key in result


def test_json_error_carries_type_line_and_hint() -> None:
    done = pynox_run("--json", "-c", "x = 1\nopen('/etc/shadow')")
    result = json.loads(done.stdout)
    assert result["exit"] == 1
    error = result["error"]
    assert error["type"] == "PermissionError" and error["line"] == 2 and error["file"] == "agent.py"
    assert error["path"] == "/etc/shadow" and "--allow-read /etc/shadow" in error["hint"]


def test_script_file_with_arguments(tmp_path: Path) -> None:
    script = tmp_path / "show_args.py"
    script.write_text("import sys\nprint(sys.argv[1:], __name__)\n")
    done = pynox_run(str(script), "one", "--two", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "['one', '--two'] __main__\n"


def test_script_directory_is_not_granted(tmp_path: Path) -> None:
    script = tmp_path / "peek.py"
    (tmp_path / "neighbour.txt").write_text("private")
    script.write_text("print(open(__file__.replace('peek.py', 'neighbour.txt')).read())\n")
    done = pynox_run(str(script))
    assert done.returncode == 1 and "private" not in done.stdout
    assert "PermissionError" in done.stderr


def test_env_sets_a_variable_for_the_job() -> None:
    done = pynox_run("--env", "GREETING=hello world", "--env", "EMPTY=", "-c",
                     "import os; print(repr(os.environ['GREETING']), repr(os.environ['EMPTY']))")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "'hello world' ''\n"


def test_timeout_exits_124() -> None:
    done = pynox_run("--timeout", "300ms", "-c", "while True: pass")
    assert done.returncode == 124
    assert "TimeoutError" in done.stderr and "--timeout" in done.stderr


@pytest.mark.parametrize(("flag", "value"), [
    ("--timeout", "5x"), ("--memory", "lots"), ("--max-output", "-1"), ("--max-file-size", "1q"),
])
def test_bad_units_are_a_clear_error(flag: str, value: str) -> None:
    done = pynox_run(flag, value, "-c", "print('must not run')")
    assert done.returncode == 2
    assert "must not run" not in done.stdout
    assert "Traceback" not in done.stderr
    assert value in done.stderr and flag.lstrip("-").replace("-", "_") in done.stderr


def test_bad_env_is_a_clear_error() -> None:
    done = pynox_run("--env", "NOEQUALS", "-c", "pass")
    assert done.returncode == 2 and "Traceback" not in done.stderr and "KEY=VALUE" in done.stderr


def test_missing_grant_is_a_clear_error(tmp_path: Path) -> None:
    done = pynox_run("--allow-read", str(tmp_path / "typo"), "-c", "pass")
    assert done.returncode == 2 and "Traceback" not in done.stderr and "does not exist" in done.stderr


def test_nothing_to_run_is_a_clear_error() -> None:
    done = pynox_run()
    assert done.returncode == 2 and "Traceback" not in done.stderr


def test_config_permissions_are_the_grants_and_flags_add_on_top(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "x.txt").write_text("from the config")
    (tmp_path / "extra.txt").write_text("from a flag")
    config = tmp_path / "pynox.toml"
    config.write_text('[permissions]\nallow_read = ["data"]\ntimeout = "5s"\n')  # relative to the file
    code = f"print(open({str(tmp_path / 'data' / 'x.txt')!r}).read(), open({str(tmp_path / 'extra.txt')!r}).read())"
    done = pynox_run("--config", str(config), "--allow-read", str(tmp_path / "extra.txt"), "--timeout", "3s",
                     "--json", "-c", code, cwd=tmp_path / "data")
    result = json.loads(done.stdout)
    assert result["stdout"] == "from the config from a flag\n", result
    assert result["policy"]["allow_read"] == [str(tmp_path / "data"), str(tmp_path / "extra.txt")]
    assert result["policy"]["timeout_ms"] == 3000  # the flag wins over the file
    # Control: without the file, the same read is denied.
    assert pynox_run("-c", code).returncode == 1
    config.write_text('[permissions]\nallow_reads = ["data"]\n')
    bad = pynox_run("--config", str(config), "-c", "pass")
    assert bad.returncode == 1 and "allow_reads" in bad.stderr, bad.stderr


def test_allow_host_grants_tcp_to_that_host_and_port_only() -> None:
    import socket

    with socket.create_server(("127.0.0.1", 0)) as listed, socket.create_server(("127.0.0.1", 0)) as other:
        code = ("import socket\nsocket.create_connection(('127.0.0.1', %d), timeout=3).close()\n"
                "socket.create_connection(('127.0.0.1', %d), timeout=3)")
        done = pynox_run("--json", "--allow-host", f"127.0.0.1:{listed.getsockname()[1]}", "-c",
                         code % (listed.getsockname()[1], other.getsockname()[1]))
        result = json.loads(done.stdout)
        assert result["error"]["type"] == "PermissionError", result
        assert f'--allow-host 127.0.0.1:{other.getsockname()[1]}' in result["error"]["hint"]
        assert result["policy"]["network"] == "hosts"
        assert result["policy"]["hosts"] == [f"127.0.0.1:{listed.getsockname()[1]}"]
        other.settimeout(0.3)
        with pytest.raises(TimeoutError):
            other.accept()
        listed.settimeout(0.3)
        listed.accept()[0].close()
    done = pynox_run("--allow-host", "10.1.2.3/16", "-c", "print(1)")
    assert done.returncode == 2 and "allow_hosts" in done.stderr and "Traceback" not in done.stderr, done.stderr
