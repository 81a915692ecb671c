"""The layout by process and trust, as rules on who imports whom (the same static imports Python runs).

``pynox.job`` is what runs after confinement, attacker-controlled from its
first instruction; ``pynox.template`` is the fork server, which must hold no
job's data; ``pynox.server`` is the trusted pool process; ``pynox.wire`` holds
the shapes that cross between them; ``pynox.client`` is what the host
application loads. Each rule is checked on the import graph of the core's
source, imports inside functions included (they run too) and imports under
``TYPE_CHECKING`` left out (they never run).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.pure

SOURCE = Path(__file__).resolve().parents[1] / "packages" / "pynox-core" / "src"


def _module_name(source: Path, path: Path) -> str:
    parts = list(path.relative_to(source).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _runtime_nodes(tree: ast.AST, *, functions: bool) -> list[ast.AST]:
    """Every node that runs: the bodies of ``if TYPE_CHECKING:`` are left out, and those of functions too
    unless ``functions``."""
    found: list[ast.AST] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for child in node.orelse:
                visit(child)
            return
        if not functions and isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            return
        found.append(node)
        for inner in ast.iter_child_nodes(node):
            visit(inner)

    visit(tree)
    return found


def _imports(source: Path, path: Path, modules: set[str]) -> set[str]:
    """The modules that ``path`` imports when it runs. The root package's functions (``pynox.run``,
    ``pynox.tool``, its lazy exports) are left out: every module imports the root package, and what those
    functions load is loaded only by the application that calls them."""
    name = _module_name(source, path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    tree = ast.parse(path.read_text(), str(path))
    for node in _runtime_nodes(tree, functions=name != "pynox"):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.add(target)
            for alias in node.names:  # `from . import figures` imports a module
                if f"{target}.{alias.name}" in modules:
                    found.add(f"{target}.{alias.name}")
    return found


def _graph(source: Path) -> dict[str, set[str]]:
    paths = sorted((source / "pynox").rglob("*.py"))
    modules = {_module_name(source, path) for path in paths}
    graph = {}
    for path in paths:
        imported = _imports(source, path, modules)
        # Importing pynox.a.b runs pynox/__init__ and pynox/a/__init__ first.
        for target in list(imported):
            parts = target.split(".")
            imported.update(".".join(parts[:i]) for i in range(1, len(parts)) if ".".join(parts[:i]) in modules)
        graph[_module_name(source, path)] = imported
    return graph


GRAPH = _graph(SOURCE)


def _reach(start: str) -> set[str]:
    """Every module loaded, directly or not, by importing ``start``."""
    seen, todo = set(), [start]
    while todo:
        module = todo.pop()
        for target in GRAPH.get(module, ()):
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


def _in(module: str, *packages: str) -> bool:
    return any(module == package or module.startswith(package + ".") for package in packages)


def _sides(package: str) -> list[str]:
    return sorted(module for module in GRAPH if _in(module, package))


def test_the_graph_sees_the_whole_core() -> None:
    for package in ("pynox.client", "pynox.server", "pynox.template", "pynox.job", "pynox.wire", "pynox.policy"):
        assert _sides(package), f"no module of {package} was found under {SOURCE}"
    assert "pynox.wire.frames" in GRAPH["pynox.job.pynox_host"]
    assert "pynox.job.figures" in GRAPH["pynox.job.execute"], "a function-level `from . import x` is an import"


def test_the_job_side_imports_only_the_shared_shapes_the_policy_and_the_hints() -> None:
    allowed = ("pynox.job", "pynox.wire", "pynox.policy", "pynox.hints")
    wrong = {module: sorted(target for target in GRAPH[module] if _in(target, "pynox") and target != "pynox"
                            and not _in(target, *allowed))
             for module in _sides("pynox.job")}
    assert not {module: targets for module, targets in wrong.items() if targets}


def test_the_server_never_loads_the_job_side_or_the_template() -> None:
    wrong = {module: sorted(target for target in _reach(module) if _in(target, "pynox.job", "pynox.template"))
             for module in _sides("pynox.server")}
    assert not {module: targets for module, targets in wrong.items() if targets}


def test_the_template_enters_the_job_side_only_through_the_child_entry_points() -> None:
    """The template forks and calls run_job or run_prepared; the setup's steps, the execution and the report
    are the child's, in the order job/child.py runs them, never called from the template one by one."""
    wrong = {module: sorted(target for target in GRAPH[module]
                            if _in(target, "pynox.job") and target not in ("pynox.job", "pynox.job.child"))
             for module in _sides("pynox.template")}
    assert not {module: targets for module, targets in wrong.items() if targets}
    assert "pynox.job.child" in GRAPH["pynox.template.fork_server"]


def test_the_shared_shapes_depend_on_no_process() -> None:
    processes = ("pynox.client", "pynox.server", "pynox.template", "pynox.job")
    wrong = {module: sorted(target for target in _reach(module) if _in(target, *processes))
             for module in _sides("pynox.wire")}
    assert not {module: targets for module, targets in wrong.items() if targets}


def test_the_policy_depends_on_no_process() -> None:
    processes = ("pynox.client", "pynox.server", "pynox.template", "pynox.job")
    wrong = {module: sorted(target for target in _reach(module) if _in(target, *processes))
             for module in _sides("pynox.policy")}
    assert not {module: targets for module, targets in wrong.items() if targets}


_SANDBOX = ("pynox.server", "pynox.template", "pynox.job", "pynox.policy")


