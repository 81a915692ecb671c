"""A job as the template and the confined child see it, and the report the child writes back.

The server turns a protocol request (relative paths, units, profile, ceiling)
into a :class:`JobSpec`: absolute paths, seconds and bytes, nothing left to
interpret. The child answers with one :class:`Report` on its report descriptor.
"""

from __future__ import annotations

from typing import Literal

import msgspec

__all__ = ["ErrorInfo", "JobSpec", "Report"]


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
    # How hints name a grant: keyword arguments ("api") or command-line flags ("cli").
    hint_style: Literal["api", "cli"] = "api"


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
