"""Describing how a job's code ended, and writing the one report the child sends the pool.

The report is the job's word (see server/report.py, which takes it only where the pool's own knowledge
agrees): the exit status, the error the code raised, described for the model (its own lines, a hint
that names the limit or grant behind it), and its trailing value and figures. The traceback Python
would print goes to stderr without Pynox's own frames.
"""

from __future__ import annotations

import builtins
import errno
import fcntl
import linecache
import os
import signal
import sys
import traceback
from typing import NoReturn

import msgspec

from .. import hints
from ..policy import MAX_FD
from ..wire.descriptors import CONTROL, DISPLAY, REPORT, STAGING, STDERR, STDOUT
from ..wire.frames import HEADER, REPORT_HEAD, STEP_REPORT
from ..wire.report_bounds import MAX_ERROR_TYPE, MAX_PATH, MAX_SOURCE, within
from ..wire.spec import Confinement, ErrorInfo, Frame, Report
from . import pynox_host
from .setup import close_quietly

__all__ = ["control_lost", "described", "drop_channel", "finish", "flush_streams", "keep_channel", "print_traceback",
           "unreported", "write_report"]

# What the report is made and sent with, bound here once, in the template, before any job: the job's code may
# replace anything in the modules it shares with this one (os.write, msgspec.json.encode, signal.SIGSTOP, builtins
# such as len or isinstance), and a report made with what the code left there was lost with it (the child raised,
# and the job ended with exit 125 and no error). This module's functions look names up in a copy of builtins made
# now, not in the builtins module the code can change (a function keeps the builtins of the module it is defined in).
globals()["__builtins__"] = dict(vars(builtins))
_encode = msgspec.json.Encoder().encode
_to_builtins = msgspec.to_builtins
_write, _close, _closerange, _kill, _getpid, _exit = os.write, os.close, os.closerange, os.kill, os.getpid, os._exit
_fcntl, _DUPFD = fcntl.fcntl, fcntl.F_DUPFD_CLOEXEC
_STEP_MARK = HEADER.pack(STEP_REPORT)
_head = REPORT_HEAD.pack
_STOP = int(signal.SIGSTOP)
# The report's own descriptor, copied above the fixed numbers before the code runs (keep_channel): code that closes
# descriptor 3 or puts another file there (its own business, as any descriptor is) does not lose the report with it.
_channel: int | None = None

_HERE = os.path.dirname(__file__)
# Pynox's own frames, left out of what the model sees: the job's code runs below execute.py's frames,
# and calls its host functions through pynox_host's.
_OWN_FILES = (*(os.path.join(_HERE, f"{module}.py") for module in ("child", "display", "execute", "report",
                                                                      "setup")),
              msgspec.__file__, pynox_host.__file__)
_MAX_MESSAGE = 2000  # tighter than the pool's bound: a message is read by a model
# The rest of an error's text, cut within the pool's own bounds with the note included (wire/report_bounds.py).
_MAX_TYPE = within(MAX_ERROR_TYPE)  # a class's name, which the code chooses
_MAX_PATH = within(MAX_PATH)
_MAX_SOURCE = within(MAX_SOURCE)  # one line of source in a traceback entry
# Exceptions of a chain (raised while handling another, or from it) printed to stderr: the last ones. Python prints
# every one, and a chain of 10,000 made a traceback of megabytes.
_MAX_CHAIN = 64
_MAX_FRAMES = 20  # own frames in an error's traceback: the outermost and innermost kept, the middle counted
_DEFAULT_MESSAGES: dict[type[BaseException], str] = {
    MemoryError: "out of memory",
    KeyboardInterrupt: "interrupted",
    RecursionError: "maximum recursion depth exceeded",
}


def keep_channel() -> None:
    """Before the job's code (or a session step's) runs: its report will be written on a copy of the report
    descriptor, at a number of no meaning to the code, which the report closes."""
    global _channel
    drop_channel()
    try:
        _channel = _fcntl(REPORT, _DUPFD, STAGING)
    except OSError:  # no report descriptor: the report's write will say nothing either
        _channel = None


