"""pynox-mcp through the MCP SDK's own client, over stdio, starting the real ``pynox-mcp`` console script.

What an MCP user meets: ``run_python`` is listed with a schema that holds ``code`` (and, with sessions,
``restart``) and a description that says what the code may read and write, its limits and whether
state persists; a failed run is a tool error; a figure is an image; calls run concurrently up to the
workers; a session belongs to its connection; and when the client goes, nothing of the server is left
(checked from outside, in /proc, with this process a child subreaper so nothing escapes by being
adopted).
"""

from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp.client import Client
from mcp.client.stdio import StdioServerParameters
from mcp.server.mcpserver import MCPServer

from pynox import Pool
from tests.harness import procfs
from tests.pool.pool_driver import descendants, proc_table

from .procs import pynox_processes, wait_for_none

pytestmark = pytest.mark.timeout(120)

SERVER = str(Path(sys.executable).with_name("pynox-mcp"))


def connect(*args: str) -> Client:
    return Client(StdioServerParameters(command=SERVER, args=list(args)), read_timeout_seconds=60)


def with_client(args: list[str], body: Callable[[Client], Awaitable[Any]]) -> Any:
    async def main() -> Any:
        async with connect(*args) as client:
            return await body(client)

    return anyio.run(main)


def text_of(result: types.CallToolResult) -> str:
    return "\n".join(block.text for block in result.content if isinstance(block, types.TextContent))


async def run(client: Client, code: str, **arguments: Any) -> types.CallToolResult:
    return await client.call_tool("run_python", {"code": code, **arguments})


def test_help_names_every_flag() -> None:
    done = subprocess.run([SERVER, "--help"], capture_output=True, text=True, timeout=30, check=True)
    for flag in ("--allow-read", "--allow-write", "--allow-network", "--allow-host", "--timeout", "--memory",
                 "--max-output", "--max-file-size", "--env", "--preload", "--workers", "--config", "--profile",
                 "--session", "--http", "--host"):
        assert flag in done.stdout, flag
    done = subprocess.run([sys.executable, "-m", "pynox_mcp", "--help"], capture_output=True, text=True, timeout=30,
                          check=True)
    assert "--allow-read" in done.stdout


@pytest.mark.parametrize("args, says", [
    (["--timeout", "soon"], "timeout"),
    (["--workers", "0"], "workers must be at least 1"),
    (["--env", "PYNOX_MCP_TEST_UNSET_VARIABLE"], "no variable PYNOX_MCP_TEST_UNSET_VARIABLE"),
    (["--profile", "nowhere"], "nowhere"),
])
def test_a_bad_command_line_is_one_line_and_exit_2(earlier_pools: frozenset[int], args: list[str], says: str) -> None:
    done = subprocess.run([SERVER, *args], capture_output=True, text=True, timeout=60, check=False,
                          stdin=subprocess.PIPE)
    assert done.returncode == 2, done
    assert says in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert done.stdout == ""  # nothing on the protocol's channel
    wait_for_none(earlier_pools)


def test_the_tool_is_listed_with_code_only_and_a_description_of_its_grants(earlier_pools: frozenset[int],
                                                                         tmp_path: Path) -> None:
    async def body(client: Client) -> types.ListToolsResult:
        return await client.list_tools()

    listed = with_client(["--allow-read", str(tmp_path), "--timeout", "7s", "--memory", "300m"], body)
    [tool] = listed.tools
    assert tool.name == "run_python"
    assert tool.input_schema["properties"].keys() == {"code"} and tool.input_schema["required"] == ["code"]
    description = tool.description or ""
    assert f"Read files: {tmp_path}" in description and "Write files: nowhere." in description
    assert "Network: not allowed." in description and "7s of time, 300m of memory" in description
    assert "Each call runs in a fresh process" in description
    assert tool.annotations is not None and tool.annotations.read_only_hint is True


