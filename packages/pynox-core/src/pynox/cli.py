"""The ``pynox`` command: ``pynox run``, ``pynox check`` and ``pynox pool``. The only module that prints."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

import msgspec

from .defaults import DEFAULT_WORKERS
from .errors import ConfigError, PynoxError, RequestError
from .protocol import Request, Result

__all__ = ["main"]

_USAGE_EXIT = 2


def _run_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    run = sub.add_parser("run", help="run one Python file or snippet under the kernel policy",
                         description="Run FILE (or -c CODE) confined; the exit status is the job's.")
    run.add_argument("-c", dest="code", metavar="CODE", help="run this code instead of a file")
    run.add_argument("file", nargs="?", metavar="FILE", help="a Python script (granted read-only to the job)")
    run.add_argument("args", nargs=argparse.REMAINDER, metavar="ARGS", help="arguments for the script")
    run.add_argument("--name", help="file name shown in tracebacks for -c code (default agent.py)")
    run.add_argument("--allow-read", action="append", default=[], metavar="PATH", help="grant read access")
    run.add_argument("--allow-write", action="append", default=[], metavar="PATH", help="grant read-write access")
    run.add_argument("--allow-network", action="store_true", default=None,
                     help="grant TCP and UDP (unix sockets stay refused)")
    run.add_argument("--allow-host", action="append", default=[], dest="allow_hosts", metavar="HOST[:PORT]",
                     help="grant TCP to HOST on PORT only (80 and 443 without one); HOST is a name, an address or "
                          "a CIDR network; repeat for more")
    run.add_argument("--timeout", help="wall-clock limit, e.g. 5s or 500ms (default 30s)")
    run.add_argument("--memory", help="memory limit, e.g. 256m or 1g (default 1g)")
    run.add_argument("--max-output", help="bytes of stdout and of stderr kept (default 1m)")
    run.add_argument("--max-file-size", help="largest file the job may write, e.g. 10m")
    run.add_argument("--env", action="append", default=[], metavar="K=V", help="set a variable for the job")
    run.add_argument("--package", action="append", default=[], dest="packages", metavar="REQUIREMENT",
                     help="install REQUIREMENT (e.g. numpy or 'pandas>=2,<3') for the job to import, from the index "
                          "--config names ([pool] find_links or package_index); repeat for more")
    run.add_argument("--json", action="store_true", help="print the protocol's result object instead")
    run.add_argument("--config", metavar="FILE",
                     help="a pynox.toml whose [permissions] grants apply, with the flags added on top")


def _request_from(args: argparse.Namespace) -> Request:
    env: dict[str, str] = {}
    for item in args.env:
        key, sep, value = item.partition("=")
        if not sep:
            raise RequestError(f"--env {item!r}: expected KEY=VALUE")
        env[key] = value
    if args.code is not None:
        # With -c, FILE (if any) is just the first argument, as with `python -c`.
        code, script, extra = args.code, None, ([args.file] if args.file else []) + args.args
    elif args.file is not None:
        code, script, extra = None, args.file, args.args
    else:
        raise RequestError("give a FILE to run or -c CODE")
    return Request(code=code, script=script, args=extra, name=args.name, allow_read=args.allow_read,
                   allow_write=args.allow_write, allow_network=args.allow_network,
                   allow_hosts=args.allow_hosts or None, env=env,
                   timeout=args.timeout, memory=args.memory, max_output=args.max_output,
                   max_file_size=args.max_file_size, packages=args.packages or None)


def _print_human(result: Result) -> None:
    sys.stdout.write(result.stdout)
    sys.stdout.flush()
    sys.stderr.write(result.stderr)
    for stream, truncated in (("stdout", result.stdout_truncated), ("stderr", result.stderr_truncated)):
        if truncated:
            print(f"pynox: {stream} was truncated at the output limit", file=sys.stderr)
    error = result.error
    if error is not None and (error.type in ("TimeoutError", "SignalError", "SandboxSetupError") or error.hint):
        where = f" ({error.file}:{error.line})" if error.file and error.line else ""
        print(f"pynox: {error.type}: {error.message}{where}", file=sys.stderr)
        if error.hint:
            print(f"hint: {error.hint}", file=sys.stderr)


def _cmd_run(args: argparse.Namespace) -> int:
    from .config import EMPTY, load_config, merged
    from .server.runner import run_once

    request = _request_from(args)
    config = load_config(args.config) if args.config else EMPTY
    if config.permissions is not None:
        request = merged(config.permissions, request)
    result = run_once(request, hint_style="cli", config=config)
    if args.json:
        sys.stdout.buffer.write(msgspec.json.encode(result) + b"\n")
    else:
        _print_human(result)
    return result.exit


def _cmd_check(args: argparse.Namespace) -> int:
    from .check import check_config, run_check

    if args.profile is not None and args.config is None:
        raise ConfigError("--profile needs --config FILE: the profile is one of that file's")
    if args.config is not None:
        lines = check_config(args.config, args.profile)
        if args.json:
            print(json.dumps({"config": os.path.abspath(args.config), "ok": True, "report": lines}, indent=2))
        else:
            print("\n".join(lines))
        return 0
    report = run_check()
    if args.json:
        print(json.dumps(report.as_dict(), indent=2))
    else:
        print(report.render())
    return 0 if report.ok else 1


def _cmd_health(args: argparse.Namespace) -> int:
    from .server.metrics import probe

    route = "/livez" if args.live else "/readyz"
    try:
        status, body = probe(args.socket, route, args.timeout)
    except OSError as exc:
        print(f"pynox health: {args.socket}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    print(body.strip() or f"HTTP {status}")
    return 0 if status == 200 else 1


def _health_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    health = sub.add_parser("health", help="ask a pool's metrics socket whether it serves (for probes)",
                            description="Exit 0 if the pool at SOCKET is ready (serving), 1 if it is starting, "
                                        "draining or does not answer.")
    health.add_argument("socket", metavar="SOCKET", help="the pool's --metrics-socket path")
    health.add_argument("--live", action="store_true",
                        help="only ask whether the pool process answers (a liveness probe), not whether it serves")
    health.add_argument("--timeout", type=float, default=2.0, metavar="SECONDS",
                        help="give up after this long (default 2)")


def _cmd_pool(args: argparse.Namespace) -> int:
    from .server.serve import serve

    return serve(args)


def _pool_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    pool = sub.add_parser("pool", help="serve jobs over JSON Lines on stdin/stdout",
                          description="Keep warm templates and run one confined child per request line.")
    pool.add_argument("--workers", type=int, help=f"concurrent jobs (default {DEFAULT_WORKERS})")
    pool.add_argument("--preload", help="comma-separated modules imported once in every template")
    pool.add_argument("--package-dir", action="append", dest="package_dirs", metavar="PATH",
                      help="a directory of packages readable and importable in every job")
    pool.add_argument("--config", help="a pynox.toml with [pool], [pool.limits] and [profiles.*]")
    pool.add_argument("--log", choices=("json", "none"),
                      help="every stderr line JSON: one per finished job, and the pool's own events")
    pool.add_argument("--log-redact", action="store_true", default=None,
                      help="job log lines leave out the error message (it may quote the job's data)")
    pool.add_argument("--drain-timeout", metavar="DURATION",
                      help="after SIGTERM or SIGINT, how long accepted jobs may run on before they are stopped "
                           "(default 25s)")
    pool.add_argument("--max-sessions", type=int, help="concurrent sessions (default 16)")
    pool.add_argument("--session-idle", help="close a session idle this long (default 10m)")
    pool.add_argument("--strict-session-reopen", action="store_true", default=None,
                      help="refuse a code-only step to a name whose session the pool ended, rather than open a "
                           "new session with the defaults (also [pool] strict_session_reopen)")
    pool.add_argument("--interrupt-grace", metavar="DURATION",
                      help="how long a cancelled session step may take to end after its KeyboardInterrupt "
                           "before its process is killed (default 1s; also [pool] interrupt_grace)")
    pool.add_argument("--landlock-abi", metavar="N",
                      help="use Landlock ABI N at most, as a kernel of that ABI would (default: the kernel's; "
                           "also [pool] landlock_abi or $PYNOX_LANDLOCK_ABI)")
    pool.add_argument("--listen", metavar="ADDRESS",
                      help='serve many clients on "unix:PATH", or on the socket systemd hands over ("systemd"), '
                           "instead of stdin/stdout (also [pool] listen)")
    pool.add_argument("--metrics-socket", metavar="PATH",
                      help="serve Prometheus metrics and health on a unix socket at PATH, mode 0600 (also [pool] "
                           "metrics_socket)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pynox", description="Run model-written Python under a Linux kernel policy.")
    parser.add_argument("--version", action="version", version=f"pynox {__import__('pynox').__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="{run,check,pool,health}")
    _run_parser(sub)
    check = sub.add_parser("check", help="report what this kernel enforces and prove it, or check a config file")
    check.add_argument("--json", action="store_true", help="machine-readable report")
    check.add_argument("--config", metavar="FILE",
                       help="validate this pynox.toml as `pynox pool --config` would start with it, without "
                            "serving (no kernel probes)")
    check.add_argument("--profile", metavar="NAME", help="with --config: also check that [profiles.NAME] is "
                                                        "there and fits under the ceiling")
    _pool_parser(sub)
    _health_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    commands = {"run": _cmd_run, "check": _cmd_check, "pool": _cmd_pool, "health": _cmd_health}
    try:
        return commands[args.command](args)
    except PynoxError as exc:
        print(f"pynox {args.command}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return _USAGE_EXIT if isinstance(exc, RequestError) else 1
    except KeyboardInterrupt:
        return 130


def entry() -> None:
    sys.exit(main())


if __name__ == "__main__":
    entry()
