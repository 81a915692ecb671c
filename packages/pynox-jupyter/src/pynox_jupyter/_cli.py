"""The kernel's command line: ``python -m pynox_jupyter -f CONNECTION_FILE [grants]`` runs the kernel (a
kernelspec's ``argv``); ``pynox-jupyter install [grants]`` writes a kernelspec that runs it with those grants.

The grants are the operator's: they are fixed in the kernelspec (or in a profile of ``--config``), and
a notebook has no way to change them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Sequence

from pynox import PynoxError, __version__, add_grant_arguments, grant_argv, grants_from_arguments

__all__ = ["install_kernelspec", "kernel_main", "main"]

KERNEL_NAME = "pynox"


def _pool_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--preload", default="", metavar="MODULES",
                        help="comma-separated modules imported once in the session's warm template (e.g. "
                             "IPython,pandas: a kernel's first cell then starts faster)")


def kernel_main(argv: Sequence[str] | None = None) -> int:
    """Run the kernel: our flags are read here, the rest (``-f CONNECTION_FILE``...) is ipykernel's."""
    parser = argparse.ArgumentParser(prog="python -m pynox_jupyter", add_help=False)
    add_grant_arguments(parser)
    _pool_arguments(parser)
    args, rest = parser.parse_known_args(argv)
    try:
        grants = grants_from_arguments(args)
    except PynoxError as exc:
        print(f"pynox-jupyter: {exc}", file=sys.stderr)
        return 2
    if args.profile is not None:
        grants["profile"] = args.profile
    from ipykernel.kernelapp import IPKernelApp

    from ._kernel import KernelSettings, PynoxKernel

    PynoxKernel.settings = KernelSettings(grants=grants, config=args.config,
                                          preload=[name for name in args.preload.split(",") if name])
    IPKernelApp.launch_instance(argv=rest, kernel_class=PynoxKernel)
    return 0


def install_kernelspec(grants: dict[str, object], *, name: str = KERNEL_NAME, display_name: str | None = None,
                       user: bool = False, prefix: str | None = None, config: str | None = None,
                       profile: str | None = None, preload: Sequence[str] = ()) -> str:
    """Write a kernelspec that runs this kernel with ``grants``; where it went."""
    from jupyter_client.kernelspec import KernelSpecManager

    argv = [sys.executable, "-m", "pynox_jupyter", "-f", "{connection_file}",
            *grant_argv(grants, config=config, profile=profile)]
    if preload:
        argv.append("--preload=" + ",".join(preload))
    spec = {"argv": argv, "display_name": display_name or "Python (Pynox sandbox)", "language": "python",
            # A signal would go to the kernel's process group, which holds its pool: an interrupt is a message.
            "interrupt_mode": "message", "metadata": {"debugger": False}}
    with tempfile.TemporaryDirectory() as staging:
        with open(os.path.join(staging, "kernel.json"), "w") as file:
            json.dump(spec, file, indent=1)
        return KernelSpecManager().install_kernel_spec(staging, name, user=user, prefix=prefix)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pynox-jupyter", description="The Pynox Jupyter kernel.")
    parser.add_argument("--version", action="version", version=f"pynox-jupyter {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    install = commands.add_parser("install", help="write a kernelspec that runs the kernel with these grants",
                                  description="Write a kernelspec (by default for this environment, as the "
                                              "package's own one) whose kernel runs every cell with these grants.")
    install.add_argument("--name", default=KERNEL_NAME, help=f"the kernel's name (default {KERNEL_NAME})")
    install.add_argument("--display-name", help="what notebook interfaces show")
    where = install.add_mutually_exclusive_group()
    where.add_argument("--user", action="store_true", help="for this user (~/.local/share/jupyter)")
    where.add_argument("--sys-prefix", action="store_true", help="for this environment (the default)")
    where.add_argument("--prefix", help="under this prefix")
    add_grant_arguments(install)
    _pool_arguments(install)
    args = parser.parse_args(argv)
    try:
        grants = grants_from_arguments(args)
    except PynoxError as exc:
        print(f"pynox-jupyter: {exc}", file=sys.stderr)
        return 2
    prefix = args.prefix if args.prefix is not None else (None if args.user else sys.prefix)
    where_to = install_kernelspec(grants, name=args.name, display_name=args.display_name, user=args.user,
                                  prefix=prefix, config=args.config, profile=args.profile,
                                  preload=[name for name in args.preload.split(",") if name])
    print(f"installed kernelspec {args.name} in {where_to}")
    return 0
