"""The grants as command-line flags: one definition for every command an operator starts with grants.

``pynox-mcp`` and ``pynox-jupyter`` (its kernelspec's arguments) take the same flags, with the same
meaning as the keyword arguments of :class:`pynox.Grants`: :func:`add_grant_arguments` puts them on a
parser, :func:`grants_from_arguments` reads them back as keyword arguments, and
:func:`grant_argv` writes keyword arguments as flags again (a kernelspec records its grants this way).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from typing import Any

from .errors import PynoxError

__all__ = ["add_grant_arguments", "grant_argv", "grants_from_arguments"]

_LIMITS = (("--timeout", "wall-clock limit per call, e.g. 10s or 500ms (default 30s)"),
           ("--memory", "memory limit per call, e.g. 256m or 1g (default 1g)"),
           ("--max-output", "bytes of stdout and of stderr kept per call (default 1m)"),
           ("--max-file-size", "largest file the code may write, e.g. 10m"))


def add_grant_arguments(parser: argparse.ArgumentParser) -> None:
    """The grant flags, and ``--config``/``--profile``, as a group of ``parser``."""
    grants = parser.add_argument_group("what the code may do (default: read nothing, write nowhere, no network)")
    grants.add_argument("--allow-read", action="append", default=[], metavar="PATH",
                        help="let the code read PATH (a file or a directory); repeat for more")
    grants.add_argument("--allow-write", action="append", default=[], metavar="PATH",
                        help="let the code read and write PATH; repeat for more")
    grants.add_argument("--allow-network", action="store_true", default=None,
                        help="let the code open TCP connections and bind ports")
    grants.add_argument("--allow-host", action="append", default=[], dest="allow_hosts", metavar="HOST[:PORT]",
                        help="let the code open TCP connections to HOST on PORT only (80 and 443 without one); "
                             "HOST is a name, an address or a CIDR network; repeat for more")
    for limit, what in _LIMITS:
        grants.add_argument(limit, help=what)
    grants.add_argument("--package", action="append", default=[], dest="packages", metavar="REQUIREMENT",
                        help="have the pool install REQUIREMENT (e.g. numpy or 'pandas>=2,<3') for the code to import; "
                             "the config names the index and allows the names ([pool] find_links or package_index, "
                             "[pool.limits] packages); repeat for more")
    grants.add_argument("--env", action="append", default=[], metavar="NAME[=VALUE]",
                        help="set a variable for the code; NAME alone passes this process's own value of NAME")
    grants.add_argument("--config", metavar="FILE", help="a pynox.toml: its [pool.limits] ceiling bounds every grant")
    grants.add_argument("--profile", help="a [profiles.NAME] of the config to start from; the flags add to it")


def _env(items: Sequence[str]) -> dict[str, str]:
    env: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not name:
            raise PynoxError(f"--env {item!r}: expected NAME=VALUE or NAME")
        if not sep:
            if name not in os.environ:
                raise PynoxError(f"--env {name}: this process has no variable {name} to pass on")
            value = os.environ[name]
        env[name] = value
    return env


def grants_from_arguments(args: argparse.Namespace) -> dict[str, Any]:
    """The grants the flags gave, as keyword arguments (``--config`` and ``--profile`` are not grants)."""
    grants: dict[str, Any] = {"allow_read": args.allow_read or None, "allow_write": args.allow_write or None,
                              "allow_network": args.allow_network, "allow_hosts": args.allow_hosts or None,
                              "timeout": args.timeout, "memory": args.memory,
                              "max_output": args.max_output, "max_file_size": args.max_file_size,
                              "env": _env(args.env) or None, "packages": args.packages or None}
    return {key: value for key, value in grants.items() if value is not None}


def grant_argv(grants: Mapping[str, Any], *, config: str | None = None, profile: str | None = None) -> list[str]:
    """``grants`` (and a config and profile) as the flags that give them, for a command line to record."""
    argv: list[str] = []
    for path in grants.get("allow_read", ()):
        argv += ["--allow-read", os.fspath(path)]
    for path in grants.get("allow_write", ()):
        argv += ["--allow-write", os.fspath(path)]
    if grants.get("allow_network"):
        argv.append("--allow-network")
    for host in grants.get("allow_hosts", ()):
        argv += ["--allow-host", host]
    for flag, _ in _LIMITS:
        value = grants.get(flag[2:].replace("-", "_"))
        if value is not None:
            argv += [flag, str(value)]
    for requirement in grants.get("packages", ()):
        argv += ["--package", requirement]
    for name, value in grants.get("env", {}).items():
        argv += ["--env", f"{name}={value}"]
    if config is not None:
        argv += ["--config", os.path.abspath(config)]
    if profile is not None:
        argv += ["--profile", profile]
    return argv
