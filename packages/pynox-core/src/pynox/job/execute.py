"""Running a job's code as ``__main__``, and a session's steps one after another in the same namespace.

The child runs this once its setup (setup.py) is done and its payload read: nothing here confines
anything, and all of it runs in the confined process, next to the code it runs.
"""

from __future__ import annotations

import ast
import atexit
import builtins
import fcntl
import linecache
import os
import re
import socket
import sys
import types
from typing import Any, NoReturn

import msgspec

from ..wire.descriptors import (
    CONTROL,
    DISPLAY,
    FORK_CHANNEL,
    FORK_CONTROL,
    FORK_OUTPUTS,
    REPORT,
    STAGING,
    STDERR,
    STDOUT,
    STEP,
)
from ..wire.exits import SETUP_FAILED_EXIT
from ..wire.frames import recv_alone
from ..wire.host_channel import PIP_FUNCTION
from ..wire.spec import Confinement, Payload, Report, StepSpec
from . import display, interrupts
from .report import (
    control_lost,
    described,
    finish,
    flush_streams,
    keep_channel,
    print_traceback,
    unreported,
    write_report,
)

__all__ = ["execute", "new_main", "prepare_jobs", "serve_session"]

_MAX_VALUE = 256 << 10  # characters of a trailing value's repr (the pool cuts it to max_output bytes)
# Top-level `await` works in job code: such code compiles to a coroutine, which runs on a fresh event loop.
_COMPILE_FLAGS = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
_CO_COROUTINE = 0x80  # inspect.CO_COROUTINE, without importing inspect into every job
_step_decoder = msgspec.json.Decoder(StepSpec)
# Builtins as they were in the template (see report.py): the code's own changes to them (BaseException, len) do
# not reach how its end is handled.
globals()["__builtins__"] = dict(vars(builtins))
# What a session's loop hands its steps over with, bound before any step's code could replace them (see report.py).
_dup2, _close, _exit, _fcntl, _fstat, _open = os.dup2, os.close, os._exit, fcntl.fcntl, os.fstat, os.open
_F_DUPFD, _F_DUPFD_CLOEXEC, _DEVNULL_FLAGS = fcntl.F_DUPFD, fcntl.F_DUPFD_CLOEXEC, os.O_WRONLY | os.O_CLOEXEC


def new_main(confinement: Confinement, payload: Payload) -> types.ModuleType:
    main = types.ModuleType("__main__")
    main.__dict__.update(__file__=payload.name, __builtins__=builtins)
    if payload.host_globals is not None and payload.functions:
        module = sys.modules["pynox_host.aio" if payload.host_globals == "await" else "pynox_host"]
        main.__dict__.update({name: getattr(module, name) for name in payload.functions})
    sys.modules["__main__"] = main
    if payload.script is not None:
        sys.path.insert(0, os.path.dirname(payload.script))
    sys.path[:0] = confinement.package_dirs
    _reseed()
    return main


def prepare_jobs() -> None:
    """In the template, before it forks any child: what every job's interpreter has beside its own ``__main__``,
    the same for every job, so that each child inherits it rather than writing it (a child that did wrote ~30
    pages it shares with the template, copy-on-write: ``builtins``, ``sys.modules``, the import system's
    finders). The template runs no job's code, nor pip, nor IPython's display: none of this changes its own
    work."""
    # display() as IPython makes it: a builtin, and importable with the notebook's display classes.
    builtins.display = display.display  # type: ignore[attr-defined]
    sys.modules["pynox_display"] = display
    display.hook_ipython()
    # pip cannot work here (no network, a read-only environment) and would say so only in a traceback it
    # catches, returning a status the code ignores: importing it fails instead, with a hint (job/report.py).
    sys.modules.setdefault("pip", None)  # type: ignore[arg-type]  # None: Python's own "import halted"


