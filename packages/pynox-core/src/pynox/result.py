"""``Result``: what happened to one run of the model's code, as a value.

A job that raised, timed out or hit a limit is not an exception in the host:
it is a ``Result`` whose ``text`` tells the model what went wrong and what it
may do about it. :meth:`Result.raise_for_error` turns it into an exception for
callers that prefer one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .errors import JobError

__all__ = ["Result"]


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

    @classmethod
    def from_message(cls, message: dict[str, Any]) -> Result:
        """Build from a pool result line (already decoded)."""
        known = {name: message[name] for name in cls.__dataclass_fields__ if name in message}
        known["policy"] = known.get("policy") or {}
        known["runtime"] = known.get("runtime") or {}
        return cls(**known)

    @property
    def ok(self) -> bool:
        """The code ran to the end: exit status 0 and no error."""
        return self.exit == 0 and self.error is None

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
