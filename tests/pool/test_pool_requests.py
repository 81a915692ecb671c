"""Requests: one JSON object per line, code xor script, every field, strict validation, the 1 MiB line cap."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .pool_driver import HOST_SECRET, HOST_SECRET_NAME, PoolProcess, new_id, refused

pytestmark = pytest.mark.timeout(90)

MIB = 1 << 20


# --- code xor script ------------------------------------------------------------------------------------


def test_code_runs_inline(pool: PoolProcess) -> None:
    result = pool.run("import json\nprint(json.dumps({'ok': True}))")
    assert result["exit"] == 0 and result["stdout"] == '{"ok": true}\n'


def test_script_runs_with_its_args(pool: PoolProcess, workdir: Path) -> None:
    (workdir / "app.py").write_text("import sys\nprint(sys.argv[1:])\nprint(__name__)\n")
    result = pool.run(script="app.py", args=["one", "two words"])
    assert result["exit"] == 0, result
    assert result["stdout"] == "['one', 'two words']\n__main__\n"


def test_code_gets_args_and_name_as_argv(pool: PoolProcess) -> None:
    result = pool.run("import sys\nprint(sys.argv)", name="step.py", args=["one"])
    assert result["stdout"] == "['step.py', 'one']\n", result


def test_both_code_and_script_is_refused(pool: PoolProcess, workdir: Path) -> None:
    (workdir / "both.py").write_text("print('never')\n")
    refused(pool.run("print('never')", script="both.py"), "code", "script")


def test_neither_code_nor_script_is_refused(pool: PoolProcess) -> None:
    refused(pool.run(name="x.py"), "code", "script")


def test_missing_script_is_refused(pool: PoolProcess) -> None:
    refused(pool.run(script="no_such_script.py"), "no_such_script.py")


# --- ids ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("request_id", ["task-1", 7, 0, 2**53, -3, 7.5, 1e-3, ""], ids=repr)
def test_id_is_echoed_as_given(pool: PoolProcess, request_id: object) -> None:
    for fields in ({"code": "print(1)"}, {"code": "print(1)", "unknown_field": 1}):
        pool.send({"id": request_id, **fields})
        result = pool.result(request_id)  # matched by type as well as value
        assert type(result["id"]) is type(request_id) and result["id"] == request_id


def test_int_and_float_ids_are_different_ids(pool: PoolProcess) -> None:
    pool.send(b'{"id": 41, "code": "print(\\"int\\")"}\n{"id": 41.0, "code": "print(\\"float\\")"}\n')
    assert pool.result(41)["stdout"] == "int\n"
    assert pool.result(41.0)["stdout"] == "float\n"


def test_a_request_without_id_is_answered_with_a_null_id(pool: PoolProcess) -> None:
    marker = new_id("no-id")
    start = len(pool.messages)
    pool.send({"code": f"print({marker!r})"})
    result = pool.wait_for(lambda m: m.get("stdout") == f"{marker}\n", start=start)
    assert result["id"] is None


# --- strict validation ----------------------------------------------------------------------------------


@pytest.mark.parametrize("fields", [
    {"code": "print(1)", "unknown": True},
    {"code": "print(1)", "Code": "print(2)"},
    {"code": "print(1)", "preload": ["json"]},  # operator configuration, never a request field
    {"code": 5},
    {"code": None, "script": 5},
    {"code": "print(1)", "args": "one"},
    {"code": "print(1)", "args": [1]},
    {"code": "print(1)", "env": {"KEY": 1}},
    {"code": "print(1)", "env": ["KEY=value"]},
    {"code": "print(1)", "allow_read": "data"},
    {"code": "print(1)", "allow_write": [None]},
    {"code": "print(1)", "allow_network": "yes"},
    {"code": "print(1)", "timeout": [5]},
    {"code": "print(1)", "timeout": "5 parsecs"},
    {"code": "print(1)", "timeout": -1},
    {"code": "print(1)", "memory": {"size": 1}},
    {"code": "print(1)", "memory": "lots"},
    {"code": "print(1)", "max_output": True},
    {"code": "print(1)", "max_file_size": "huge"},
    {"code": "print(1)", "package_dirs": "site"},
    {"code": "print(1)", "name": 3},
    {"code": "print(1)", "name": ""},
    {"code": "print(1)", "profile": 1},
    {"code": "print(1)", "functions": "search"},
    {"code": "print(1)", "functions": ["not an identifier"]},
    {"code": "print(1)", "functions": ["import"]},  # no code can import it by name
    {"code": "print(1)", "functions": ["HostError"]},  # pynox_host's own: the code's `except HostError` then broke
    {"code": "print(1)", "stats": "yes"},
], ids=lambda f: ",".join(f"{k}={v!r}" for k, v in f.items()))
def test_unknown_fields_and_wrong_types_are_a_request_error_for_that_id(pool: PoolProcess,
                                                                        fields: dict[str, Any]) -> None:
    request_id = new_id("bad")
    result = pool.result(pool.submit(id=request_id, **fields))
    assert result["id"] == request_id
    refused(result)


def test_an_unknown_field_is_named(pool: PoolProcess) -> None:
    refused(pool.run("print(1)", frobnicate=1), "frobnicate")


@pytest.mark.parametrize("line", [b"not json at all", b"[1, 2, 3]", b'"a string"', b"{\"id\": 1,"],
                         ids=["garbage", "array", "string", "truncated"])
def test_a_line_that_is_not_a_json_object_is_a_request_error(pool: PoolProcess, line: bytes) -> None:
    start = len(pool.messages)
    marker = new_id("after")
    pool.send(line + b"\n")
    pool.send({"id": marker, "code": "print('still serving')"})
    error = pool.wait_for(lambda m: m.get("error") is not None and m["error"]["type"] == "RequestError", start=start)
    assert error["id"] is None
    assert pool.result(marker)["stdout"] == "still serving\n"


def test_blank_lines_are_ignored(pool: PoolProcess) -> None:
    start = len(pool.messages)
    pool.send(b"\n   \n\n")
    result = pool.run("print('after blanks')")
    assert result["stdout"] == "after blanks\n"
    assert [m for m in pool.messages[start:] if m.get("id") is None] == []


# --- the 1 MiB line cap ---------------------------------------------------------------------------------


def _line_of(size: int, request_id: str) -> bytes:
    """A valid request line of exactly ``size`` bytes (newline excluded) that prints the padding length."""
    head = json.dumps({"id": request_id, "code": "x = '"}).encode()[:-2]  # ends inside the code string
    tail = b"'\\nprint(len(x))\"}"
    padding = size - len(head) - len(tail)
    line = head + b"a" * padding + tail
    assert len(line) == size
    json.loads(line)
    return line


def test_a_line_of_exactly_one_mib_is_accepted(pool: PoolProcess) -> None:
    request_id = new_id("mib")
    line = _line_of(MIB, request_id)
    pool.send(line + b"\n")
    result = pool.result(request_id)
    assert result["exit"] == 0, result["error"]
    assert int(result["stdout"]) > MIB - 100


@pytest.mark.parametrize("pieces", [1, 37], ids=["one-write", "many-writes"])
def test_a_line_over_one_mib_is_discarded_and_the_next_line_is_read_normally(pool: PoolProcess,
                                                                            pieces: int) -> None:
    too_long_id, next_id = new_id("too-long"), new_id("next")
    line = _line_of(MIB + 1, too_long_id) + b"\n" + json.dumps({"id": next_id, "code": "print('next')"}).encode()
    line += b"\n"
    start = len(pool.messages)
    step = len(line) // pieces + 1
    for offset in range(0, len(line), step):
        pool.send(line[offset : offset + step])
    assert pool.result(next_id)["stdout"] == "next\n"
    errors = [m for m in pool.messages[start:] if m.get("error") and m["error"]["type"] == "RequestError"]
    assert len(errors) == 1, errors
    # The line was never parsed, but its id comes first (as the Python client writes it): its caller
    # hears of the refusal at once instead of waiting out its patience.
    assert errors[0]["id"] == too_long_id and errors[0]["refused"] is True
    assert "1 MiB" in errors[0]["error"]["message"] or str(MIB) in errors[0]["error"]["message"]
    assert pool.responses(too_long_id) == [errors[0]]


def test_a_line_over_one_mib_whose_id_is_not_first_is_refused_without_one(pool: PoolProcess) -> None:
    request_id, next_id = new_id("id-last"), new_id("next")
    start = len(pool.messages)
    pool.send(b'{"code": "' + b"a" * (MIB + 1) + b'", "id": "' + request_id.encode() + b'"}\n')
    pool.send(json.dumps({"id": next_id, "code": "print('next')"}).encode() + b"\n")
    assert pool.result(next_id)["stdout"] == "next\n"
    refusals = [m for m in pool.messages[start:] if m.get("error") and m.get("id") is None
                and "1 MiB" in m["error"]["message"]]
    assert len(refusals) == 1 and pool.responses(request_id) == []


def test_a_huge_line_is_not_buffered_whole(pool: PoolProcess) -> None:
    """A 16 MiB line costs the pool no 16 MiB of memory, and the line after it runs."""
    from .pool_driver import rss_kb

    before = rss_kb(pool.pid)
    next_id = new_id("after-huge")
    chunk = b"a" * MIB
    pool.send(b'{"id": "huge", "code": "')
    for _ in range(16):
        pool.send(chunk)
    pool.send(b'"}\n' + json.dumps({"id": next_id, "code": "print('ok')"}).encode() + b"\n")
    assert pool.result(next_id)["stdout"] == "ok\n"
    assert rss_kb(pool.pid) - before < 8 * 1024
    assert [m["error"]["type"] for m in pool.responses("huge")] == ["RequestError"]


# --- request fields -------------------------------------------------------------------------------------


def test_env_is_the_requests_own_and_the_hosts_never_leaks(pool: PoolProcess) -> None:
    code = f"import os\nprint(os.environ.get('KEY'))\nprint({HOST_SECRET_NAME!r} in os.environ)\n" \
           "print(open('/proc/self/environ', 'rb').read().count(b'host-secret'))"
    result = pool.run(code, env={"KEY": "value"})
    assert result["stdout"] == "value\nFalse\n0\n", result
    assert HOST_SECRET not in json.dumps(result)


def test_allow_read_grants_reading_and_nothing_else(pool: PoolProcess, workdir: Path) -> None:
    data = workdir / "data"
    data.mkdir(exist_ok=True)
    (data / "orders.csv").write_text("product,amount\n")
    granted = pool.run("print(open('data/orders.csv').read(), end='')", allow_read=["data"])
    assert granted["stdout"] == "product,amount\n", granted
    assert granted["policy"]["allow_read"] == [str(data.resolve())]
    write = pool.run("open('data/new.txt', 'w')", allow_read=["data"])
    assert write["error"]["type"] == "PermissionError"
    denied = pool.run("open('data/orders.csv').read()")
    assert denied["error"]["type"] == "PermissionError" and denied["error"]["hint"]


def test_allow_write_grants_writing(pool: PoolProcess, workdir: Path) -> None:
    (workdir / "out").mkdir(exist_ok=True)
    result = pool.run("open('out/written.txt', 'w').write('hello')", allow_write=["out"])
    assert result["exit"] == 0, result
    assert (workdir / "out" / "written.txt").read_text() == "hello"
    denied = pool.run("open('out/other.txt', 'w')")
    assert denied["error"]["type"] == "PermissionError"
    assert not (workdir / "out" / "other.txt").exists()


def test_a_grant_that_does_not_exist_is_refused(pool: PoolProcess) -> None:
    refused(pool.run("print(1)", allow_read=["no/such/dir"]), "allow_read")


@pytest.fixture
def listener() -> Iterator[tuple[int, list[bytes]]]:
    """A TCP listener in the test process; what jobs managed to send to it."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(0.1)
    received: list[bytes] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(5)
                received.append(conn.recv(100))

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()[1], received
    stop.set()
    thread.join(5)
    server.close()


