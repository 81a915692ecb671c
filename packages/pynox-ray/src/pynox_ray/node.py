"""The actor that owns one node's ``pynox pool`` process and carries its JSON Lines, nothing more.

The caller's :class:`pynox.Pool` speaks the protocol; this actor is the pipe: :meth:`NodePool.send` writes the
caller's lines to the pool's stdin in the order the caller numbered them (an async actor may run two calls
out of order), and :meth:`NodePool.lines`, one streaming call for the pool's life, yields what the pool
writes, a batch of lines at a time. A host call is one line up and its reply one line down: one round trip.
The pool's stderr (its log) stays on the node, its tail kept for :meth:`NodePool.log_tail`.

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

    def __init__(self, options: PoolOptions, cwd: str) -> None:
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
        self._process: asyncio.subprocess.Process | None = None
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
        self._tasks.append(asyncio.ensure_future(self._read(self._process.stdout, self._out)))
        return first

    @staticmethod
    async def _read(stdout: asyncio.StreamReader, out: asyncio.Queue[bytes | None]) -> None:
        try:
            while line := await stdout.readline():
                out.put_nowait(line)
        except (ValueError, OSError):  # a line over the pool's own cap cannot come; a broken pipe ends it
            pass
        finally:
            out.put_nowait(None)

    async def _drain_stderr(self, stderr: asyncio.StreamReader) -> None:
        while raw := await stderr.readline():
            self._stderr.append(raw.decode("utf-8", "replace").rstrip("\n"))

    async def lines(self) -> AsyncIterator[list[bytes]]:
        """What the pool writes, each batch the lines there were when the caller's stream asked; ends with it."""
        out = self._out
        while True:
            line = await out.get()
            batch: list[bytes] = []
            while line is not None:
                batch.append(line)
                if out.empty():
                    break
                line = out.get_nowait()
            if batch:
                yield batch
            if line is None:
                return

    async def send(self, number: int, lines: list[bytes]) -> None:
        """Batch ``number`` of the caller's lines: written when every earlier batch has been."""
        self._early[number] = lines
        async with self._writing:
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