def test_a_failed_run_is_a_tool_error_with_type_line_and_hint(earlier_pools: frozenset[int]) -> None:
    async def body(client: Client) -> tuple[types.CallToolResult, types.CallToolResult]:
        return await run(client, "print('before')\nopen('/etc/shadow')"), await run(client, "print(6 * 7)")

    failed, good = with_client([], body)
    assert failed.is_error is True
    text = text_of(failed)
    assert text.startswith("before\nPermissionError: [Errno 13] Permission denied: '/etc/shadow' (agent.py:2)")
    assert "    open('/etc/shadow')" in text and "Hint: /etc/shadow is outside the paths" in text
    assert good.is_error is False and text_of(good) == "42"


def test_hand_wired_the_failure_was_a_success(earlier_pools: frozenset[int]) -> None:
    """The control: ``MCPServer.add_tool(pool.tool())``, the way an MCP user wired Pynox before, reports the
    same failure with ``isError: false`` (the gap the server closes)."""
    with Pool(workers=1) as pool:
        server = MCPServer("hand-wired")
        server.add_tool(pool.tool())

        async def main() -> types.CallToolResult:
            async with Client(server) as client:
                return await client.call_tool("run_python", {"code": "open('/etc/shadow')"})

        result = anyio.run(main)
    assert "PermissionError" in text_of(result) and result.is_error is False


def test_a_figure_is_png_image_content(earlier_pools: frozenset[int]) -> None:
    code = "import matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()"

    async def body(client: Client) -> types.CallToolResult:
        return await run(client, code)

    result = with_client(["--preload", "matplotlib"], body)
    assert result.is_error is False, text_of(result)
    images = [block for block in result.content if isinstance(block, types.ImageContent)]
    assert len(images) == 1 and images[0].mime_type == "image/png"
    assert base64.b64decode(images[0].data).startswith(b"\x89PNG\r\n\x1a\n")
    assert text_of(result) == "[1 image]"


def test_a_session_belongs_to_its_connection_and_restart_clears_it(earlier_pools: frozenset[int]) -> None:
    async def first(client: Client) -> list[types.CallToolResult]:
        listed = await client.list_tools()
        assert listed.tools[0].input_schema["properties"].keys() == {"code", "restart"}
        assert "restart: true" in (listed.tools[0].description or "")
        return [await run(client, "x = 41"), await run(client, "print(x + 1)"),
                await run(client, "print(x)", restart=True), await run(client, "y = 1\nprint(y)")]

    async def second(client: Client) -> types.CallToolResult:
        return await run(client, "print(y)")

    kept, seen, restarted, again = with_client(["--session"], first)
    assert not kept.is_error and text_of(seen) == "42"
    assert restarted.is_error and text_of(restarted).startswith("NameError: name 'x' is not defined")
    assert text_of(again) == "1"
    other = with_client(["--session"], second)  # another connection: its own process, none of the first's names
    assert other.is_error and text_of(other).startswith("NameError: name 'y' is not defined")


# Each call waits, up to 5 s, for the other's file: both finish only if they run at the same time.
RENDEZVOUS = """\
import os, time
mine, theirs = {mine!r}, {theirs!r}
open(mine, 'w').close()
end = time.monotonic() + 5
while not os.path.exists(theirs):
    if time.monotonic() > end:
        raise TimeoutError('the other call never ran alongside this one')
    time.sleep(0.01)
print('met')"""


def _rendezvous(tmp_path: Path, workers: int) -> list[types.CallToolResult]:
    async def body(client: Client) -> list[types.CallToolResult]:
        results: list[types.CallToolResult] = []

        async def one(mine: str, theirs: str) -> None:
            code = RENDEZVOUS.format(mine=str(tmp_path / mine), theirs=str(tmp_path / theirs))
            results.append(await run(client, code))

        async with anyio.create_task_group() as group:
            group.start_soon(one, "a", "b")
            group.start_soon(one, "b", "a")
        return results

    return with_client(["--allow-write", str(tmp_path), "--workers", str(workers)], body)


