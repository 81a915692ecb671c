"""Pynox as an MCP server: ``run_python`` on a kernel-confined pool, grants from the command line.

    pynox-mcp --allow-read ./data --allow-write ./out --timeout 10s --session
    python -m pynox_mcp --help

A failed run is an MCP tool error (``isError: true``) with the error type, the failing line and the
hint; figures are ``image/png`` content. :func:`build_server` gives the SDK ``Server`` for embedding.
"""

from __future__ import annotations

from ._cli import build_parser, main
from ._server import RunPython, build_server, call_result

__all__ = ["RunPython", "build_parser", "build_server", "call_result", "main"]
