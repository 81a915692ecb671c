"""The actor that owns one node's ``pynox pool`` process and carries its JSON Lines, nothing more.

The caller's :class:`pynox.Pool` speaks the protocol; this actor is the pipe: :meth:`NodePool.send` writes the
caller's lines to the pool's stdin in the order the caller numbered them (an async actor may run two calls
out of order), and :meth:`NodePool.lines`, one streaming call for the caller's hold on the pool, yields what
the pool writes, a batch of lines at a time. A host call is one line up and its reply one line down: one
round trip. The pool's stderr (its log) stays on the node, its tail kept for :meth:`NodePool.log_tail`.

One caller holds the pipe at a time. A named pool's actors are detached and outlive their caller: a new
caller takes the pipe over with :meth:`NodePool.attach`, which starts a new epoch. Lines of an older epoch
are dropped, and its stream ends with an empty batch (which no pool output ever is), so a caller still
holding it learns it was taken over rather than that the pool died.

The actor runs an event loop (its methods are ``async``): sends, the stream and stats interleave on it.
"""

from __future__ import annotations

import asyncio
import collections
import os
from collections.abc import AsyncIterator
from typing import Any

import ray

import pynox
from pynox.transport import pool_argv

__all__ = ["NodePool", "PoolOptions"]

PoolOptions = dict[str, Any]  # the pool's options (pynox.Pool's keywords), as the caller gave them
_STDERR_LINES = 50
_ABI_VARIABLE = "PYNOX_LANDLOCK_ABI"  # the operator's Landlock ABI cap, which the node's pool reads


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
        self._out: asyncio.Queue[bytes | None] = asyncio.Queue()
        self._next = 0  # the number of the caller's next batch of lines
        self._early: dict[int, list[bytes]] = {}  # batches that came before their turn
        self._stderr: collections.deque[str] = collections.deque(maxlen=_STDERR_LINES)
        self._writing = asyncio.Lock()
        self._tasks: list[asyncio.Future[None]] = []  # its readers of the pool's output, held while they run

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
                stderr=asyncio.subprocess.PIPE, cwd=self._cwd, env=env, limit=4 << 20)
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
        # A queue of this process's own: a pool stopped before (a restart at the fleet's ABI cap) ends its own.
        self._out = asyncio.Queue()
        self._first = first
        self._tasks.append(asyncio.ensure_future(self._read(self._process, self._process.stdout)))
        return first

    async def _read(self, process: asyncio.subprocess.Process, stdout: asyncio.StreamReader) -> None:
        try:
            while line := await stdout.readline():
                self._out.put_nowait(line)  # the queue of whoever holds the pipe now
        except (ValueError, OSError):  # a line over the pool's own cap cannot come; a broken pipe ends it
            pass
        finally:
            if self._process is process or self._process is None:  # not a pool stopped for a restart
                self._out.put_nowait(None)

    async def attach(self) -> tuple[int, bytes, int | None, dict[str, Any] | None]:
        """A new caller takes the pipe: its epoch, the pool's ready event, its ABI cap and the fleet's plan.

        The stream of the caller before ends (with an empty batch: taken over), and what the pool wrote for it
        and nobody read is dropped: its runs were that caller's, and their answers have nobody to go to."""
        if self._process is None or self._process.returncode is not None:
            raise pynox.PoolError(f"the pool on node {self.node_id()} is not running")
        async with self._writing:
            self._epoch += 1
            self._next = 0
            self._early = {}
            old, self._out = self._out, asyncio.Queue()
            old.put_nowait(b"")  # the old stream's end: taken over
        return self._epoch, self._first, self._abi_cap, self._record

    async def release(self, epoch: int) -> None:
        """The caller of ``epoch`` lets go (a named pool's caller that closes): its stream ends, the pool serves on."""
        if epoch == self._epoch:
            self._out.put_nowait(b"")

    async def _drain_stderr(self, stderr: asyncio.StreamReader) -> None:
        while raw := await stderr.readline():
            self._stderr.append(raw.decode("utf-8", "replace").rstrip("\n"))

    async def lines(self) -> AsyncIterator[list[bytes]]:
        """What the pool writes, each batch the lines there were when the caller's stream asked; ends with the
        pool, or with an empty batch when another caller took the pipe (or this one let it go)."""
        out = self._out
        while True:
            line = await out.get()
            batch: list[bytes] = []
            while line:
                batch.append(line)
                if out.empty():
                    break
                line = out.get_nowait()
            if batch:
                yield batch
            if line == b"":
                yield []
                return
            if line is None:
                return

    async def send(self, number: int, lines: list[bytes], epoch: int = 0) -> None:
        """Batch ``number`` of the caller's lines: written when every earlier batch has been. A batch of a
        caller that no longer holds the pipe (``epoch``) is dropped."""
        if epoch != self._epoch:
            return
        self._early[number] = lines
        async with self._writing:
            if epoch != self._epoch:
                return
            process = self._process
            if process is None or process.stdin is None:
                return  # not started or closed: the caller answers for what it sent here
            while self._next in self._early:
                batch = self._early.pop(self._next)
                self._next += 1
                try:
                    process.stdin.write(b"".join(batch))
                    await process.stdin.drain()
                except (ConnectionError, OSError):
                    return  # the pool is gone: its stream ends, and the caller answers for its runs

    async def record(self) -> dict[str, Any] | None:
        """The plan of the named fleet this pool belongs to, as its creator made it (None: not named)."""
        return self._record

    async def log_tail(self) -> list[str]:
        """The last lines the node's pool wrote to stderr (its log)."""
        return list(self._stderr)

    async def close(self, timeout: float) -> None:
        """EOF: the pool drains what it accepted and exits; killed past ``timeout``."""
        process, self._process = self._process, None
        if process is None:
            return
        async with self._writing:
            if process.stdin is not None:
                process.stdin.close()
        try:
            await asyncio.wait_for(process.wait(), timeout)
        except TimeoutError:
            process.kill()
            await process.wait()