def test_calls_from_one_client_run_concurrently_up_to_the_workers(earlier_pools: frozenset[int],
                                                                  tmp_path: Path) -> None:
    (tmp_path / "two").mkdir()
    results = _rendezvous(tmp_path / "two", workers=2)
    assert [text_of(result) for result in results] == ["met", "met"]
    # The control: with one worker the second call waits for the first, which gives up.
    (tmp_path / "one").mkdir()
    alone = _rendezvous(tmp_path / "one", workers=1)
    assert any(result.is_error and "the other call never ran alongside this one" in text_of(result)
               for result in alone), [text_of(result) for result in alone]


def test_the_model_cannot_pass_grants(earlier_pools: frozenset[int]) -> None:
    async def body(client: Client) -> types.CallToolResult:
        return await run(client, "print(open('/etc/passwd').read())", allow_read=["/etc/passwd"])

    result = with_client([], body)
    assert result.is_error and "run_python takes only code; not allow_read" in text_of(result)
    assert "root:" not in text_of(result)


def test_when_the_client_disconnects_nothing_is_left(earlier_pools: frozenset[int]) -> None:
    """A call is still running (a busy loop) when the client goes: the server, its pool, the templates and
    the job are all gone soon after, as /proc shows."""
    seen: dict[int, tuple[int, int, str]] = {}

    async def body(client: Client) -> None:
        async with anyio.create_task_group() as group:
            group.start_soon(run, client, "while True:\n    pass")
            end = time.monotonic() + 30
            while not a_job_runs():
                assert time.monotonic() < end, pynox_processes(earlier_pools)
                await anyio.sleep(0.05)
            seen.update(pynox_processes(earlier_pools))
            group.cancel_scope.cancel()  # the client leaves with the call unanswered

    with_client(["--timeout", "60s"], body)
    assert any("pynox-mcp" in command for _depth, _parent, command in seen.values()), seen
    wait_for_none(earlier_pools)


def a_job_runs() -> bool:
    """Whether a job process (named ``pynox-job`` once it runs code) is running below this process."""
    table = proc_table()
    return any(table[pid][3] == "pynox-job" for pid in descendants(os.getpid(), table))


def _message(message: dict[str, Any]) -> bytes:
    return (json.dumps({"jsonrpc": "2.0", **message}) + "\n").encode()


