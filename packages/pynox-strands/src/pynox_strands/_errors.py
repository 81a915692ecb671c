"""What ``PynoxSandbox`` raises, beside the stdlib and strands errors its interface names.

    NotImplementedError
    └── UnsupportedOperation   shell commands, other languages, a per-call cwd
    PermissionError
    └── DeniedPath             a file operation the sandbox refused, with the grant that would allow it
"""

from __future__ import annotations

__all__ = ["DeniedPath", "UnsupportedOperation"]


class UnsupportedOperation(NotImplementedError):
    """An operation strands' sandbox interface has and Pynox does not offer (shell commands)."""


class DeniedPath(PermissionError):
    """The sandbox refused to ``verb`` ``path`` (the path the caller gave), for ``reason``; ``hint`` is
    what the confined job's denial said: what is granted and which grant would allow it."""

    def __init__(self, path: str, verb: str, reason: str, hint: str | None) -> None:
        super().__init__(f"Cannot {verb} {path}: {reason}." + (f" Hint: {hint}" if hint else ""))
        self.path = path
        self.reason = reason
        self.hint = hint
