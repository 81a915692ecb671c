"""Hints written for a model: what the sandbox refused and which grant the host could give.

The model cannot grant itself anything; a hint tells it what to ask for, or to
work within what it has. ``style`` says how grants are spelled: keyword
arguments of the API (``allow_read=["/data"]``) or flags of ``pynox run``
(``--allow-read /data``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Literal

from .paths import beneath
from .units import format_duration, format_size

__all__ = [
    "HOSTS_HINT_START",
    "cross_grant_hint",
    "hosts_hint",
    "importable",
    "memory_hint",
    "module_hint",
    "network_hint",
    "operation_hint",
    "path_hint",
    "shell_hint",
    "subprocess_hint",
    "threads_hint",
    "timeout_hint",
]

Style = Literal["api", "cli"]


def _grant(style: Style, flag: str, value: str) -> str:
    if style == "cli":
        return f"--{flag.replace('_', '-')} {value}"
    return f'{flag}=["{value}"]'


def _absolute(path: str, cwd: str) -> str:
    # Relative to where the job is now (it may have changed directory since it started), and through
    # symlinks: Landlock judged the file a link points to, and grants are resolved the same way.
    try:
        cwd = os.getcwd()
    except OSError:
        pass
    return os.path.realpath(os.path.join(cwd, path))


def path_hint(path: str, cwd: str, read: Sequence[str], write: Sequence[str], style: Style) -> str:
    """Why ``path`` was denied and which grant would allow it."""
    absolute = _absolute(path, cwd)
    # Only an existing path can be granted (the pool refuses a grant of one that is not there): a file the
    # code tried to create is allowed by a grant of the nearest directory that exists.
    target = _existing(absolute)
    if any(beneath(absolute, granted) for granted in read):
        return (f"{absolute} is readable but not writable in this sandbox. To modify it the host must grant "
                f"{_grant(style, 'allow_write', target)}{_not_there(absolute, target)}.")
    granted = ", ".join(sorted({*read, *write})) or "none"
    return (f"{absolute} is outside the paths this sandbox may access (granted: {granted}). Work within "
            f"the granted paths, or ask the host to grant {_grant(style, 'allow_read', target)} to read it "
            f"({_grant(style, 'allow_write', target)} to write it){_not_there(absolute, target)}.")


def _existing(absolute: str) -> str:
    """``absolute``, or its nearest ancestor that exists (path lookups are not confined: this reveals nothing
    the code could not stat itself)."""
    while not os.path.lexists(absolute) and absolute != os.path.dirname(absolute):
        absolute = os.path.dirname(absolute)
    return absolute


def _not_there(absolute: str, target: str) -> str:
    return "" if target == absolute else f"; {absolute} does not exist yet, and a grant names a path that exists"


def subprocess_hint() -> str:
    return ("Starting programs or processes (subprocess, os.system, os.fork, multiprocessing) is not allowed "
            "in this sandbox, and no grant allows it. Do the work in Python within this process; threads work.")


def threads_hint(max_tasks: int) -> str:
    return (f"A job may run at most {max_tasks} threads at once (its main thread included), and this one "
            "tried to start more. Use a bounded pool (concurrent.futures.ThreadPoolExecutor(max_workers=8)) "
            "or asyncio for many concurrent waits.")


def operation_hint() -> str:
    return ("The sandbox denied this operation, and no grant allows it: starting programs or processes, "
            "signalling processes outside the sandbox, changing a file's permissions, owner or times outside "
            "the write grants, setting the setuid or setgid bit, extended attributes and kernel-level "
            "operations are not allowed. Do the work in this Python process, on files in a write grant.")


def cross_grant_hint() -> str:
    return ("A file cannot be renamed or hard-linked across the edge of a granted directory (or across "
            "filesystems). Copy its content instead (shutil.copyfile), where both places are granted.")


# How the hint of a socket error under allow_hosts begins: the pool, which alone knows the address a refused
# connect named, recognises it and says which entry would allow it (hosts_hint).
HOSTS_HINT_START = "This sandbox may open TCP connections only"


def network_hint(network: str, style: Style, hosts: Sequence[str] = ()) -> str:
    """Why a socket call failed, by the job's network mode ("none", "hosts" or "all")."""
    never = ("Unix sockets (other than a stream socket.socketpair), raw, netlink and packet sockets are never "
             "allowed.")
    if network == "hosts":
        listed = f" ({', '.join(hosts)})" if hosts else ""
        return (f"{HOSTS_HINT_START} to the hosts it was granted{listed}; UDP, "
                f"listening sockets and other hosts or ports are not allowed. "
                f"Ask the host to grant {_host_grant(style, 'host:port')}. {never}")
    if network == "all":
        return f"This kind of socket is not allowed in this sandbox, even with the network granted. {never}"
    grant = "--allow-network" if style == "cli" else "allow_network=True"
    return f"Network access is not allowed in this sandbox. The host can grant TCP and UDP with {grant}. {never}"


def hosts_hint(address: str, entry: str, hosts: Sequence[str], style: Style) -> str:
    """A connect to ``address`` refused by the pool: the ``entry`` that would allow it."""
    return (f"The connection to {address} was refused: this sandbox may connect only to {', '.join(hosts)}. "
            f"To reach it the host must grant {_host_grant(style, entry)}.")


def _host_grant(style: Style, entry: str) -> str:
    return f"--allow-host {entry}" if style == "cli" else f'allow_hosts=["{entry}"]'