def execute(main: types.ModuleType, code: str | None, script: str | None, name: str, args: list[str],
            confinement: Confinement, *, shutdown: bool = True, return_value: bool = False,
            images: int = 0, interruptible: bool = False, stream: bool = False, frames_to: int | None = None,
            keep_report: bool = True) -> Report:
    """``interruptible``: a session's step, which the pool's interrupt signal interrupts while its code runs.
    ``frames_to``: where its display frames go, if not where they went (a later session step's report pipe).
    ``keep_report``: copy the report's descriptor for this job (a session keeps its own copy for its life)."""
    if keep_report:
        keep_channel()
    sys.argv = [name, *args]
    main.__file__ = name
    display.begin(images, frames_to)
    # A streaming job's stdout reaches the pool line by line (a pipe makes Python buffer it in blocks), and what
    # it writes is counted, so that each display output says where it falls in the text (see
    # display.counted_streams); a session step that does not stream goes back to blocks. Inline: a session's
    # every step passes here.
    if stream:
        display.counted_streams()
    try:
        if sys.stdout is not None and sys.stdout.line_buffering != stream:
            sys.stdout.reconfigure(line_buffering=stream)  # type: ignore[union-attr]
    except (AttributeError, ValueError, OSError):  # the job replaced or closed its stdout
        pass
    try:
        source = code if code is not None else _read_script(script or "")
        # Tracebacks then show the model its own lines, as they would for a file on disk.
        linecache.cache[name] = (len(source), None, source.splitlines(True), name)
        # Only source with a `%pip` line asks whether the session may install (most steps have none).
        if "%pip" in source and PIP_FUNCTION in getattr(sys.modules.get("pynox_host"), "__all__", ()):
            source = _pip_lines(source)  # line for line: tracebacks still point at the model's own lines
        if interruptible:
            interrupts.allow()
        value = _run(source, name, main.__dict__, return_value=return_value and code is not None)
        interrupts.forbid()
        drawn = _figures(images)  # before the exit hooks: matplotlib's destroys every figure
        if shutdown:
            _shutdown()
    except SystemExit as exc:
        interrupts.forbid()
        return Report(exit=_exit_status(exc), exited=True, images=_figures(images))
    except BaseException as exc:
        interrupts.forbid()
        print_traceback(exc)
        return Report(exit=1, error=described(exc, name, confinement), images=_figures(images))
    return Report(exit=0, return_value=value, images=drawn)


# What a session fork's copy serves its steps with (see session_fork.py): set as the session starts.
serving: tuple[Confinement, types.ModuleType] | None = None


def serve_session(confinement: Confinement, main: types.ModuleType, first: StepSpec | None) -> NoReturn:
    """Run steps until the pool closes the control channel. An exception keeps the session; an exit ends it.
    ``first``: the step that came as the job (None: a fork's copy, which waits for its first step).

    The session keeps its first step's stdout, stderr and report pipes for its life (a fork's copy, the three its
    fork step brought): each step's report, after its mark and head (wire.frames.STEP_REPORT), tells the pool the
    step is over, and what a thread a step left running writes later stays on those pipes, read with the step that
    runs then. After each step, descriptors 1, 2 and 3 are put back from copies above the fixed numbers: a step
    that closed or replaced one leaves the next its outputs."""
    global serving
    serving = (confinement, main)
    control = socket.socket(fileno=CONTROL)
    channel = _identity(CONTROL)
    _keep_control()
    kept = _keep_outputs()
    report_to = kept[2] if kept is not None else REPORT  # the report (and later steps' frames) on the kept copy
    fork_targets = (FORK_CONTROL, *((FORK_CHANNEL,) if confinement.host_channel else ()), *FORK_OUTPUTS)
    step: StepSpec | None = first
    while True:
        later = step is None  # a step the control channel brought: its display frames go on the report pipe
        if step is None:
            try:
                payload, fds = recv_alone(control)  # the pool sends the next step only once this one is over
            except (EOFError, OSError):
                _exit(0)
            except ValueError:
                _exit(SETUP_FAILED_EXIT)  # the pool broke its own protocol
            except BaseException:  # the code broke what receiving uses (socket's constants, say): no step can come
                _exit(SETUP_FAILED_EXIT)
            try:
                step = _step_decoder.decode(payload)
            except msgspec.DecodeError:
                _exit(SETUP_FAILED_EXIT)  # the pool broke its own protocol: end the session rather than guess
            if fds or step.fork or step.outputs:  # new outputs for the session; a fork step's: the copy's own
                targets = (*(STEP if step.outputs else ()), *(fork_targets if step.fork else ()))
                if len(fds) != len(targets):
                    _exit(SETUP_FAILED_EXIT)
                _place(list(zip(targets, fds, strict=True)))
                if step.outputs:  # an earlier step's code closed every copy of one of the session's pipes
                    kept = _keep_outputs()
                    report_to = kept[2] if kept is not None else REPORT
        serial = step.serial  # the report's head (report.write_report)
        try:
            report = execute(main, step.code, None, step.name, step.args, confinement, shutdown=False,
                             return_value=step.return_value, images=step.images, interruptible=True,
                             stream=step.stream, frames_to=report_to if later else None, keep_report=False)
        except KeyboardInterrupt as exc:  # the interrupt landed after the code, as execute handled its end
            # (the interrupt's handler forbade the next one as it raised this: see interrupts._interrupt)
            report = Report(exit=1, error=described(exc, step.name, confinement))
        except BaseException as failure:  # the code broke what execute's end uses: the session cannot go on
            interrupts.forbid()
            finish(report_to, Report(exit=1, exited=True, error=unreported(failure)), serial=serial)
        if not report.exited and _identity(CONTROL) != channel and not _restore_control(channel):
            # The code closed the control channel and its copy, or put other files at their numbers: no step can
            # come, and the session ends here, saying why (its loop would have ended it at the next step, silently).
            report = Report(exit=1, exited=True, error=control_lost(report.error), images=report.images)
            finish(report_to, report, serial=serial)
        if report.exited:  # sys.exit() or exit(): the session ends with this step
            finish(report_to, report, serial=serial)
        flush_streams()
        if kept is not None and not _restore_outputs(kept):
            # The code closed a copy too (os.closerange): each is made again from 1, 2 or 3 where that is still the
            # session's pipe. One closed everywhere ended its pipe: the pool saw it, and sends new ones with the next
            # step; if it was the report's, the step has no report, and the pool ends the session, saying why.
            kept = _repair_outputs(kept)
            report_to = kept[2] if kept is not None else REPORT
        # The step's report, after its last whole frame; a frame a thread of it shows from now on follows it on the
        # same pipe, and the pool reads it with the next step. The pool takes the step as over once it has read
        # the report, whatever still holds a copy of the pipes (os.dup(1) in the code).
        display.after_frames(report_to, write_report, report, serial)
        if not later:
            _quiet_display()  # the first step's display channel: its later steps' frames go on the report pipe
        step = None