def drop_channel() -> None:
    """Close the copy without a report on it (a session fork's copy: the step's report is the original's)."""
    global _channel
    channel, _channel = _channel, None
    if channel is not None:
        try:
            _close(channel)
        except OSError:
            pass


def write_report(report_fd: int, report: Report, serial: int | None = None) -> None:
    """``serial``: a session step's number. Its report then goes after the step's mark and head (the serial and the
    report's length: wire.frames.STEP_REPORT), in the same write: the pool takes the step as over once it has read
    that many bytes of report, whoever still holds a copy of the step's pipes.

    Never raises: a report that cannot be encoded is replaced by one that says so (:func:`unreported`)."""
    global _channel
    fd = report_fd
    if report_fd == REPORT and _channel is not None:
        fd, _channel = _channel, None
    try:
        try:
            data = _encode(report)
        except UnicodeEncodeError:  # a lone surrogate in a message or value: JSON's UTF-8 cannot carry it
            data = _encode(_utf8_safe(_to_builtins(report)))
    except BaseException as failure:  # something of the code's in the report (a str subclass...) broke it
        data = _encode(Report(exit=1, error=unreported(failure)))
    if serial is not None:
        data = _STEP_MARK + _head(serial & 0xFFFFFFFF, len(data)) + data
    if fd != report_fd:
        sent = _send(fd, data)
        try:
            _close(fd)
        except OSError:
            pass
        if sent:
            return
    _send(report_fd, data)  # the copy was closed by the code too (os.closerange): the report's own number, if open


def _send(fd: int, data: bytes) -> bool:
    try:
        while data:
            data = data[_write(fd, data):]
    except OSError:
        return False
    return True