def test_allow_network(pool: PoolProcess, listener: tuple[int, list[bytes]]) -> None:
    port, received = listener
    code = f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=5)\ns.sendall(b'hi')\n" \
           "s.close()\nprint('sent')"
    denied = pool.run(code)
    assert denied["error"]["type"] == "PermissionError", denied
    assert denied["error"]["hint"]
    assert denied["policy"]["network"] == "deny"
    allowed = pool.run(code, allow_network=True)
    assert allowed["stdout"] == "sent\n", allowed
    assert allowed["policy"]["network"] == "allow"
    # The job's result may come back before the listener's thread has read what it sent (a loaded machine).
    deadline = time.monotonic() + 5
    while not received and time.monotonic() < deadline:
        time.sleep(0.01)
    assert received == [b"hi"]


def test_timeout_memory_and_max_output_units(pool: PoolProcess) -> None:
    policy = pool.run("print(1)", timeout="5s", memory="512m", max_output=65536)["policy"]
    assert (policy["timeout_ms"], policy["memory_bytes"]) == (5000, 512 << 20)
    policy = pool.run("print(1)", timeout="1500ms", memory=300_000_000)["policy"]
    assert (policy["timeout_ms"], policy["memory_bytes"]) == (1500, 300_000_000)
    assert pool.run("print(1)", timeout=2)["policy"]["timeout_ms"] == 2000