def test_the_client_never_loads_the_sandbox() -> None:
    # pynox.transport is the client's part that a pool over another transport (pynox-ray) imports.
    wrong = {module: sorted(target for target in _reach(module) if _in(target, *_SANDBOX))
             for module in [*_sides("pynox.client"), "pynox.transport"]}
    assert not {module: targets for module, targets in wrong.items() if targets}


def _cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle of ``graph`` as the modules on it (first repeated last), or ``[]`` when it has none.
    The edge from a module to the packages that hold it is left out: Python runs a package before its
    modules, and a package's ``__init__`` importing its own modules is how a package is made, not a knot."""
    state: dict[str, str] = {}
    path: list[str] = []

    def visit(module: str) -> list[str]:
        state[module] = "open"
        path.append(module)
        for target in sorted(graph.get(module, ())):
            if target not in graph or target == module or module.startswith(target + "."):
                continue
            if state.get(target) == "open":
                return [*path[path.index(target):], target]
            if target not in state and (found := visit(target)):
                return found
        state[module] = "done"
        path.pop()
        return []

    for module in sorted(graph):
        if module not in state and (found := visit(module)):
            return found
    return []


def test_the_core_has_no_import_cycle() -> None:
    # Imports inside functions count (they run too): a cycle broken only by a late import is still a cycle.
    # The order the graph allows is drawn in docs/architecture.md ("Dependency order").
    assert _cycle(GRAPH) == [], " -> ".join(_cycle(GRAPH))


def test_the_cycle_check_sees_a_cycle_through_a_late_import(tmp_path: Path) -> None:
    # Control: the client's old knot in small (pool -> tool at call time, tool -> pool at import) is found,
    # and a package importing its own modules is not one.
    client = tmp_path / "pynox" / "client"
    client.mkdir(parents=True)
    (tmp_path / "pynox" / "__init__.py").write_text("")
    (client / "__init__.py").write_text("from .pool import Pool\n")
    (client / "pool.py").write_text("class Pool:\n    def tool(self):\n        from .tool import make\n")
    (client / "tool.py").write_text("from .runner import Runner\n")
    (client / "runner.py").write_text("")
    assert _cycle(_graph(tmp_path)) == []
    (client / "tool.py").write_text("from .pool import Pool\n")
    assert _cycle(_graph(tmp_path)) == ["pynox.client.pool", "pynox.client.tool", "pynox.client.pool"]


# A host application, as users write one: a tool with a host function and one with a session, through the
# public API and through every adapter's import. What it loaded is read from its own sys.modules and maps.
_APPLICATION = """
import json, sys
import pynox
import pynox_langchain, pynox_mcp, pynox_monty, pynox_pydantic_ai, pynox_smolagents, pynox_strands
with pynox.Pool(workers=1) as pool:
    run = pool.tool(functions={"double": lambda x: 2 * x})
    ran = run("from pynox_host import double\\nprint(double(21))")
    step = pool.tool(session=True)
    step("x = 20")
    stepped = step("print(x + 2)")
    made = pynox.CodeTool(pool=pool, allow_write=[sys.argv[1]])
loaded = sorted(name for name in sys.modules if name.startswith(SANDBOX) or name == "pyseccomp")
maps = [line.split()[-1] for line in open("/proc/self/maps") if "libseccomp" in line]
print(json.dumps({"ran": ran, "stepped": stepped, "loaded": loaded, "libseccomp": sorted(set(maps))}))
"""


def _what_an_application_loads(tmp_path: Path, prelude: str = "") -> dict[str, Any]:
    source = f"SANDBOX = {_SANDBOX!r}\n{prelude}" + _APPLICATION
    done = subprocess.run([sys.executable, "-c", source, str(tmp_path)], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    seen: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return seen


def test_a_host_application_loads_no_sandbox_module_and_no_libseccomp(tmp_path: Path) -> None:
    seen = _what_an_application_loads(tmp_path)
    assert seen["ran"].strip() == "42" and seen["stepped"].strip() == "22", seen  # the jobs really ran
    assert seen["loaded"] == [], "the host application loaded the sandbox's internals"
    assert seen["libseccomp"] == [], "the host application loaded libseccomp"


def test_the_application_check_sees_a_sandbox_module_loaded(tmp_path: Path) -> None:
    # Control: the same reading, in an application that does import the policy, finds it and libseccomp.
    seen = _what_an_application_loads(tmp_path, "import pynox.policy\n")
    assert "pynox.policy.seccomp" in seen["loaded"] and "pyseccomp" in seen["loaded"]
    assert seen["libseccomp"], "libseccomp was imported yet not seen in the maps"


def test_the_graph_counts_what_runs_and_only_that(tmp_path: Path) -> None:
    job = tmp_path / "pynox" / "job"
    job.mkdir(parents=True)
    (tmp_path / "pynox" / "server").mkdir()
    for init in ("pynox", "pynox/job", "pynox/server"):
        (tmp_path / init / "__init__.py").write_text("")
    (tmp_path / "pynox" / "server" / "templates.py").write_text("")
    (job / "hidden.py").write_text("")
    (job / "sample.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import hidden\n"
                                   "def f():\n    from ..server import templates\n")
    graph = _graph(tmp_path)
    assert "pynox.server.templates" in graph["pynox.job.sample"]
    assert "pynox.server" in graph["pynox.job.sample"], "importing a module runs its package first"
    assert "pynox.job.hidden" not in graph["pynox.job.sample"], "a TYPE_CHECKING import never runs"