# Copies of the session's stdout, stderr and report, above the fixed numbers, for the session's life: 1, 2 and 3
# are put back from them after each step, and the report is written on the third (see serve_session).
outputs_copy: tuple[int, int, int] | None = None


# Which pipe each copy is (device, inode): a copy the code closed is found again at 1, 2 or 3 by it.
_outputs_identity: list[tuple[int, int] | None] = []


def drop_outputs() -> None:
    """Close the copies of the session's pipes (before new ones are made, and in a session fork's copy, whose pipes
    are its own)."""
    global outputs_copy
    for fd in outputs_copy or ():
        if fd >= 0:
            try:
                _close(fd)
            except OSError:
                pass
    outputs_copy = None


def _keep_outputs() -> tuple[int, int, int] | None:
    """Copies of 1, 2 and 3 (the session's pipes), in place of any made before."""
    global outputs_copy, _outputs_identity
    drop_outputs()
    made: list[int] = []
    try:
        for fd in STEP:
            made.append(_fcntl(fd, _F_DUPFD_CLOEXEC, STAGING))
    except OSError:  # no room above the fixed numbers: the session writes on 1, 2 and 3 themselves
        for fd in made:
            _close(fd)
        return None
    outputs_copy = (made[0], made[1], made[2])
    _outputs_identity = [_identity(fd) for fd in made]
    return outputs_copy


def _repair_outputs(kept: tuple[int, int, int]) -> tuple[int, int, int]:
    """After a step whose code closed or replaced a copy: each copy that is not its pipe any more is made again
    from its number (1, 2, 3) if that still is the pipe (else -1: that pipe is gone for this process), and the
    numbers put back from the copies left. Never on a step's common path."""
    global outputs_copy
    repaired = list(kept)
    for index, (target, fd) in enumerate(zip(STEP, kept, strict=True)):
        pipe = _outputs_identity[index] if index < len(_outputs_identity) else None
        if pipe is not None and _identity(fd) == pipe:
            continue
        repaired[index] = -1  # the number is the code's now (closed, or another file): left to it
        if pipe is not None and _identity(target) == pipe:
            try:
                repaired[index] = _fcntl(target, _F_DUPFD_CLOEXEC, STAGING)
            except OSError:
                pass
    for target, fd in zip(STEP, repaired, strict=True):
        if fd >= 0:
            try:
                _dup2(fd, target)
            except OSError:
                pass
    outputs_copy = (repaired[0], repaired[1], repaired[2])
    return outputs_copy


