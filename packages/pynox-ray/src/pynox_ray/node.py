"""The actor that owns one node's ``pynox pool`` process and carries its JSON Lines, nothing more.

The caller's :class:`pynox.Pool` speaks the protocol; this actor is the pipe. Ray places it and calls its few
methods (start, attach, close, and the few below); the protocol's lines themselves travel on one TCP connection
between the caller and the actor, the caller's lines down to the pool's stdin and the pool's lines up, in order,
as they would on a local pool's pipes. A Ray call per line cost more CPU than the job it carried (``print(1)``:
2.3 ms in the actor and 1.9 ms in the caller, against 1.7 ms in the pool); with the socket, 0.25 ms and 0.45 ms
(docs/scale-out.md, Figures). A host call is one line up and its reply one line down: one round trip.

The connection is the caller's alone: :meth:`NodePool.attach` (a Ray call, so only a Ray client of the cluster
can make it) returns the address and a fresh random token, and the listener takes exactly one connection that
presents that token first; any other is closed unread. Jobs on the node cannot connect without the network
grant, and with it they still lack the token. The pool's stderr (its log) stays on the node, its tail kept for
:meth:`NodePool.log_tail`.

One caller holds the pipe at a time. A named pool's actors are detached and outlive their caller: a new
caller's :meth:`NodePool.attach` starts a new epoch, and the connection of the caller before is closed after
an empty line (which no pool output ever is), so a caller still holding it learns it was taken over rather
than that the pool died. What the pool writes while nobody holds the pipe has nobody to go to, and is dropped.

The actor also exports its pool's counters and gauges through Ray's metrics (``metrics.py``): every
``_METRICS_EVERY`` seconds it asks its pool for a stats event, under a request id of its own whose answer it
keeps (it never reaches the caller), and it records every other stats event that passes up the pipe too (a
caller's ``RayPool.stats()``). Intake answers a stats line at once, whatever waits in its queue.

The actor runs an event loop (its methods are ``async``): the connection, the pool's output and its calls
interleave on it.
"""

from __future__ import annotations

import asyncio
import collections
import hmac
import os
import secrets
from typing import Any

import msgspec
import ray

import pynox
from pynox.transport import StatsEvent, decode_answer, pool_argv

from .metrics import NodeMetrics

__all__ = ["LET_GO", "NodePool", "PoolOptions"]

PoolOptions = dict[str, Any]  # the pool's options (pynox.Pool's keywords), as the caller gave them
LET_GO = b"\n"  # the last line a caller's connection gets when another caller took the pipe over
_STDERR_LINES = 50
_ABI_VARIABLE = "PYNOX_LANDLOCK_ABI"  # the operator's Landlock ABI cap, which the node's pool reads
_LINE_LIMIT = 4 << 20  # above the pool's own 1 MiB request line and its capped answers
_HELLO_TIMEOUT = 30.0  # seconds for a connection to present its token
_METRICS_EVERY = 5.0  # seconds between the stats events exported to Ray's metrics (Ray reports every 10 s)
_STATS_MARK = b'"event":"stats"'  # in every stats event's line; a line that has it otherwise is decoded to tell


