"""``pynox-mcp``: the command line that starts the server, with every grant the operator's.

The pool starts, and runs one empty job under the grants, before the server answers anything, so a
machine that cannot confine code, a bad config or a grant the pool refuses stops the server at once
with one line on stderr (exit 2), not at the model's first call. When the client disconnects (stdin
ends), calls still running are cancelled (the pool kills their jobs), the pool is closed, and the
process exits 0.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import anyio
from mcp.server.stdio import stdio_server

from pynox import CodeTool, Pool, PynoxError, __version__, add_grant_arguments, grants_from_arguments, parse_size

from ._server import RunPython, build_server

__all__ = ["build_parser", "main"]

# After the client is gone, how long the pool may take to stop: the runs it was running were cancelled.
_CLOSE_TIMEOUT = 5.0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pynox-mcp",
        description="An MCP server (stdio) with one tool, run_python, whose code runs in a fresh, kernel-confined "
                    "Python process. Every permission comes from these flags (or a pynox.toml profile under its "
                    "ceiling), never from the model.",
        epilog="Claude Desktop / Cursor: {\"mcpServers\": {\"pynox\": {\"command\": \"pynox-mcp\", "
               "\"args\": [\"--allow-read\", \"/path/to/data\"]}}}")
    parser.add_argument("--version", action="version", version=f"pynox-mcp {__version__}")
    add_grant_arguments(parser)
    pool = parser.add_argument_group("the pool")
    pool.add_argument("--workers", type=int, default=4, help="calls that run at the same time (default 4)")
    pool.add_argument("--preload", default="", metavar="MODULES",
                      help="comma-separated modules imported once in the warm template (e.g. numpy,pandas)")
    pool.add_argument("--session", action="store_true",
                      help="keep variables between calls, like notebook cells, in one process per client connection "
                           "(the model can pass restart: true to start over); by default every call is fresh")
    pool.add_argument("--scratch", action="store_true",
                      help="with --session: the code works in a scratch directory of the pool's, removed when the "
                           "session ends; its files are MCP resources (pynox://scratch/PATH) and the upload_file "
                           "tool puts files in")
    pool.add_argument("--max-resource-size", default="10m", metavar="SIZE",
                      help="the largest file read as a resource or uploaded with upload_file (default 10m)")
    transport = parser.add_argument_group("transport (default: stdio)")
    transport.add_argument("--http", type=int, metavar="PORT",
                           help="serve streamable HTTP on PORT at /mcp instead of stdio; no authentication, so any "
                                "local process can call it: keep it on loopback (every call is fresh: no --session)")
    transport.add_argument("--host", default="127.0.0.1",
                           help="the address --http binds (default 127.0.0.1); the Host and Origin headers of a "
                                "request must name loopback while it is")
    return parser


async def _serve(tool: RunPython) -> None:
    server = build_server(tool)
    try:
        async with stdio_server() as (read_stream, write_stream):
            await server.run(read_stream, write_stream, server.create_initialization_options())
    finally:
        await tool.close()


def _serve_http(tool: RunPython, host: str, port: int) -> None:
    import uvicorn

    # The SDK checks the Host and Origin headers against loopback names when it binds loopback (a web page
    # cannot reach the server through DNS rebinding); stateless: no MCP session, every call a fresh job.
    app = build_server(tool).streamable_http_app(host=host, stateless_http=True)
    uvicorn.run(app, host=host, port=port, log_level="warning")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.http is not None and args.session:
        parser.error("--session needs the stdio transport: over --http every call is a fresh process")
    if args.scratch and not args.session:
        parser.error("--scratch needs --session: the scratch directory is the session's")
    pool: Pool | None = None
    try:
        pool = Pool(args.workers, preload=[name for name in args.preload.split(",") if name], config=args.config)
        grants = grants_from_arguments(args)
        if args.scratch:
            grants["scratch"] = True
        runner = CodeTool(pool, profile=args.profile, session=args.session, **grants)
        # One empty job under the grants, before serving: the pool's own rules (a grant overlapping the
        # runtime, say) refuse a bad grant here, to the operator, not to the model at every call.
        runner.run("pass", fresh=True).raise_for_error()
        tool = RunPython(runner, max_resource_size=parse_size(args.max_resource_size, "--max-resource-size"))
    except PynoxError as exc:
        if pool is not None:
            pool.close(timeout=_CLOSE_TIMEOUT)
        print(f"pynox-mcp: {exc}", file=sys.stderr)
        return 2
    try:
        if args.http is not None:
            _serve_http(tool, args.host, args.http)
        else:
            anyio.run(_serve, tool)
    except KeyboardInterrupt:
        pass
    finally:
        pool.close(timeout=_CLOSE_TIMEOUT)
    return 0
