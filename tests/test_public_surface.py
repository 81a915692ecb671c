"""The core's public surface: what ``pynox`` exports, and that the adapters use nothing else of it.

An adapter that reaches into a private module breaks when the core moves
code around; one that uses only ``pynox.<public name>`` does not. The exports
list is pinned (as httpx pins its own): a name added or removed is a decision,
made here and in docs/python-api.md.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pynox
import pynox.transport

PACKAGES = Path(__file__).resolve().parents[1] / "packages"
ADAPTERS = ("pynox-pydantic-ai", "pynox-strands", "pynox-smolagents", "pynox-monty", "pynox-mcp", "pynox-langchain",
            "pynox-ray", "pynox-jupyter", "pynox-openai-agents", "pynox-autogen", "pynox-adk")

EXPORTS = [
    "CodeTool", "ConfigError", "FileInfo", "Grants", "HostError", "JobError", "KernelSupportError", "Output",
    "OutputEvent", "Pool", "PoolError", "PoolWorkerError", "PynoxError", "PynoxPool", "RequestError", "Result",
    "RunGrants", "Runner", "SandboxSetupError", "SavedSession", "Session", "SessionGrants", "SessionRunner",
    "SessionStateError", "StreamText",
    "ToolDescription", "ToolGrants", "Usage", "__version__", "add_grant_arguments", "check_grants",
    "format_duration", "format_size", "grant_argv", "grants_from_arguments", "parse_duration", "parse_size", "run",
    "tool",
]


# What a pool over another transport builds on (pynox.transport; pynox-ray is one such pool).
TRANSPORT_EXPORTS = [
    "Answer", "CallEvent", "Closed", "ErrorInfo", "HostErrors", "HostLoop", "RUN_GRANT_NAMES", "ReadyEvent", "Reply",
    "Request", "SESSION_GRANT_NAMES", "STATS_FIELDS", "SessionResult", "StartErrorEvent", "StatsEvent", "Transport",
    "TransportFactory", "answer_call", "awaiting_on", "decode_answer", "encode", "first_line_decoder", "lost_result",
    "lost_wire", "make_tool", "pool_argv", "step_functions",
]
PUBLIC_MODULES = {"pynox": pynox.__all__, "pynox.transport": pynox.transport.__all__}


def test_the_exports_are_pinned() -> None:
    assert sorted(pynox.__all__) == sorted(EXPORTS)
    assert sorted(pynox.transport.__all__) == sorted(TRANSPORT_EXPORTS)
    for module, names in PUBLIC_MODULES.items():
        for name in names:
            assert getattr(sys.modules[module], name) is not None, f"{module}.{name}"


def _core_imports(source: Path) -> list[str]:
    """Every private use of the core in one file: modules of it imported other than the public ones, and
    names imported from a public module that it does not export."""
    found = []
    for node in ast.walk(ast.parse(source.read_text(), str(source))):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names
                      if alias.name.startswith("pynox.") and alias.name not in PUBLIC_MODULES]
        elif isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
            if node.module in PUBLIC_MODULES:
                found += [f"{node.module}.{alias.name}" for alias in node.names
                          if alias.name not in PUBLIC_MODULES[node.module]]
            elif node.module.startswith("pynox."):
                found.append(node.module)
    return found


def test_the_adapters_use_only_public_names_of_the_core() -> None:
    sources = [path for adapter in ADAPTERS for path in (PACKAGES / adapter / "src").rglob("*.py")]
    assert len(sources) >= 8, "the adapters' sources were not found"
    private = {str(path.relative_to(PACKAGES)): uses for path in sources if (uses := _core_imports(path))}
    assert not private, f"adapters import private parts of pynox: {private}"


def test_the_check_sees_a_private_import(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text("import pynox\nfrom pynox.client import default_pool\nfrom pynox import Pool, _LAZY\n"
                      "from pynox.transport import HostLoop, Report\nimport pynox.transport\n")
    assert _core_imports(sample) == ["pynox.client", "pynox._LAZY", "pynox.transport.Report"]
