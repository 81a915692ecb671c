"""The language-neutral client example, ``examples/jsonl_client.sh``, run as a user would run it."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from .pool_driver import assert_no_leftovers, own_commands_env

pytestmark = pytest.mark.timeout(90)

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "jsonl_client.sh"


def test_the_shell_client_example(tmp_path: Path) -> None:
    done = subprocess.run(["sh", str(EXAMPLE)], capture_output=True, timeout=60, cwd=tmp_path,
                          env=own_commands_env())
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.decode().splitlines()]
    assert lines[0]["event"] == "ready"
    results = {line["id"]: line for line in lines[1:]}
    assert sorted(results) == ["denied", "hello", "sum"] and len(lines) == 4
    assert results["hello"]["stdout"] == "hello from the sandbox\n"
    assert results["sum"]["stdout"] == "6\n"
    assert results["denied"]["error"]["type"] == "PermissionError"
    assert results["denied"]["exit"] == 1
    assert_no_leftovers()


def test_the_example_is_a_posix_shell_script() -> None:
    text = EXAMPLE.read_text()
    assert text.startswith("#!/bin/sh\n")
    assert EXAMPLE.stat().st_mode & 0o111, "the example should be executable"
    if Path("/bin/dash").exists():  # a strict POSIX shell parses it
        assert subprocess.run(["/bin/dash", "-n", str(EXAMPLE)], timeout=10).returncode == 0