def test_max_output_caps_each_stream(pool: PoolProcess) -> None:
    result = pool.run("import sys\nprint('o' * 5000)\nsys.stderr.write('e' * 5000)", max_output=100)
    assert result["exit"] == 0
    assert result["stdout"] == "o" * 100 and result["stdout_truncated"] is True
    assert result["stderr"] == "e" * 100 and result["stderr_truncated"] is True


def test_max_file_size(pool: PoolProcess, workdir: Path) -> None:
    (workdir / "sized").mkdir(exist_ok=True)
    # A write that crosses the limit is cut short at it; the next one fails with EFBIG.
    code = "f = open('sized/big.bin', 'wb', buffering=0)\nfor _ in range(8):\n    f.write(b'x' * 512)"
    result = pool.run(code, allow_write=["sized"], max_file_size="1k")
    assert result["policy"]["max_file_size"] == 1024
    assert result["exit"] != 0
    assert result["error"]["type"] == "OSError", result["error"]  # EFBIG: File too large
    assert result["error"]["hint"]
    assert (workdir / "sized" / "big.bin").stat().st_size <= 1024
    assert pool.run(code, allow_write=["sized"])["exit"] == 0


def test_package_dirs_field_makes_a_directory_importable(pool: PoolProcess, workdir: Path) -> None:
    site = workdir / "req_site"
    site.mkdir(exist_ok=True)
    (site / "request_helpers.py").write_text("ANSWER = 'from the request'\n")
    result = pool.run("import request_helpers\nprint(request_helpers.ANSWER)", package_dirs=["req_site"])
    assert result["stdout"] == "from the request\n", result
    assert pool.run("import request_helpers")["error"]["type"] == "ModuleNotFoundError"


def test_a_missing_submodule_of_an_installed_package_is_not_called_a_missing_package(pool: PoolProcess) -> None:
    # `import json.tools2`: json is there, its submodule is not. The hint said "json is not installed in this
    # sandbox" and listed what is, sending the model after a package it has.
    hint = pool.run("import json.tools2")["error"]["hint"]
    assert "json is not installed" not in hint and "json.tools2" in hint and "json is installed" in hint, hint
    control = pool.run("import not_a_module_here.sub")["error"]["hint"]
    assert "not_a_module_here is not installed" in control, control


def test_profile_unknown_without_config_is_refused(pool: PoolProcess) -> None:
    refused(pool.run("print(1)", profile="analysis"), "analysis")


def test_the_job_runs_in_the_pools_working_directory(pool: PoolProcess, workdir: Path) -> None:
    assert pool.run("import os\nprint(os.getcwd())")["stdout"] == f"{os.path.realpath(workdir)}\n"