class NodePool:
    """One node's pool. ``options`` are ``pynox.Pool``'s keywords; ``cwd`` is where relative grants and the
    config path resolve on this node (the caller's working directory, by default)."""

    def __init__(self, options: PoolOptions, cwd: str, record: dict[str, Any] | None = None) -> None:
        # An operator who sets PYNOX_CONFIG in a node's environment fixes that node's config: its
        # [pool.limits] ceiling is then one no caller can swap for a file of its own.
        operator = os.environ.get("PYNOX_CONFIG")
        if operator:
            asked = options.get("config")
            if asked is not None and os.path.abspath(asked) != os.path.abspath(operator):
                raise pynox.ConfigError(f"this node's config is fixed by its operator (PYNOX_CONFIG={operator}); "
                                        f"a RayPool may not name another ({asked})")
            options = {**options, "config": operator}
        self._options = options
        self._cwd = cwd
        self._record = record  # a named fleet's plan, as its creator made it, for a caller that attaches
        self._process: asyncio.subprocess.Process | None = None
        self._first = b""  # the pool's ready event, for a caller that attaches
        self._abi_cap: int | None = None
        self._epoch = 0  # the caller holding the pipe: bumped by each attach
        self._token = b""  # what the next connection must present: set by attach, spent by that connection
        self._server: asyncio.Server | None = None
        self._holder: asyncio.StreamWriter | None = None  # the connection of the caller that holds the pipe
        self._stderr: collections.deque[str] = collections.deque(maxlen=_STDERR_LINES)
        self._tasks: list[asyncio.Future[None]] = []  # its readers of the pool's output, held while they run
        self._ended = asyncio.Event()  # set when its pool is closed for good (not for a restart at an ABI cap)
        # Its own stats requests' ids: random, so no caller's request id is one of them.
        self._stats_prefix = f"pynox-ray-metrics-{secrets.token_hex(8)}-"
        self._metrics: NodeMetrics | None = None

    def node_id(self) -> str:
        return str(ray.get_runtime_context().get_node_id())

    async def start(self, abi_cap: int | None = None) -> bytes:
        """Start the node's pool (at most Landlock ABI ``abi_cap``, if given) and return its first line: its
        ready event, or why it could not start."""
        env = dict(os.environ)
        if abi_cap is not None:
            env[_ABI_VARIABLE] = str(abi_cap)
        self._abi_cap = abi_cap
        try:
            # The pool (and its templates) run in this directory: grants resolve on this node's tree.
            self._process = await asyncio.create_subprocess_exec(
                *pool_argv(**self._options), stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, cwd=self._cwd, env=env, limit=_LINE_LIMIT)
        except OSError as exc:
            raise pynox.PoolError(f"cannot start the pool on node {self.node_id()} in {self._cwd!r}: "
                                  f"{exc.strerror or exc}") from None
        assert self._process.stdout is not None and self._process.stderr is not None
        first = await self._process.stdout.readline()
        self._tasks = [asyncio.ensure_future(self._drain_stderr(self._process.stderr))]
        if not first:
            await self._process.wait()
            tail = " | ".join(list(self._stderr)[-5:])
            raise pynox.PoolError(f"the pool on node {self.node_id()} exited before it was ready: exit status "
                                  f"{self._process.returncode}" + (f"; it said: {tail}" if tail else ""))
        self._first = first
        if self._metrics is None:
            context = ray.get_runtime_context()
            self._metrics = NodeMetrics(self.node_id(), str(context.get_actor_name() or context.get_actor_id()))
        self._metrics.restart()
        self._tasks.append(asyncio.ensure_future(self._read(self._process, self._process.stdout)))
        self._tasks.append(asyncio.ensure_future(self._ask_stats(self._process)))
        if self._server is None:
            host = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]  # Ray leaves it unannotated
            self._server = await asyncio.start_server(self._serve_caller, host=host, port=0, limit=_LINE_LIMIT)
        return first

    async def _read(self, process: asyncio.subprocess.Process, stdout: asyncio.StreamReader) -> None:
        """The pool's lines, up the connection of whoever holds the pipe; when the pool ends, that connection."""
        try:
            while line := await stdout.readline():
                if _STATS_MARK in line and self._exported(line):
                    continue  # the actor's own stats request: answered to it, not to the caller
                holder = self._holder
                if holder is None or holder.is_closing():
                    continue  # nobody holds the pipe: the answer has nobody to go to
                holder.write(line)
                try:
                    await holder.drain()
                except (ConnectionError, OSError):
                    pass  # that caller is gone; the next may attach
        except (ValueError, OSError):  # a line over the pool's own cap cannot come; a broken pipe ends it
            pass
        finally:
            if self._process is process or self._process is None:  # not a pool stopped for a restart
                self._hang_up(None)

    def _exported(self, line: bytes) -> bool:
        """Record a stats event in Ray's metrics; True if it answers the actor's own request."""
        try:
            message = decode_answer(line)
        except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
            return False  # the caller's to judge
        if not isinstance(message, StatsEvent):
            return False
        if self._metrics is not None:
            self._metrics.record(msgspec.to_builtins(message))
        return isinstance(message.id, str) and message.id.startswith(self._stats_prefix)

    async def _ask_stats(self, process: asyncio.subprocess.Process) -> None:
        """Ask the pool for its stats every ``_METRICS_EVERY`` seconds while it runs and reads its input."""
        asked = 0
        while process is self._process and process.returncode is None:
            stdin = process.stdin
            if stdin is None or stdin.is_closing():
                return
            asked += 1
            try:
                stdin.write(msgspec.json.encode({"id": f"{self._stats_prefix}{asked}", "stats": True}) + b"\n")
                await stdin.drain()
            except (ConnectionError, OSError):
                return  # the pool is gone or no longer reads
            await asyncio.sleep(_METRICS_EVERY)

    def _hang_up(self, last: bytes | None) -> None:
        holder, self._holder = self._holder, None
        if holder is not None:
            if last is not None:
                holder.write(last)
            holder.close()

    async def _serve_caller(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """A connection: the token of the last attach first, else closed unread; then the caller's lines, written
        to the pool's stdin in the order they came, until either side ends."""
        try:
            token = await asyncio.wait_for(reader.readline(), _HELLO_TIMEOUT)
        except (TimeoutError, ValueError, ConnectionError, OSError):
            writer.close()
            return
        expected, process = self._token, self._process
        if not expected or not hmac.compare_digest(token.rstrip(b"\n"), expected) or process is None:
            writer.close()
            return
        self._token = b""  # one connection per attach
        self._hang_up(LET_GO)
        self._holder = writer
        try:
            while line := await reader.readline():
                if process.stdin is None or process is not self._process or self._holder is not writer:
                    break
                process.stdin.write(line)
                await process.stdin.drain()
        except (ValueError, ConnectionError, OSError):
            pass  # a line over the limit (the caller broke the protocol), a broken connection or a closed pool
        finally:
            if self._holder is writer:
                self._holder = None
            writer.close()

    async def _drain_stderr(self, stderr: asyncio.StreamReader) -> None:
        while raw := await stderr.readline():
            self._stderr.append(raw.decode("utf-8", "replace").rstrip("\n"))

    async def attach(self) -> tuple[int, bytes, int | None, dict[str, Any] | None, tuple[str, int], bytes]:
        """A caller takes the pipe: its epoch, the pool's ready event, its ABI cap, the fleet's plan, and the
        address and token of its connection. The caller holding it before is let go (see the module doc)."""
        if self._process is None or self._process.returncode is not None or self._server is None:
            raise pynox.PoolError(f"the pool on node {self.node_id()} is not running")
        self._epoch += 1
        self._token = secrets.token_hex(32).encode()
        self._hang_up(LET_GO)
        host, port = self._server.sockets[0].getsockname()[:2]
        return self._epoch, self._first, self._abi_cap, self._record, (str(host), int(port)), self._token

    async def record(self) -> dict[str, Any] | None:
        """The plan of the named fleet this pool belongs to, as its creator made it (None: not named)."""
        return self._record

    async def until_ended(self, epoch: int) -> None:
        """Returns when the pool is closed or another caller holds the pipe; raises in the caller (RayActorError)
        if the actor dies first, which is how a caller learns of a death its connection cannot show (a node
        cut off the network sends no end of file)."""
        while not self._ended.is_set() and epoch == self._epoch:
            try:
                await asyncio.wait_for(self._ended.wait(), 5.0)
            except TimeoutError:
                pass

    async def log_tail(self) -> list[str]:
        """The last lines the node's pool wrote to stderr (its log)."""
        return list(self._stderr)

    async def close(self, timeout: float, restart: bool = False) -> None:
        """EOF: the pool drains what it accepted and exits; killed past ``timeout``. ``restart``: another start
        follows (the fleet's ABI cap), so a caller's :meth:`until_ended` goes on."""
        if not restart:
            self._ended.set()
        process, self._process = self._process, None
        if process is None:
            return
        if process.stdin is not None:
            process.stdin.close()
        try:
            await asyncio.wait_for(process.wait(), timeout)
        except TimeoutError:
            process.kill()
            await process.wait()
