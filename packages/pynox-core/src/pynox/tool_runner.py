"""``ToolRunner``: what ``run_python`` does, for the framework adapters: the docstring and an awaitable call.

The docstring is :mod:`pynox.model_tool`'s, so every framework shows the model
the same words. A failure of the model's code is already text in ``Result``; a
``PynoxError`` (a refused request, a broken pool) becomes text here too,
because an exception would abort the agent's run instead of letting the model
read what happened. One home for what every adapter needs; the adapters only
translate it into their framework's tool objects.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Callable, Mapping
from typing import Any

from .client import Pool, Session, default_pool
from .errors import PynoxError
from .model_tool import effective_request, make_tool
from .resolve import DEFAULTS
from .result import Result
from .units import parse_duration

__all__ = ["ToolRunner"]

HostFunction = Callable[..., Any]


class ToolRunner:
    """One ``run_python`` tool: its grants, its docstring and, when asked for, its session.

    ``session``: ``False`` runs each call in a fresh process; ``True`` keeps one
    session that this runner owns (see :meth:`for_run` and :meth:`aclose`); a
    :class:`pynox.Session` is used as it is and stays the caller's to close.
    """

    def __init__(self, pool: Pool | None, *, profile: str | None, session: bool | Session,
                 functions: Mapping[str, HostFunction] | None, grants: Mapping[str, Any]) -> None:
        if isinstance(session, Session):
            if pool is not None or profile is not None or functions or grants:
                raise TypeError("a pynox.Session carries its own pool, permissions and functions: "
                                "pass it alone")
            pool = session.pool
            grants = dict(session.grants)
            profile = grants.pop("profile", None)
            functions = session.functions or None
        # The core builds the docstring and checks the grants now, so a bad grant fails here, not in a run.
        self.description: str = make_tool(pool, profile=profile, session=bool(session), functions=functions,
                                          grants=grants).__doc__ or ""
        effective = effective_request(pool, profile, grants)
        self.timeout: float = parse_duration(effective.timeout) if effective.timeout is not None \
            else DEFAULTS.timeout
        """The host's time limit per call, in seconds: a caller may ask for less, never more."""
        self._pool = pool
        self._functions = dict(functions) if functions else None
        self._grants = {**grants, **({"profile": profile} if profile else {})}
        self.owns_session = session is True
        self._session: Session | None = session if isinstance(session, Session) else None

    @property
    def uses_session(self) -> bool:
        return self.owns_session or self._session is not None

    def for_run(self) -> ToolRunner:
        """A runner with the same grants and, if it owns one, a session of its own not yet started."""
        fresh = copy.copy(self)
        if self.owns_session:
            fresh._session = None
        return fresh

    async def _target(self) -> Pool:
        if self._pool is None:
            # The default pool starts on first use; starting waits for its templates, so not on the loop.
            self._pool = await asyncio.to_thread(default_pool)
        return self._pool

    async def result(self, code: str, *, timeout: float | None = None, env: Mapping[str, str] | None = None,
                     fresh: bool = False) -> Result:
        """Run ``code`` (in the session, unless ``fresh``); raises :class:`pynox.PynoxError` only for
        Pynox's own failures. ``timeout`` may only shorten the host's; ``env`` adds to the host's."""
        pool = await self._target()
        seconds = min(timeout, self.timeout) if timeout is not None else None
        if not fresh and self.owns_session and self._session is None:
            self._session = pool.session(functions=self._functions, **self._grants)
        if not fresh and self._session is not None:
            if env:
                raise ValueError("a session's environment is fixed when it starts: env cannot change per call")
            return await self._session.arun(code, timeout=seconds)
        grants = dict(self._grants)
        if env:
            grants["env"] = {**(grants.get("env") or {}), **env}
        if seconds is not None:
            grants["timeout"] = seconds
        return await pool.arun(code, functions=None if fresh else self._functions, **grants)

    async def text(self, code: str) -> str:
        """What the model reads: the run's text, or what went wrong in Pynox itself."""
        if not isinstance(code, str):
            return f"Error: code must be a string of Python source, got {type(code).__name__}."
        try:
            return (await self.result(code)).text
        except PynoxError as exc:
            return f"{type(exc).__name__}: {exc}"

    def close(self) -> None:
        """End the session this runner owns, if one was started. A caller's session is left alone."""
        if not self.owns_session or self._session is None:
            return
        session, self._session = self._session, None
        session.close()

    async def aclose(self) -> None:
        """:meth:`close`, without holding up the event loop while the pool confirms."""
        await asyncio.to_thread(self.close)