def _restore_outputs(kept: tuple[int, int, int]) -> bool:
    """Put the session's outputs back at 1, 2 and 3 (three ``dup2``: the code may have closed or replaced any of
    them, its own business); False if a copy is gone."""
    try:
        _dup2(kept[0], STDOUT)
        _dup2(kept[1], STDERR)
        _dup2(kept[2], REPORT)
    except OSError:
        return False
    return True


def _quiet_display() -> None:
    try:
        devnull = _open("/dev/null", _DEVNULL_FLAGS)
    except OSError:
        return
    try:
        _dup2(devnull, DISPLAY)
    except OSError:
        pass
    _close(devnull)


# A copy of the session's control channel, above the fixed numbers: code that closes descriptor 5 or puts another
# file there (its own business, as any descriptor is) has it put back after its step, and the session goes on.
control_copy: int | None = None


def _keep_control() -> None:
    global control_copy
    try:
        control_copy = _fcntl(CONTROL, _F_DUPFD_CLOEXEC, STAGING)
    except OSError:
        control_copy = None


def _restore_control(channel: tuple[int, int] | None) -> bool:
    """Put the control channel back at its number from its copy; False if the copy is not it any more."""
    if control_copy is None or _identity(control_copy) != channel:
        return False
    try:
        _dup2(control_copy, CONTROL)
    except OSError:
        return False
    return True


def _identity(fd: int) -> tuple[int, int] | None:
    """Which open file ``fd`` is (device, inode), or None if it is not open."""
    try:
        facts = _fstat(fd)
    except OSError:
        return None
    return facts.st_dev, facts.st_ino


def _place(moves: list[tuple[int, int]]) -> None:
    """Each (target, received descriptor): the descriptor put at its target number. They were received at the
    lowest free numbers, and the code may have closed any of its own (a host channel, a number below the
    targets): one may sit at a target still to be filled, which filling it would overwrite. Then every one is
    moved above all targets first (never on a step's common path: there they arrive below the fork's numbers)."""
    targets = {target for target, _ in moves}
    if any(fd in targets and fd != target for target, fd in moves):
        staged = []
        for target, fd in moves:
            staged.append((target, _fcntl(fd, _F_DUPFD, STAGING)))
            _close(fd)
        moves = staged
    for target, fd in moves:
        if fd != target:
            _dup2(fd, target)
            _close(fd)


_PIP_LINE = re.compile(r"^(?P<indent>[ \t]*)%pip[ \t]+(?P<words>install\b[^\n]*)$", re.MULTILINE)


def _pip_lines(source: str) -> str:
    """A session opened with pip_install: each `%pip install NAME...` line becomes a call that asks the pool to
    install them (the pool checks every word), then lets imports see what was added."""
    return _PIP_LINE.sub(lambda line: f"{line['indent']}print(__import__('pynox_host').{PIP_FUNCTION}("
                                      f"{line['words'].strip()!r})); __import__('importlib').invalidate_caches()",
                         source)


def _run(source: str, name: str, namespace: dict[str, object], *, return_value: bool) -> str | None:
    """Run ``source`` as ``__main__``; with ``return_value``, a final expression statement is evaluated as an
    expression, and repr() of its value (unless None) is returned, as a notebook cell shows it."""
    if not return_value:
        body = compile(source, name, "exec", flags=_COMPILE_FLAGS)
        last = None
    else:
        tree = ast.parse(source, name)
        tail = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
        assert tail is None or isinstance(tail, ast.Expr)
        if tail is not None and _quiet(source, tail):
            tree.body.append(tail)  # run as a statement: a trailing ';' hides its value, as IPython's does
            tail = None
        body = compile(tree, name, "exec", flags=_COMPILE_FLAGS)
        last = compile(ast.Expression(tail.value), name, "eval", flags=_COMPILE_FLAGS) if tail else None
    if (body.co_flags | (last.co_flags if last else 0)) & _CO_COROUTINE:
        import asyncio  # only for code that awaits at top level

        async def both() -> object:
            ran = eval(body, namespace)
            if asyncio.iscoroutine(ran):
                await ran
            value = eval(last, namespace) if last is not None else None
            return await value if asyncio.iscoroutine(value) and last is not None and last.co_flags & _CO_COROUTINE \
                else value

        value = asyncio.run(both())
    else:
        exec(body, namespace)
        value = eval(last, namespace) if last is not None else None
    if value is None:
        return None
    display.result(value)  # its MIME bundle, as the cell's execute_result
    return _shown(value)


