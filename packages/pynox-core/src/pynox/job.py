"""A job as the template and the confined child see it, and the report the child writes back.

The server turns a protocol request (relative paths, units, profile, ceiling)
into a :class:`JobSpec`: absolute paths, seconds and bytes, nothing left to
interpret. The child answers with one :class:`Report` on its report descriptor.
"""

from __future__ import annotations

from typing import Literal

import msgspec

__all__ = ["ErrorInfo", "JobSpec", "Report", "StepSpec"]


class JobSpec(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    code: str | None
    script: str | None
    name: str
    args: list[str]
    cwd: str
    env: dict[str, str]
    allow_read: list[str]
    allow_write: list[str]
    network: bool
    timeout: float
    memory: int
    max_file_size: int | None
    package_dirs: list[str] = []
    functions: list[str] = []
    max_open_files: int = 1024
    uid: int | None = None
    gid: int | None = None
    # A session child serves steps on its control channel until it is closed.
    session: bool = False
    # How hints name a grant: keyword arguments ("api") or command-line flags ("cli").
    hint_style: Literal["api", "cli"] = "api"


class StepSpec(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One step of a session: only code and how to name it; permissions were fixed by the first request."""

    code: str
    name: str
    args: list[str]


class ErrorInfo(msgspec.Struct, omit_defaults=False):
    type: str
    message: str
    file: str | None = None
    line: int | None = None
    path: str | None = None
    hint: str | None = None


class Report(msgspec.Struct):
    """What the child says about its own end. ``setup_error`` means the code never ran."""

    exit: int
    error: ErrorInfo | None = None
    setup_error: str | None = None
    # The code called sys.exit(): in a session, the process ends with this step.
    exited: bool = False
