"""Describing how a job's code ended, and writing the one report the child sends the pool.

The report is the job's word (see server/report.py, which takes it only where the pool's own knowledge
agrees): the exit status, the error the code raised, described for the model (its own lines, a hint
that names the limit or grant behind it), and its trailing value and figures. The traceback Python
would print goes to stderr without Pynox's own frames.
"""

from __future__ import annotations

import errno
import linecache
import os
import signal
import sys
import traceback
from typing import NoReturn

import msgspec

from .. import hints
from ..wire.descriptors import DISPLAY, REPORT, STDERR, STDOUT
from ..wire.spec import Confinement, ErrorInfo, Frame, Report
from . import pynox_host
from .setup import close_quietly

__all__ = ["describe", "finish", "flush_streams", "print_traceback", "write_report"]

_HERE = os.path.dirname(__file__)
# Pynox's own frames, left out of what the model sees: the job's code runs below execute.py's frames,
# and calls its host functions through pynox_host's.
_OWN_FILES = (*(os.path.join(_HERE, f"{module}.py") for module in ("child", "display", "execute", "report",
                                                                      "setup")),
              msgspec.__file__, pynox_host.__file__)
_MAX_MESSAGE = 2000
# The rest of an error's text, cut within the pool's own bounds (server/report.py) with the note included: a
# report over the pool's bound for one is not taken at all, and the job's error is then not said.
_MAX_TYPE = 96  # a class's name, which the code chooses
_MAX_PATH = 4000
_MAX_SOURCE = 960  # one line of source in a traceback entry
_MAX_FRAMES = 20  # own frames in an error's traceback: the outermost and innermost kept, the middle counted
_DEFAULT_MESSAGES: dict[type[BaseException], str] = {
    MemoryError: "out of memory",
    KeyboardInterrupt: "interrupted",
    RecursionError: "maximum recursion depth exceeded",
}


def write_report(report_fd: int, report: Report, prefix: bytes = b"") -> None:
    """``prefix``: a later session step's mark (wire.frames.STEP_REPORT), in the same write as its report."""
    try:
        try:
            data = prefix + msgspec.json.encode(report)
        except UnicodeEncodeError:  # a lone surrogate in a message or value: JSON's UTF-8 cannot carry it
            data = prefix + msgspec.json.encode(_utf8_safe(msgspec.to_builtins(report)))
        while data:
            data = data[os.write(report_fd, data):]
    except OSError:
        pass