def _quiet(source: str, tail: ast.Expr) -> bool:
    """Whether a ';' follows the final expression statement ``tail`` (IPython's rule: ``plt.plot(x);`` shows no
    value). Nothing but whitespace, semicolons, comments and line continuations can follow the last statement, so
    the text after it is read as such, without tokenizing the cell again."""
    if tail.end_lineno is None or tail.end_col_offset is None:
        return False
    lines = source.splitlines()
    rest = [lines[tail.end_lineno - 1].encode()[tail.end_col_offset:].decode(errors="replace"),
            *lines[tail.end_lineno:]]
    after = "".join(line.partition("#")[0] for line in rest)
    return after.replace("\\", "").strip().startswith(";")


def _shown(value: object) -> str:
    try:
        text = repr(value)
    except Exception as exc:  # the value's own __repr__ failed: say so rather than fail the code that ran
        text = f"<{type(value).__name__} object: repr() raised {type(exc).__name__}>"
    return text if len(text) <= _MAX_VALUE else text[:_MAX_VALUE] + f"... ({len(text) - _MAX_VALUE} more characters)"


def _figures(limit: int) -> list[str]:
    """The figures the code showed or left open (only if it drew with pyplot: nothing is imported here)."""
    if not limit or "matplotlib.pyplot" not in sys.modules:
        return []
    try:
        from . import figures

        return figures.collect(limit)
    except BaseException:  # a figure that cannot be drawn (the code's, raising anything) must not cost it its result
        return []


def _read_script(path: str) -> str:
    with open(path, encoding="utf-8") as script:
        return script.read()


def _reseed() -> None:
    # `random` reseeds itself at fork; numpy's legacy global generator does not.
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:
        numpy_random.seed()


def _shutdown() -> None:
    # What the interpreter would do at exit: wait for non-daemon threads, run the job's atexit hooks
    # (the template's were cleared at the start: they are the template's business, not a job's).
    # Only if the job imported threading, as the interpreter's own exit asks (a default template does not import
    # it, see policy/seccomp.py: a job that never did has none of threading's threads to wait for).
    threading = sys.modules.get("threading")
    if threading is not None and threading.active_count() > 1:
        threading._shutdown()
    if atexit._ncallbacks():
        hook = sys.unraisablehook
        sys.unraisablehook = lambda unraisable: hook(_without_this_frame(unraisable))
        try:
            atexit._run_exitfuncs()
        finally:
            sys.unraisablehook = hook


def _without_this_frame(unraisable: Any) -> Any:
    """A failed exit hook as Python's own exit reports it. Python gives an exception raised in C (a hook that is
    ``sys.exit``) the traceback of the frame that runs the hooks: here, :func:`_shutdown`, Pynox's own, where the
    interpreter's exit has none."""
    traceback = unraisable.exc_traceback
    while traceback is not None and traceback.tb_frame.f_code is _shutdown.__code__:
        traceback = traceback.tb_next
    return type(unraisable)((unraisable.exc_type, unraisable.exc_value, traceback, unraisable.err_msg,
                             unraisable.object))


def _exit_status(exc: SystemExit) -> int:
    """The status Python's own exit gives ``sys.exit(code)``; the code is the job's object, and may resist."""
    code = exc.code
    if code is None:
        return 0
    try:  # int's own conversion, which an int subclass of the job's cannot redefine (nor its & and <)
        number = int.__index__(code)  # type: ignore[arg-type]  # any object: a TypeError says it is no int
    except TypeError:  # not a number (a message): printed, and the status is 1
        try:
            print(code, file=sys.stderr)
        except BaseException:  # its __str__ or the job's stderr failed: nothing printed, as Python prints nothing
            pass
        return 1
    return number & 0xFF if -(1 << 63) <= number < 1 << 63 else 255  # beyond a C long, CPython exits with -1

