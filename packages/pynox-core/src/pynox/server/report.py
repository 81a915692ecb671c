"""The one place the pool reads a job's report: decoded, checked for shape, and bounded.

The report is written after confinement, by code the job controls from its
first instruction: it is hostile input. It may describe only the job's own
Python outcome, one of four shapes:

========  ============================  =====================================
shape     report                        exit status the pool gives it
========  ============================  =====================================
ran       no error, not exited          0
raised    ``error`` (and ``exited``     1 (whatever number the report states)
          if its process ends with it)
exited    ``exited``, ``exit`` 0-255    that number: ``sys.exit(N)`` is the job's own
setup     ``setup_error`` and nothing   125, only if the job was never claimed
          else
========  ============================  =====================================

The exit status of a job that raised is always 1, so the pair (``exit``,
``error.type``) by which the protocol tells the pool's verdicts (timeout,
refusal, setup failure, cancellation, worker failure) can only come from the
pool. The job's exception class keeps its own name, even one of those
(``TimeoutError``, ``CancelledError``): a socket timeout or an asyncio
cancellation is a real exception of the job's code, and renaming it would
tell the model something false about its own code; with exit 1 it reads as
exactly that. A setup failure means the code never ran, which the pool knows
only from the claim byte (see payload.py): the child claims its job as the
last step before the code, so a job that claimed it may have run, and its
word on a setup failure is not taken.

A report of any other shape, or one that is not JSON of the report's type, is
not the child's: it is ignored and the exit status the kernel reports stands
alone (see worker.py). Every string and list in a report is bounded here,
whatever the child would have written, so nothing downstream (results, stats,
logs) holds more of the job's word than these bounds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import msgspec

from ..wire.exits import SETUP_FAILED_EXIT
from ..wire.report_bounds import MAX_ERROR_TYPE, MAX_FRAMES, MAX_HINT, MAX_MESSAGE, MAX_PATH, MAX_SETUP, MAX_SOURCE
from ..wire.spec import ErrorInfo, Frame, Report
from .figures import images_on_the_wire

__all__ = ["JobWord", "bounded", "read_report"]

# Each string of a report and its traceback entries are bounded by wire/report_bounds.py (the child's own cuts
# are within those bounds).
_MAX_IMAGES = 64  # figures in one result; the rest are counted as dropped
# A line number or a count of frames: what a 32-bit integer holds, where clients read 64 (a report may say 10**30).
_MAX_COUNT = (1 << 31) - 1

_decoder = msgspec.json.Decoder(Report)


@dataclass
class JobWord:
    """What the pool takes from a report: the job's own outcome, bounded."""

    shape: Literal["ran", "raised", "exited", "setup"]
    exit: int
    error: ErrorInfo | None = None
    setup_error: str | None = None
    return_value: str | None = None
    images: list[str] = field(default_factory=list)
    images_dropped: int = 0
    # Its process ends with this report (an exit, or a session step whose child can serve no other: its code took
    # the session's control channel): a session's pool waits for the end, which ends the session.
    ends: bool = False


def bounded(text: str, limit: int) -> str:
    """``text`` at most ``limit`` characters, with a note of how many were cut."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text) - limit} more characters)"


def _optional(text: str | None, limit: int) -> str | None:
    return None if text is None else bounded(text, limit)


def _value(value: str | None, limit: int) -> str | None:
    """A value's repr, at most ``limit`` bytes of UTF-8 like each output stream, with a note when cut."""
    if value is None or len(value) <= limit // 4 or len(value.encode()) <= limit:
        return value
    kept = value.encode()[:limit].decode("utf-8", "ignore")
    return f"{kept}... ({len(value) - len(kept)} more characters)"


def _line(line: int | None) -> int | None:
    """A line number (1-based), or None: a report may give any integer."""
    return line if line is not None and 1 <= line <= _MAX_COUNT else None


def _column(column: int | None, source: str | None) -> int | None:
    """A column within its source line, or None (a client draws a caret under it, one space a column)."""
    return column if column is not None and 1 <= column <= len(source or "") + 1 else None


def _frames(frames: list[Frame] | None) -> list[Frame] | None:
    if frames is None:
        return None
    kept = []
    for f in frames[:MAX_FRAMES]:
        source = _optional(f.source, MAX_SOURCE)
        kept.append(Frame(file=_optional(f.file, MAX_PATH), line=_line(f.line), source=source,
                          column=_column(f.column, source), omitted=min(max(f.omitted, 0), _MAX_COUNT)))
    if len(frames) > MAX_FRAMES:
        kept.append(Frame(file=None, line=None, source=None, omitted=len(frames) - MAX_FRAMES))
    return kept


def _error(error: ErrorInfo) -> ErrorInfo:
    return ErrorInfo(type=bounded(error.type, MAX_ERROR_TYPE), message=bounded(error.message, MAX_MESSAGE),
                     file=_optional(error.file, MAX_PATH), line=_line(error.line),
                     path=_optional(error.path, MAX_PATH), hint=_optional(error.hint, MAX_HINT),
                     traceback=_frames(error.traceback))


def _shape(report: Report) -> Literal["ran", "raised", "exited", "setup"] | None:
    if report.setup_error is not None:
        plain = report.error is None and not report.exited and report.return_value is None and not report.images
        return "setup" if plain and report.exit == SETUP_FAILED_EXIT else None
    if report.error is not None:
        return "raised"
    if report.exited:
        return "exited" if 0 <= report.exit <= 255 else None
    return "ran"


def read_report(raw: bytes, *, value_limit: int, image_limit: int) -> JobWord | None:
    """The job's word from its raw report, bounded; None if it is not a report of one of the four shapes.

    ``value_limit``: bytes of a trailing value's repr (the job's max_output); ``image_limit``: bytes of PNG
    in all. A ``setup`` word still needs the claim checked by the caller (it alone holds the claim)."""
    if not raw:
        return None
    try:
        report = _decoder.decode(raw)
    except msgspec.DecodeError:
        return None  # the job wrote garbage over its report channel
    shape = _shape(report)
    if shape is None:
        return None
    if shape == "setup":
        return JobWord("setup", SETUP_FAILED_EXIT, setup_error=bounded(report.setup_error or "", MAX_SETUP))
    images, dropped = images_on_the_wire(report.images[:_MAX_IMAGES], image_limit)
    return JobWord(
        shape, {"ran": 0, "raised": 1, "exited": report.exit}[shape],
        error=_error(report.error) if report.error is not None else None,
        return_value=_value(report.return_value, value_limit), images=images,
        images_dropped=dropped + max(len(report.images) - _MAX_IMAGES, 0), ends=report.exited,
    )