def _utf8_safe(value: object) -> object:
    """``value`` with each string's surrogates written as escapes (``\\udc80``), as Python's stderr writes them."""
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, dict):
        return {key: _utf8_safe(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_utf8_safe(item) for item in value]
    return value


def finish(report_fd: int, report: Report, *, measured: bool = False, serial: int | None = None) -> NoReturn:
    """Flush, write the report, close the outputs before exiting (the reader sees EOF sooner).

    ``measured``: a job's normal end. The process stops itself here, its memory intact, so that the pool
    can read what it used from the kernel (server/usage.py) and then kill it: the result leaves without
    waiting for the exit teardown, and the figures are the kernel's, not the job's. A pool that needs
    the exit status instead continues it (SIGCONT)."""
    flush_streams()
    write_report(report_fd, report, serial)
    if report_fd == REPORT:
        # The three the pool waits for (1, 2, 3) in one system call, so that their EOFs wake its worker once, not
        # once for each; the display channel after them (the pool drains it once those are closed, see
        # server/capture.py), with every other: a copy of an output the code made (os.dup(1)) would hold its pipe
        # open while the process is stopped, and the pool would wait for its end until the job's deadline.
        _closerange(STDOUT, REPORT + 1)
        _closerange(REPORT + 1, MAX_FD)
    else:
        for fd in (STDOUT, STDERR, DISPLAY, report_fd):
            close_quietly(fd)
    if measured:
        _kill(_getpid(), _STOP)
    _exit(report.exit)


def flush_streams() -> None:
    out, err, first_out, first_err = sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__
    # The original streams only where the job replaced them (most often the same objects: flushed once).
    for stream in (out, err, None if first_out is out else first_out, None if first_err is err else first_err):
        try:
            if stream is not None:
                stream.flush()
        except BaseException:  # the job may have closed or replaced its streams (with ones that raise anything)
            pass


def described(exc: BaseException, name: str, spec: Confinement) -> ErrorInfo:
    """:func:`describe`, or, where the code broke what describing uses (traceback's functions, say), its class's
    name and a message that says so: the code's error is reported either way."""
    try:
        return describe(exc, name, spec)
    except BaseException as failure:
        return ErrorInfo(type=_cut(_TYPE_NAME.__get__(type(exc)), _MAX_TYPE),
                         message=f"{_cut(_text(exc), _MAX_MESSAGE)} (Pynox could not describe this error further: "
                                 f"{_broke(failure)}; stderr has its traceback)")


def unreported(failure: BaseException) -> ErrorInfo:
    """The error of a job whose report could not be made: how its code ended is not known."""
    return ErrorInfo(type=_cut(_TYPE_NAME.__get__(type(failure)), _MAX_TYPE),
                     message=f"Pynox could not report how the code ended: {_broke(failure)}")


def control_lost(error: ErrorInfo | None) -> ErrorInfo:
    """A session step whose code closed the session's control channel, or put another file at its number."""
    own = f" (the step's own error, {error.type}, is on stderr)" if error is not None else ""
    return ErrorInfo(type="OSError", message=f"the session's control channel (descriptor {CONTROL}) was closed or "
                                             f"replaced by this step's code: the session cannot take another step "
                                             f"and ends here{own}")


def _broke(failure: BaseException) -> str:
    return (f"the code replaced or broke something its report is made with, which raised "
            f"{_cut(_TYPE_NAME.__get__(type(failure)), _MAX_TYPE)}: {_cut(_text(failure), _MAX_SOURCE)}")


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
        report = traceback.TracebackException(type(exc), exc, exc.__traceback__, compact=True)
        left_out = _cut_chain(report)
        for part in _chain(report):
            part.stack = traceback.StackSummary.from_list(
                [frame for frame in part.stack if frame.filename not in _OWN_FILES])
        text = "".join(report.format())
        if left_out:  # said where they would be, first (the earliest exception is printed first)
            text = f"... ({left_out} earlier exceptions of this chain are not shown)\n\n{text}"
        sys.stderr.write(text)
    except BaseException:  # a broken sys.stderr (the job's, raising anything) must not hide the report
        pass


def _cut_chain(report: traceback.TracebackException) -> int:
    """Keep the last ``_MAX_CHAIN`` exceptions of the chain Python prints (each one's cause, or else its context
    unless suppressed), those nearest to where the error was raised; return how many earlier ones were cut."""
    part: traceback.TracebackException | None = report
    for _ in range(_MAX_CHAIN - 1):
        assert part is not None
        part = _printed_before(part)
        if part is None:
            return 0
    assert part is not None
    last, left_out = part, 0
    earlier = _printed_before(last)
    while earlier is not None:
        left_out += 1
        earlier = _printed_before(earlier)
    last.__cause__ = last.__context__ = None
    return left_out


def _printed_before(part: traceback.TracebackException) -> traceback.TracebackException | None:
    """The exception Python's traceback prints before ``part`` (TracebackException.format's choice)."""
    if part.__cause__ is not None:
        return part.__cause__
    return part.__context__ if part.__context__ is not None and not part.__suppress_context__ else None


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


def _importable(name: str) -> bool:
    """Whether the top-level package of the dotted ``name`` can be imported here (found, not imported)."""
    top = name.partition(".")[0]
    if top == name or not top.isidentifier():
        return False
    if top in sys.modules:
        return True
    import importlib.util  # on this error's path only

    try:
        return importlib.util.find_spec(top) is not None
    except (ImportError, ValueError):
        return False


def _hint(exc: BaseException, message: str, path: str | None, spec: Confinement) -> str | None:
    style = spec.hint_style
    if isinstance(exc, MemoryError):
        return hints.memory_hint(spec.memory, style)
    if isinstance(exc, RuntimeError) and message == "can't start new thread" and spec.max_tasks is not None:
        return hints.threads_hint(spec.max_tasks)
    if isinstance(exc, ModuleNotFoundError) and _string(exc.name):
        # Listed from inside the sandbox, which could list them itself; only on this error's path.
        name = _cut(_string(exc.name), _MAX_PATH)
        listed = hints.importable((), spec.package_dirs, _MAX_IMPORTABLE)
        return hints.module_hint(name, listed, spec.installs_packages, style, top_found=_importable(name))
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