def test_the_server_exits_by_itself_when_stdin_ends(earlier_pools: frozenset[int]) -> None:
    """No kill from the client: the end of stdin alone stops the running call, the pool and the server, exit 0."""
    server = subprocess.Popen([SERVER, "--timeout", "60s"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE)
    try:
        assert server.stdin is not None and server.stdout is not None
        server.stdin.write(_message({"id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "0"}}}))
        server.stdin.write(_message({"method": "notifications/initialized"}))
        server.stdin.write(_message({"id": 2, "method": "tools/call", "params": {
            "name": "run_python", "arguments": {"code": "while True:\n    pass"}}}))
        server.stdin.flush()
        assert json.loads(server.stdout.readline())["id"] == 1
        end = time.monotonic() + 30
        while not a_job_runs():
            assert time.monotonic() < end, pynox_processes(earlier_pools)
            time.sleep(0.05)
        server.stdin.close()
        assert server.wait(timeout=20) == 0
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
        for pipe in (server.stdout, server.stderr):
            if pipe is not None:
                pipe.close()
    wait_for_none(earlier_pools)


def test_a_grant_the_pool_refuses_stops_the_server_before_it_serves(earlier_pools: frozenset[int]) -> None:
    """A write grant over the runtime, which the pool refuses, is the operator's error at start (exit 2),
    not the model's at every call."""
    runtime = os.path.join(sys.base_prefix, "lib")
    done = subprocess.run([SERVER, "--allow-write", runtime], capture_output=True, text=True, timeout=60,
                          check=False, stdin=subprocess.PIPE)
    assert done.returncode == 2 and done.stdout == "" and "Traceback" not in done.stderr, done
    wait_for_none(earlier_pools)


@pytest.mark.needs_root("the container launcher installs a seccomp filter and drops capabilities")
def test_where_landlock_is_blocked_the_server_refuses_to_start(earlier_pools: frozenset[int]) -> None:
    """Inside a container whose seccomp profile predates Landlock (Docker before 20.10.18), the server never
    serves unconfined code: it exits 2 with the pool's reason, before answering anything."""
    done = subprocess.run([sys.executable, "-m", "tests.setups.container", "--profile", "docker-pre-20.10.18", "--",
                           SERVER], capture_output=True, text=True, timeout=120, check=False, stdin=subprocess.PIPE,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 2 and done.stdout == "", done
    assert "pynox-mcp: Pynox will not run code unconfined: the Landlock system calls are blocked" in done.stderr
    assert "Traceback" not in done.stderr
    wait_for_none(earlier_pools)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_streamable_http_binds_loopback_checks_the_host_and_answers_as_stdio_does(
        earlier_pools: frozenset[int]) -> None:
    port = _free_port()
    server = subprocess.Popen([SERVER, "--http", str(port)], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        end = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert server.poll() is None and time.monotonic() < end, "the HTTP server did not start"
                time.sleep(0.1)
        # Bound to loopback only: /proc/net/tcp lists the listening socket as 127.0.0.1 (0100007F).
        listening = [line.split()[1] for line in procfs.machine("net/tcp").splitlines()[1:]
                     if line.split()[3] == "0A"]
        assert f"0100007F:{port:04X}" in listening and f"00000000:{port:04X}" not in listening

        async def body() -> types.CallToolResult:
            async with Client(f"http://127.0.0.1:{port}/mcp") as client:
                return await client.call_tool("run_python", {"code": "print('over http')\n1 / 0"})

        result = anyio.run(body)
        assert result.is_error and text_of(result).startswith("over http\nZeroDivisionError: division by zero")
        # A request naming another host (a web page's, rebound to 127.0.0.1) is refused before any code runs.
        request = (f"POST /mcp HTTP/1.1\r\nHost: attacker.example:{port}\r\nContent-Type: application/json\r\n"
                   "Accept: application/json, text/event-stream\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}")
        with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
            raw.sendall(request.encode())
            status = raw.recv(200).split(b"\r\n")[0]
        assert status.split()[1] in (b"403", b"421"), status
    finally:
        server.terminate()
        server.wait(timeout=30)
    wait_for_none(earlier_pools)


def test_http_has_no_sessions_and_says_so() -> None:
    done = subprocess.run([SERVER, "--http", "1", "--session"], capture_output=True, text=True, timeout=30,
                          check=False)
    assert done.returncode == 2 and "--session needs the stdio transport" in done.stderr


def test_allow_host_reaches_the_listed_host_and_no_other() -> None:
    import socket

    with socket.create_server(("127.0.0.1", 0)) as listed, socket.create_server(("127.0.0.1", 0)) as other:
        ports = listed.getsockname()[1], other.getsockname()[1]
        code = (f"import socket\nfor port in {ports}:\n    try:\n"
                "        socket.create_connection(('127.0.0.1', port), timeout=3).close(); print('reached', port)\n"
                "    except OSError as exc:\n        print('refused', port, type(exc).__name__)")

        async def body(client: Client) -> tuple[str, str]:
            tools = await client.list_tools()
            return tools.tools[0].description or "", text_of(await run(client, code))

        description, text = with_client(["--allow-host", f"127.0.0.1:{ports[0]}"], body)
        assert f"TCP connections to 127.0.0.1:{ports[0]} only" in description
        assert f"reached {ports[0]}" in text and f"refused {ports[1]} PermissionError" in text, text
        other.settimeout(0.3)
        with pytest.raises(TimeoutError):
            other.accept()