def memory_hint(memory: int, style: Style) -> str:
    grant = f"--memory {format_size(memory * 2)}" if style == "cli" else f'memory="{format_size(memory * 2)}"'
    return (f"The code ran out of memory (limit {format_size(memory)}). Reduce allocations (process data "
            f"in chunks, use smaller types), or ask the host for more, e.g. {grant}.")


def timeout_hint(timeout: float, style: Style) -> str:
    longer = format_duration(timeout * 2)
    grant = f"--timeout {longer}" if style == "cli" else f'timeout="{longer}"'
    return (f"The code ran longer than its {format_duration(timeout)} limit and was stopped. Make it faster "
            f"(check for endless loops or waits), or ask the host for more time, e.g. {grant}.")


def file_size_hint(max_file_size: int, style: Style) -> str:
    larger = format_size(max_file_size * 2)
    grant = f"--max-file-size {larger}" if style == "cli" else f'max_file_size="{larger}"'
    return (f"A file grew past the {format_size(max_file_size)} limit on file size. Write less, or ask the "
            f"host for larger files, e.g. {grant}.")


# The pool's own and the installers': never what a model should reach for.
_NOT_FOR_JOBS = frozenset({"pynox", "pyseccomp", "pip", "setuptools", "pkg_resources", "uv", "wheel"})
# What models reach for first in analysis code: listed before the rest when installed, so that a bounded list
# names them however many dependencies the environment also holds (an alphabetical list of a few hundred
# names would show annotated_types and anyio, and leave pandas out).
_REACHED_FOR = ("numpy", "pandas", "scipy", "matplotlib", "sklearn", "seaborn", "statsmodels", "sympy", "polars",
                "pyarrow", "duckdb", "networkx", "PIL", "requests", "httpx", "bs4", "lxml", "yaml", "openpyxl",
                "plotly", "tqdm")


def importable(preloaded: Sequence[str], package_dirs: Sequence[str], limit: int) -> list[str]:
    """The top-level modules this interpreter can import beyond the standard library: the ``preloaded`` ones
    first, then those models reach for most (``_REACHED_FOR``), then the rest its site directories and
    ``package_dirs`` hold, sorted; at most ``limit`` names, then "and N more". The pool's ready event and a
    tool's description list them (the pool's template runs this interpreter); a job's ModuleNotFoundError
    hint lists them from inside the sandbox."""
    import pkgutil  # only where a list is made: the template imports this module, and each fork copies it

    # Site directories only (site-packages, dist-packages): the standard library is a given, and an
    # interpreter's bin directory or a checkout's source path (an editable install's) are not packages.
    dirs = [path for path in sys.path if path.rstrip("/").endswith(("site-packages", "dist-packages"))]
    names = {info.name for info in pkgutil.iter_modules([*package_dirs, *dirs])
             if info.name.isidentifier() and not info.name.startswith("_") and info.name not in _NOT_FOR_JOBS}
    tops = list(dict.fromkeys(name.split(".")[0] for name in preloaded))
    tops += [name for name in _REACHED_FOR if name in names and name not in tops]
    ordered = [*tops, *sorted(names - set(tops), key=str.lower)]
    more = len(ordered) - limit
    return ordered[:limit] + ([f"and {more} more"] if more > 0 else [])


def _package_grant(style: Style, name: str) -> str:
    return f"--package {name}" if style == "cli" else f'packages=["{name}"]'


def _ask_for(name: str, installs: bool, style: Style) -> str:
    if installs:
        return (f"Ask the host to install it for you with {_package_grant(style, name)} (the pool installs it "
                "before the code runs; a distribution's name may differ from its module's), or work with what is "
                "installed.")
    return "Work with what is installed, or ask the host to add it."


def module_hint(name: str, importable: Sequence[str], installs: bool, style: Style, *, top_found: bool = False) -> str:
    """A ModuleNotFoundError: the module is not here, what is, and how it could be. ``top_found``: its top-level
    package is importable, only this submodule of it is not (``import json.tools2``)."""
    top = name.split(".")[0]
    if top_found and top != name:
        return (f"{top} is installed, but it has no module {name}: check the name (pkgutil.iter_modules("
                f"{top}.__path__) lists its submodules).")
    if top == "pip":
        return ("pip does not run in this sandbox: code cannot install packages (no network, and the "
                f"environment is read-only). {_ask_for('PACKAGE', installs, style)}")
    listed = ", ".join(importable) if importable else "none"
    return (f"{top} is not installed in this sandbox, and code cannot install it. Importable here beyond the "
            f"standard library: {listed}. {_ask_for(top, installs, style)}")


def shell_hint(line: str, installs: bool, style: Style) -> str:
    """A SyntaxError on a line that starts with ``!`` or ``%``: a notebook's shell command or magic."""
    if line.lstrip("!%").startswith(("pip", "conda", "uv ")):
        session = (" (In a session the host opens with pip_install, `%pip install NAME` asks the pool to install "
                   "NAME.)") if installs else ""
        return ("This runs plain Python: shell commands (!...) and magics (%...) do not run here, and packages "
                f"cannot be installed from the code. {_ask_for('PACKAGE', installs, style)}{session}")
    return ("This runs plain Python: shell commands (!...) and IPython magics (%...) do not run here. Write the "
            "same in Python (time a call with time.perf_counter(); read files with open() or pathlib), and no "
            "programs can be started.")