def _utf8_safe(value: object) -> object:
    """``value`` with each string's surrogates written as escapes (``\\udc80``), as Python's stderr writes them."""
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, dict):
        return {key: _utf8_safe(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_utf8_safe(item) for item in value]
    return value


def finish(report_fd: int, report: Report, *, measured: bool = False, prefix: bytes = b"") -> NoReturn:
    """Flush, write the report, close the outputs before exiting (the reader sees EOF sooner).

    ``measured``: a job's normal end. The process stops itself here, its memory intact, so that the pool
    can read what it used from the kernel (server/usage.py) and then kill it: the result leaves without
    waiting for the exit teardown, and the figures are the kernel's, not the job's. A pool that needs
    the exit status instead continues it (SIGCONT)."""
    flush_streams()
    write_report(report_fd, report, prefix)
    if report_fd == REPORT:
        # The three the pool waits for (1, 2, 3) in one system call, so that their EOFs wake its worker once, not
        # once for each; the display channel after them (the pool drains it once those are closed, see
        # server/capture.py).
        os.closerange(STDOUT, REPORT + 1)
        close_quietly(DISPLAY)
    else:
        for fd in (STDOUT, STDERR, DISPLAY, report_fd):
            close_quietly(fd)
    if measured:
        os.kill(os.getpid(), signal.SIGSTOP)
    os._exit(report.exit)


def flush_streams() -> None:
    out, err, first_out, first_err = sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__
    # The original streams only where the job replaced them (most often the same objects: flushed once).
    for stream in (out, err, None if first_out is out else first_out, None if first_err is err else first_err):
        try:
            if stream is not None:
                stream.flush()
        except BaseException:  # the job may have closed or replaced its streams (with ones that raise anything)
            pass


def describe(exc: BaseException, name: str, spec: Confinement) -> ErrorInfo:
    line = _location(exc, name)
    path = _cut(_string(exc.filename), _MAX_PATH) or None if isinstance(exc, OSError) else None
    # A SyntaxError's str() adds "(agent.py, line 1)": the location is in file and line already.
    syntax = isinstance(exc, SyntaxError) and _string(exc.msg)
    message = syntax or _text(exc) or _DEFAULT_MESSAGES.get(type(exc), "")
    message = _cut(message, _MAX_MESSAGE)
    return ErrorInfo(type=_cut(_TYPE_NAME.__get__(type(exc)), _MAX_TYPE), message=message, file=name if line else None,
                     line=line, path=path, hint=_hint(exc, message, path, spec), traceback=_frames(exc, name))


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + f"... ({len(text) - limit} more characters)"


def _text(exc: BaseException) -> str:
    """``str(exc)``; the job's exception class defines it, and it may fail as any of the job's code may."""
    try:
        return _string(str(exc))
    except BaseException:  # a KeyboardInterrupt or SystemExit too, as Python's own traceback takes any
        return "<exception str() failed>"  # what Python's own traceback prints then


def print_traceback(exc: BaseException) -> None:
    """The traceback Python would print, without our own frames: the model should see its code, not ours."""
    try:
        sys.stdout.flush()
        report = traceback.TracebackException(type(exc), exc, exc.__traceback__)
        for part in _chain(report):
            part.stack = traceback.StackSummary.from_list(
                [frame for frame in part.stack if frame.filename not in _OWN_FILES])
        sys.stderr.write("".join(report.format()))
    except BaseException:  # a broken sys.stderr (the job's, raising anything) must not hide the report
        pass


def _chain(report: traceback.TracebackException) -> list[traceback.TracebackException]:
    parts, seen = [], set()
    pending = [report]
    while pending:
        part = pending.pop()
        if id(part) in seen:
            continue
        seen.add(id(part))
        parts.append(part)
        pending += [p for p in (part.__cause__, part.__context__) if p is not None]
    return parts


def _location(exc: BaseException, name: str) -> int | None:
    if isinstance(exc, SyntaxError) and exc.filename == name:
        return _number(exc.lineno)
    line = None
    for frame, lineno in traceback.walk_tb(exc.__traceback__):
        if frame.f_code.co_filename == name:
            line = lineno
    return line


# The fields of a SyntaxError or an ImportError the code raised itself may hold anything it gave them.
def _number(value: object) -> int | None:
    return value if type(value) is int else None


def _string(value: object) -> str:
    """``value`` if it is text, as a str (a str of the code's own kind may redefine ``len``), else ""."""
    return str.__str__(value) if isinstance(value, str) else ""


_TYPE_NAME = type.__dict__["__name__"]  # a class's own name, which a metaclass of the code's cannot redefine


def _frames_in(exc: BaseException, *modules: str) -> bool:
    names = {os.path.basename(frame.f_code.co_filename) for frame, _ in traceback.walk_tb(exc.__traceback__)}
    return any(module in names for module in modules)


def _frames(exc: BaseException, name: str) -> list[Frame]:
    """Where ``exc`` was raised, outermost first: the frames of the job's own code (``name``), each run of
    other frames (a library's) collapsed into a count; Pynox's own frames are left out."""
    if isinstance(exc, SyntaxError) and exc.filename == name and _number(exc.lineno):
        source = _cut(_string(exc.text).rstrip("\n"), _MAX_SOURCE) or None
        return [Frame(file=name, line=exc.lineno, source=source, column=_number(exc.offset))]
    entries: list[Frame] = []
    others = 0
    for frame in traceback.extract_tb(exc.__traceback__):
        if frame.filename in _OWN_FILES:
            continue
        if frame.filename != name:
            others += 1
            continue
        if others:
            entries.append(Frame(file=None, line=None, source=None, omitted=others))
            others = 0
        entries.append(Frame(file=name, line=frame.lineno, source=_cut(frame.line or "", _MAX_SOURCE) or None))
    if others:
        entries.append(Frame(file=None, line=None, source=None, omitted=others))
    if len(entries) > _MAX_FRAMES:  # deep recursion: the way in and the way down, the middle counted
        head, tail = entries[:_MAX_FRAMES // 2], entries[-_MAX_FRAMES // 2:]
        middle = sum(entry.omitted or 1 for entry in entries[_MAX_FRAMES // 2:-_MAX_FRAMES // 2])
        entries = [*head, Frame(file=None, line=None, source=None, omitted=middle), *tail]
    return entries


_PROCESS_CALLS = ("fork", "spawn", "exec", "system(", "popen")


def _starts_a_process(exc: BaseException) -> bool:
    """Whether the line that raised calls os.fork, os.posix_spawn, os.exec*... directly: C functions leave
    no frame of their own, so the model's own source line is what tells."""
    last = None
    for frame, lineno in traceback.walk_tb(exc.__traceback__):
        last = (frame.f_code.co_filename, lineno)
    if last is None:
        return False
    line = linecache.getline(*last).lower()
    return any(call in line for call in _PROCESS_CALLS)


_MAX_IMPORTABLE = 40  # names in a hint: the rest are counted


def _hint(exc: BaseException, message: str, path: str | None, spec: Confinement) -> str | None:
    style = spec.hint_style
    if isinstance(exc, MemoryError):
        return hints.memory_hint(spec.memory, style)
    if isinstance(exc, RuntimeError) and message == "can't start new thread" and spec.max_tasks is not None:
        return hints.threads_hint(spec.max_tasks)
    if isinstance(exc, ModuleNotFoundError) and _string(exc.name):
        # Listed from inside the sandbox, which could list them itself; only on this error's path.
        listed = hints.importable((), spec.package_dirs, _MAX_IMPORTABLE)
        return hints.module_hint(_cut(_string(exc.name), _MAX_PATH), listed, spec.installs_packages, style)
    if isinstance(exc, SyntaxError) and _string(exc.text).lstrip().startswith(("!", "%")):
        return hints.shell_hint(_cut(_string(exc.text).strip(), _MAX_SOURCE), spec.installs_packages, style)
    if not isinstance(exc, OSError):
        return None
    if exc.errno == errno.EFBIG and spec.max_file_size is not None:
        return hints.file_size_hint(spec.max_file_size, style)
    if exc.errno == errno.EXDEV and path is not None:  # Landlock's answer to a rename or link across grants
        return hints.cross_grant_hint()
    if exc.errno not in (errno.EPERM, errno.EACCES, errno.ENOSYS):
        return None
    # A denied fork or exec is EPERM; an EACCES in os.py is a path (os.makedirs), not a process.
    if exc.errno == errno.EPERM and (_frames_in(exc, "subprocess.py", "popen_fork.py", "context.py", "pool.py",
                                                "os.py", "pty.py") or _starts_a_process(exc)):
        return hints.subprocess_hint()
    if _frames_in(exc, "socket.py", "ssl.py", "client.py", "request.py", "connection.py"):
        return hints.network_hint(spec.network, style)
    # Landlock refuses a path with EACCES; EPERM on a path comes from the seccomp filter (exec, chmod...).
    if path is not None and exc.errno == errno.EACCES:
        return hints.path_hint(path, spec.cwd, spec.allow_read, spec.allow_write, style)
    if exc.errno == errno.EPERM:
        return hints.operation_hint()
    return None

