"""The actor that owns one node's ``pynox pool``: a local :class:`pynox.Pool`, started on the node's first job.

Every run arrives as a :class:`~pynox_ray.messages.Work` through :meth:`NodePool.job`, a streaming generator:
the node's pool runs it with a stand-in for each host function, which sends a
:class:`~pynox_ray.messages.HostCall` down the stream and waits for :meth:`NodePool.reply`, so the function
itself runs in the caller's process, as it would for a local pool. The pool's own rules (the 1,000 calls,
the 1 MB, the eight calls at once, a call left unanswered when its job ends) apply on the node unchanged.

The actor runs an event loop (its methods are ``async``): runs, replies and cancels interleave on it.
"""

from __future__ import annotations

import asyncio
import itertools
import os
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

import ray

import pynox
from pynox import HostError

from .messages import Finished, HostCall, Message, Raised, Work

__all__ = ["NodePool", "PoolOptions"]

PoolOptions = dict[str, Any]  # pynox.Pool's keywords, as the caller gave them


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
        self._pool: pynox.Pool | None = None
        self._starting = asyncio.Lock()
        self._replies: dict[tuple[str, int], asyncio.Future[dict[str, Any]]] = {}
        self._seq = itertools.count(1)
        self._runs: dict[str, asyncio.Task[pynox.Result]] = {}
        self._sessions: dict[str, pynox.Session] = {}

    async def _started(self) -> pynox.Pool:
        async with self._starting:
            if self._pool is None:
                # The pool (and its templates) inherit this directory: grants resolve on this node's tree.
                try:
                    os.chdir(self._cwd)
                except OSError as exc:
                    raise pynox.ConfigError(f"cwd {self._cwd!r} cannot be entered on node {self.node_id()}: "
                                            f"{exc.strerror}") from None
                # Starting waits for the templates: off the loop, so replies to other runs keep flowing.
                self._pool = await asyncio.to_thread(pynox.Pool, **self._options)
            return self._pool

    def node_id(self) -> str:
        return str(ray.get_runtime_context().get_node_id())

    async def ready(self) -> dict[str, Any] | None:
        """The node pool's ready event, or None if no job has started it yet."""
        return dict(self._pool.ready) if self._pool is not None else None

    async def stats(self) -> dict[str, Any] | None:
        """The node pool's counters, or None if no job has started it yet."""
        if self._pool is None:
            return None
        return await asyncio.to_thread(self._pool.stats)

    def _stand_in(self, key: str, name: str, stream: asyncio.Queue[Message]) -> Callable[..., Coroutine[Any, Any, Any]]:
        """What the node's pool calls for host function ``name`` of run ``key``: it asks the caller."""

        async def ask_the_caller(*args: Any, **kwargs: Any) -> Any:
            seq = next(self._seq)
            answer: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
            self._replies[key, seq] = answer
            try:
                stream.put_nowait(HostCall(seq=seq, function=name, args=list(args), kwargs=dict(kwargs)))
                reply = await answer
            finally:
                self._replies.pop((key, seq), None)
            if "error" in reply:
                # The caller's answer_call already chose the text the job may see; HostError passes it on as it is.
                raise HostError(reply["error"])
            return reply["result"]

        return ask_the_caller

    async def _run(self, work: Work, stream: asyncio.Queue[Message]) -> pynox.Result:
        pool = await self._started()
        stand_ins = {name: self._stand_in(work.key, name, stream) for name in work.functions}
        if work.session is None:
            return await pool.arun(work.code, functions=stand_ins, host_errors=work.host_errors,  # type: ignore[arg-type]
                                   return_value=work.return_value, **work.grants)
        session = self._sessions.get(work.session)
        if session is None:
            session = pool.session(functions=stand_ins, host_errors=work.host_errors,  # type: ignore[arg-type]
                                   **work.grants)
            self._sessions[work.session] = session
        assert work.code is not None
        return await session.arun(work.code, functions=stand_ins, return_value=work.return_value, **work.step)

    async def job(self, work: Work) -> AsyncIterator[Message]:
        """Run ``work``; stream its host calls, then its one outcome."""
        stream: asyncio.Queue[Message] = asyncio.Queue()
        run = asyncio.ensure_future(self._run(work, stream))
        self._runs[work.key] = run
        try:
            while True:
                waiting = asyncio.ensure_future(stream.get())
                await asyncio.wait({waiting, run}, return_when=asyncio.FIRST_COMPLETED)
                if waiting.done():
                    yield waiting.result()
                    continue
                waiting.cancel()
                break
            # Calls still queued belong to a job that has ended: the caller must not start them.
            try:
                yield Finished(run.result())
            except asyncio.CancelledError:
                return  # the caller cancelled it and is no longer listening
            except Exception as exc:
                yield Raised(exc)
        finally:
            self._runs.pop(work.key, None)
            if not run.done():
                run.cancel()  # the caller stopped listening (its task was cancelled): so does the pool

    async def reply(self, key: str, seq: int, answer: dict[str, Any]) -> None:
        """The caller's answer to call ``seq`` of run ``key`` (``{"result": ...}`` or ``{"error": ...}``)."""
        waiting = self._replies.get((key, seq))
        if waiting is not None and not waiting.done():
            waiting.set_result(answer)

    async def cancel(self, key: str) -> None:
        """The caller gave up on run ``key``: the node's pool kills the job (a session step ends its session)."""
        run = self._runs.get(key)
        if run is not None:
            run.cancel()

    async def close_session(self, session: str) -> None:
        found = self._sessions.pop(session, None)
        if found is not None:
            await asyncio.to_thread(found.close)

    async def close(self, timeout: float) -> None:
        """Let runs in flight finish, then stop the node's pool."""
        pool, self._pool = self._pool, None
        self._sessions.clear()
        if pool is not None:
            await asyncio.to_thread(pool.close, timeout)
