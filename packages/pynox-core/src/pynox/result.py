"""``Result``: what happened to one run of the model's code, as a value.

A job that raised, timed out or hit a limit is not an exception in the host:
it is a ``Result`` whose ``text`` tells the model what went wrong and what it
may do about it. :meth:`Result.raise_for_error` turns it into an exception for
callers that prefer one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec

from .errors import JobError
from .exits import REFUSED_EXIT, TIMEOUT_EXIT
from .protocol import Result as WireResult
from .protocol import SessionResult, Usage

__all__ = ["Result", "Usage"]


@dataclass(frozen=True)
class Result:
    """One run's outcome. ``error`` is ``None`` or a dict with type, message, file, line, path and hint."""

    exit: int
    stdout: str = ""
    stderr: str = ""
    error: dict[str, Any] | None = None
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    duration_ms: int = 0
    duration_us: int = 0
    queue_us: int = 0
    policy: dict[str, Any] = field(default_factory=dict)
    runtime: dict[str, Any] = field(default_factory=dict)
    session: str | None = None
    step: int | None = None
    session_ended: bool = False
    id: str | int | float | None = None
    # What the job's process used (cpu_ms, max_rss_kb, host_calls, stdout_bytes, stderr_bytes); None from
    # a pool too old to say.
    usage: Usage | None = None

    @classmethod
    def from_wire(cls, wire: WireResult) -> Result:
        """Build from a result line the client decoded."""
        session = wire if isinstance(wire, SessionResult) else None
        return cls(
            exit=wire.exit, stdout=wire.stdout, stderr=wire.stderr,
            error=msgspec.structs.asdict(wire.error) if wire.error is not None else None,
            stdout_truncated=wire.stdout_truncated, stderr_truncated=wire.stderr_truncated,
            duration_ms=wire.duration_ms, duration_us=wire.duration_us, queue_us=wire.queue_us,
            policy=msgspec.structs.asdict(wire.policy) if wire.policy is not None else {},
            runtime=msgspec.structs.asdict(wire.runtime) if wire.runtime is not None else {},
            session=session.session if session else None, step=session.step if session else None,
            session_ended=session.session_ended if session else False, id=wire.id, usage=wire.usage,
        )

    @property
    def ok(self) -> bool:
        """The code ran to the end: exit status 0 and no error."""
        return self.exit == 0 and self.error is None

    @property
    def refused(self) -> bool:
        """The pool refused the request before anything ran (the client raises RequestError for it)."""
        return self.exit == REFUSED_EXIT and self.error is not None and self.error.get("type") == "RequestError"

    @property
    def timed_out(self) -> bool:
        """The pool killed the code at its timeout."""
        return self.exit == TIMEOUT_EXIT and self.error is not None and self.error.get("type") == "TimeoutError"

    @property
    def truncated(self) -> bool:
        return self.stdout_truncated or self.stderr_truncated

    @property
    def text(self) -> str:
        """What a model should read: the output, then the error with its hint, then a note on truncation."""
        if not self.stdout:
            return self.error_text or "(The code ran without printing anything. Use print() to show results.)"
        return "\n".join(part for part in (self.stdout.rstrip("\n"), self.error_text) if part)

    @property
    def error_text(self) -> str:
        """``text`` without the output: what went wrong and the notes, or ``""`` for a clean run."""
        parts: list[str] = []
        error = self.error
        if error is not None:
            where = f" ({error['file']}:{error['line']})" if error.get("file") and error.get("line") else ""
            message = f": {error['message']}" if error.get("message") else ""
            parts.append(f"{error['type']}{message}{where}")
            if error.get("hint"):
                parts.append(f"Hint: {error['hint']}")
        elif self.exit != 0:
            last = self.stderr.strip().splitlines()[-1:] if self.stderr.strip() else []
            parts.append(f"The code exited with status {self.exit}." + (f" {last[0]}" if last else ""))
        if self.truncated:
            limit = self.policy.get("max_output")
            size = f" at {limit} bytes" if limit else ""
            parts.append(f"[Output was truncated{size}: print a summary instead of everything.]")
        if self.session_ended and self.session is not None:
            parts.append("[The session ended with this call: the next call starts a fresh process, and "
                         "variables, imports and functions defined so far are gone.]")
        return "\n".join(parts)

    def raise_for_error(self) -> Result:
        """Raise :class:`pynox.JobError` if the run did not succeed; return ``self`` otherwise."""
        if not self.ok:
            raise JobError(self.text, result=self)
        return self
