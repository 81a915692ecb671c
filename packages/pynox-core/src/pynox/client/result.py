"""``Result``: what happened to one run of the model's code, as a value.

A job that raised, timed out or hit a limit is not an exception in the host:
it is a ``Result`` whose ``text`` tells the model what went wrong and what it
may do about it. :meth:`Result.raise_for_error` turns it into an exception for
callers that prefer one.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec

from ..errors import JobError
from ..protocol import Output as WireOutput
from ..protocol import Result as WireResult
from ..protocol import SessionResult
from ..wire.exits import TIMEOUT_EXIT
from .files import FileInfo

__all__ = ["Output", "Result", "Usage"]


@dataclass(frozen=True)
class Output:
    """One rich output of the code, as a notebook keeps it (nbformat's output): ``display_data`` from
    display() or a figure, or ``execute_result`` for the trailing value. ``data`` maps MIME types to values
    as they travel (binary types in base64); the properties give each kind as Python reads it."""

    output_type: Literal["display_data", "execute_result"]
    data: Mapping[str, Any]
    metadata: Mapping[str, Any] = field(default_factory=dict)
    # The session step's number for an execute_result (as In [n] in a notebook); None otherwise.
    execution_count: int | None = None

    @classmethod
    def from_wire(cls, wire: WireOutput) -> Output:
        count = wire.execution_count if isinstance(wire.execution_count, int) else None
        return cls(output_type=wire.output_type, data=wire.data, metadata=wire.metadata, execution_count=count)

    def _text(self, mime: str) -> str | None:
        value = self.data.get(mime)
        return value if isinstance(value, str) else None

    def _binary(self, mime: str) -> bytes | None:
        value = self.data.get(mime)
        return base64.b64decode(value) if isinstance(value, str) else None

    @property
    def text(self) -> str | None:
        """text/plain, which every output has."""
        return self._text("text/plain")

    @property
    def html(self) -> str | None:
        return self._text("text/html")

    @property
    def markdown(self) -> str | None:
        return self._text("text/markdown")

    @property
    def svg(self) -> str | None:
        return self._text("image/svg+xml")

    @property
    def latex(self) -> str | None:
        return self._text("text/latex")

    @property
    def json(self) -> Any:
        return self.data.get("application/json")

    @property
    def png(self) -> bytes | None:
        return self._binary("image/png")

    @property
    def jpeg(self) -> bytes | None:
        return self._binary("image/jpeg")

    @property
    def summary(self) -> str:
        """What a model reads of it: each image as its type and size, and the text/plain, unless it is only
        an object's default repr (``<... at 0x...>``), in which case the richer types it has are named."""
        parts = [f"[{mime} {_size(len(value) * 3 // 4)}]" for mime, value in self.data.items()
                 if mime in ("image/png", "image/jpeg") and isinstance(value, str)]
        plain = self.text
        if plain and not _DEFAULT_REPR.fullmatch(plain.strip()):
            parts.append(plain.rstrip("\n"))
        elif self.markdown is not None or "application/json" in self.data:
            # Text a model reads as well as its author: the markdown, or the JSON (compact, its start if long).
            shown = self.markdown if self.markdown is not None else json.dumps(self.json, default=str)
            parts.append(shown if len(shown) <= _SUMMARY else f"{shown[:_SUMMARY]}... ({len(shown)} characters)")
        elif not parts:
            parts += [f"[{mime} {_size(len(str(value).encode()))}]" for mime, value in self.data.items()
                      if mime != "text/plain"][:3]
        return " ".join(parts) or (plain or "")


# An object's repr when it has none of its own: nothing a model learns from.
_DEFAULT_REPR = re.compile(r"<[\w.]+ (?:object )?at 0x[0-9a-fA-F]+>|<[\w.]+ object>")


_SUMMARY = 2000  # characters of a markdown or JSON output in ``Result.text``


def _size(size: int) -> str:
    if size < 1024:
        return f"{size} B"
    if size < 1 << 20:
        return f"{size / 1024:.0f} KB"
    return f"{size / (1 << 20):.1f} MB"


@dataclass(frozen=True)
class Usage:
    """What the job's process used, as the kernel counts it (the protocol's ``usage``)."""

    cpu_ms: float = 0.0  # user and system, all threads; a session step's own
    max_rss_kb: int | None = 0  # peak resident memory (a session's peak so far)
    # the memory cgroup's peak above the job's start, tmpfs pages and kernel buffers included; None uncounted
    memory_peak_kb: int | None = None
    host_calls: int = 0  # host-function calls that reached the client
    stdout_bytes: int = 0  # what the job wrote, cut by max_output or not
    stderr_bytes: int = 0
    delegated_cpu_ms: float = 0.0  # the pool's CPU answering the job's delegated calls (metadata, sysinfo, connect)
    # what the memory cgroup held at the job's end in shared memory (tmpfs, memfd) and TCP buffers
    shmem_kb: int = 0
    socket_kb: int = 0


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
    # What the job's process used (cpu_ms, max_rss_kb, memory_peak_kb, host_calls, stdout_bytes,
    # stderr_bytes); None from a pool too old to say.
    usage: Usage | None = None
    # repr() of the value of the code's trailing expression (``x = 6*7\nx`` gives ``'42'``); None when
    # the last statement is not an expression, its value is None, or the run did not ask for it.
    return_value: str | None = None
    # The figures the code showed (plt.show()) or left open, as PNG bytes; images_dropped counts those
    # left out because all of them together were over max_output.
    images: tuple[bytes, ...] = ()
    images_dropped: int = 0
    # The code's rich outputs in order (display(), figures, the trailing value's MIME bundle), when it had any.
    outputs: tuple[Output, ...] = ()
    # A session step's number (as a notebook's In [n]); None for a job.
    execution_count: int | None = None
    # The pool refused the request before anything ran (the client raises RequestError for it): the pool's
    # own ``refused`` field, never read from exit and error type, which describe what ran.
    refused: bool = False
    # Why the session's earlier process was gone when this step came (closed after session_idle, the pool
    # restarted): the step ran in a new process, opened with the session's own grants, without its state.
    session_reopened: str | None = None
    # A plain run with scratch=True: the files it left in its scratch directory, with their content.
    files: tuple[FileInfo, ...] = ()
    # A cancel interrupted this session step (KeyboardInterrupt) and it ended within the pool's grace: the
    # session and its variables live on.
    interrupted: bool = False
    # Where in ``stderr`` the traceback Python printed for ``error`` begins (``text`` shows what is before
    # it); None when stderr holds none.
    traceback_at: int | None = None

    @classmethod
    def from_wire(cls, wire: WireResult) -> Result:
        """Build from a result line the client decoded."""
        session = wire if isinstance(wire, SessionResult) else None
        return cls(
            exit=wire.exit, stdout=wire.stdout, stderr=wire.stderr,
            error=msgspec.to_builtins(wire.error) if wire.error is not None else None,
            stdout_truncated=wire.stdout_truncated, stderr_truncated=wire.stderr_truncated,
            duration_ms=wire.duration_ms, duration_us=wire.duration_us, queue_us=wire.queue_us,
            policy=_set_fields(wire.policy) if wire.policy is not None else {},
            runtime=msgspec.structs.asdict(wire.runtime) if wire.runtime is not None else {},
            session=session.session if session else None, step=session.step if session else None,
            session_ended=session.session_ended if session else False, id=wire.id,
            usage=Usage(**_set_fields(wire.usage)) if wire.usage is not None else None,
            return_value=wire.return_value if isinstance(wire.return_value, str) else None,
            images=tuple(base64.b64decode(image) for image in wire.images) if isinstance(wire.images, list) else (),
            images_dropped=wire.images_dropped if isinstance(wire.images_dropped, int) else 0,
            refused=wire.refused is True,
            files=tuple(FileInfo.from_wire(found) for found in wire.files) if isinstance(wire.files, list) else (),
            session_reopened=session.session_reopened if session and isinstance(session.session_reopened, str)
            else None,
            interrupted=session is not None and session.interrupted is True,
            outputs=tuple(Output.from_wire(o) for o in wire.outputs) if isinstance(wire.outputs, list) else (),
            execution_count=session.execution_count if session and isinstance(session.execution_count, int)
            else None,
            traceback_at=wire.traceback_at if isinstance(wire.traceback_at, int) else None,
        )

    @property
    def displayed_images(self) -> tuple[tuple[bytes, str], ...]:
        """Every image the code showed, in order, with its MIME type: each PNG or JPEG of ``outputs`` (figures
        included, in their place), then any figure of ``images`` not among them (left out of ``outputs``)."""
        found: list[tuple[bytes, str]] = []
        for output in self.outputs:
            found += [(data, mime) for data, mime in ((output.png, "image/png"), (output.jpeg, "image/jpeg"))
                      if data is not None]
        shown = {data for data, _ in found}
        return (*found, *((image, "image/png") for image in self.images if image not in shown))

    @property
    def ok(self) -> bool:
        """The code ran to the end: exit status 0 and no error."""
        return self.exit == 0 and self.error is None

    @property
    def timed_out(self) -> bool:
        """The pool killed the code at its timeout."""
        return self.exit == TIMEOUT_EXIT and self.error is not None and self.error.get("type") == "TimeoutError"

    @property
    def truncated(self) -> bool:
        return self.stdout_truncated or self.stderr_truncated

    @property
    def text(self) -> str:
        """What a model should read: the output, what the code wrote to stderr (marked, without the
        traceback the error line sums up), the trailing value as ``Out: ...``, then the error with its
        source line and hint, and notes on truncation and on a session's end."""
        stderr = self.stderr_text
        parts = [self._reopened_note, self.stdout.rstrip("\n"), f"[stderr]\n{stderr}" if stderr else "",
                 self._displayed, f"Out: {self.return_value}" if self.return_value is not None else "",
                 self._images_note, self.error_text]
        return "\n".join(part for part in parts if part) or \
            "(The code ran without printing anything. Use print() to show results.)"

    @property
    def _reopened_note(self) -> str:
        if self.session_reopened is None:
            return ""
        return (f"[The session's earlier process was gone ({self.session_reopened}): this call ran in a new one, "
                "with the same permissions. Variables, imports and functions defined in earlier calls are gone: "
                "define again what this code needs.]")

    @property
    def _displayed(self) -> str:
        """What the code displayed, one line each (figures are in the images note already)."""
        figures = set(self.images)
        return "\n".join(output.summary for output in self.outputs if output.output_type == "display_data"
                         and not (output.png is not None and output.png in figures))

    @property
    def _images_note(self) -> str:
        shown = len(self.images)
        if not shown and not self.images_dropped:
            return ""
        note = f"[{shown} image{'s' if shown != 1 else ''}"
        if self.images_dropped:
            note += f"; {self.images_dropped} more left out: all together they were over the output limit"
        return note + "]"

    @property
    def stderr_text(self) -> str:
        """What the code wrote to stderr (warnings, logging, libraries), as ``text`` shows it: without the
        traceback of the exception that ended it, or the last line an exit status already shows; the
        last characters of it when it is long."""
        text = self.stderr
        if self.traceback_at is not None:  # the pool found it (the protocol's traceback_at)
            text = text[:self.traceback_at]
        elif self.error is None and self.exit != 0:
            text = text.rstrip("\n").rpartition("\n")[0]  # error_text quotes its last line
        text = text.strip("\n")
        if len(text) > _STDERR_SHOWN:
            text = f"[the last {_STDERR_SHOWN} of {len(text)} characters]\n{text[-_STDERR_SHOWN:]}"
        return text

    @property
    def error_text(self) -> str:
        """``text`` without the output: what went wrong and the notes, or ``""`` for a clean run."""
        return self.notes()

    def notes(self, *, source_line: bool = True) -> str:
        """:attr:`error_text`; ``source_line=False`` leaves out the failing line of source under the error
        line, for a caller that shows the traceback itself (which has it)."""
        parts: list[str] = []
        error = self.error
        if error is not None:
            where = f" ({error['file']}:{error['line']})" if error.get("file") and error.get("line") else ""
            message = f": {error['message']}" if error.get("message") else ""
            parts.append(f"{error['type']}{message}{where}")
            parts += _failing_line(error) if source_line else []
            if error.get("hint"):
                parts.append(f"Hint: {error['hint']}")
        elif self.exit != 0:
            last = self.stderr.strip().splitlines()[-1:] if self.stderr.strip() else []
            parts.append(f"The code exited with status {self.exit}." + (f" {last[0]}" if last else ""))
        if self.truncated:
            limit = self.policy.get("max_output")
            size = f" at {limit} bytes" if limit else ""
            parts.append(f"[Output was truncated{size}: print a summary instead of everything.]")
        if self.interrupted:
            parts.append("[This call was interrupted (KeyboardInterrupt): the session and its variables are kept.]")
        if self.session_ended and self.session is not None:
            parts.append("[The session ended with this call: the next call starts a fresh process, and "
                         "variables, imports and functions defined so far are gone.]")
        return "\n".join(parts)

    def raise_for_error(self) -> Result:
        """Raise :class:`pynox.JobError` if the run did not succeed; return ``self`` otherwise."""
        if not self.ok:
            raise JobError(self.text, result=self)
        return self


_STDERR_SHOWN = 4000  # characters of stderr in ``text``: the last ones, where the trouble usually is
def _failing_line(error: Mapping[str, Any]) -> list[str]:
    """The source line that failed, under the error line (a SyntaxError's with a caret at its column)."""
    frames = [frame for frame in error.get("traceback") or () if frame.get("source")]
    if not frames:
        return []
    source = frames[-1]["source"]
    shown = source.strip()
    lines = [f"    {shown}"]
    column = frames[-1].get("column")
    if column:
        indent = len(source) - len(source.lstrip())
        lines.append("    " + " " * max(column - 1 - indent, 0) + "^")
    return lines


def _set_fields(struct: msgspec.Struct) -> dict[str, Any]:
    """A struct's fields as a dict, without those left unset (off the line, so not in the result either)."""
    return {name: value for name, value in msgspec.structs.asdict(struct).items() if value is not msgspec.UNSET}
