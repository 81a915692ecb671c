"""The confined job child: the only code that runs after the policy is applied.

The template forks, and the child calls :func:`run_job`, which never returns:
it confines itself, only then reads its payload (code, arguments, environment)
from the descriptor the server filled, runs the code as ``__main__``, writes
one report and exits. If any step of the policy fails, the code never runs:
the report carries ``setup_error`` and the exit status is ``SETUP_FAILED_EXIT`` (125).
"""

from __future__ import annotations

import ast
import atexit
import builtins
import errno
import linecache
import os
import signal
import socket
import sys
import threading
import traceback
import types
from typing import NoReturn

import msgspec

from .. import hints
from ..policy import Runtime
from ..policy.privileges import set_process_name
from ..wire.descriptors import CONTROL, REPORT, STDERR, STDOUT, STEP, handed_to_prepared, sent_with_job
from ..wire.exits import SETUP_FAILED_EXIT
from ..wire.frames import recv_raw
from ..wire.payload import read_payload, write_payload_to
from ..wire.spec import Confinement, ErrorInfo, Frame, Payload, Report, StepSpec
from . import pynox_host
from .setup import Setup, arrange, close_quietly, confine_child, receive_payload

__all__ = ["run_job", "run_prepared"]

_OWN_FILES = (__file__, msgspec.__file__, pynox_host.__file__)
_MAX_MESSAGE = 2000
_MAX_VALUE = 256 << 10  # characters of a trailing value's repr (the pool cuts it to max_output bytes)
_MAX_FRAMES = 20  # own frames in an error's traceback: the outermost and innermost kept, the middle counted
# Top-level `await` works in job code: such code compiles to a coroutine, which runs on a fresh event loop.
_COMPILE_FLAGS = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
_CO_COROUTINE = 0x80  # inspect.CO_COROUTINE, without importing inspect into every job
_DEFAULT_MESSAGES: dict[type[BaseException], str] = {
    MemoryError: "out of memory",
    KeyboardInterrupt: "interrupted",
    RecursionError: "maximum recursion depth exceeded",
}
_step_decoder = msgspec.json.Decoder(StepSpec)


def run_job(confinement: Confinement, runtime: Runtime, fds: list[int], grants: list[int]) -> NoReturn:
    """``fds``: stdout, stderr, report, payload, claim, then the host channel and the control channel if
    the job has them; ``grants``: one descriptor per granted path, which the rules are built from."""
    setup = Setup(confinement, runtime, grants, fds, sent_with_job(confinement.host_channel, confinement.session),
                  prepared=False)
    failure = confine_child(setup)
    if failure is None:
        try:
            payload = receive_payload(confinement)
        except BaseException as exc:  # fail closed: whatever went wrong, the code must not run
            failure = f"could not read the job: {exc}"
    if failure is not None:
        _fail(setup.at(REPORT), failure)
    main = _new_main(confinement, payload)
    if confinement.session:  # the first step came with the job itself
        _serve_session(confinement, main, StepSpec(code=payload.code or "", name=payload.name, args=payload.args,
                                                   return_value=payload.return_value, images=payload.images))
    _finish(REPORT, _execute(main, payload.code, payload.script, payload.name, payload.args, confinement,
                             return_value=payload.return_value, images=payload.images), measured=True)


def run_prepared(confinement: Confinement, runtime: Runtime, control: int, grants: list[int]) -> NoReturn:
    """A child forked and confined ahead of its job, with the confinement of the job before it.

    Once confined, it sends its seccomp listener to the server on ``control`` (or nothing, if its setup
    failed), then waits there. The server hands it a job only if that job's confinement is the same and
    its grants name the same files as ``grants``; the job's own descriptors (outputs, report, payload)
    arrive on ``control``. Confinement happened before the job existed, so its cost is off the job's
    critical path, and the payload is read only now: nothing of any earlier job was ever in this process
    beyond what the template holds. A setup failure is reported to the job it receives.
    """
    setup = Setup(confinement, runtime, grants, [control], (CONTROL,), prepared=True)
    failure = confine_child(setup)
    if failure is not None:
        _no_listener(setup.at(CONTROL))
    else:
        _warm_up()
    _await_job(setup)
    if failure is None:
        try:
            payload = receive_payload(confinement)
        except BaseException as exc:  # fail closed: whatever went wrong, the code must not run
            failure = f"could not read the job: {exc}"
    if failure is not None:
        _fail(REPORT, failure)
    main = _new_main(confinement, payload)
    _finish(REPORT, _execute(main, payload.code, payload.script, payload.name, payload.args, confinement,
                             return_value=payload.return_value, images=payload.images), measured=True)


def _no_listener(control: int | None) -> None:
    """Tell the server this prepared child has no listener to give (its setup failed): it still waits for
    a job, the one that will hear why. A child that cannot even say so gets no job: it exits."""
    if control is None:
        os._exit(SETUP_FAILED_EXIT)
    try:
        with socket.socket(fileno=control) as pool:
            socket.send_fds(pool, [b"L"], [])
            pool.detach()
    except OSError:
        os._exit(SETUP_FAILED_EXIT)


def _await_job(setup: Setup) -> None:
    """Wait on the control socket for the job the server hands over, and put its descriptors at their numbers
    as a job's own child has them (see setup.arrange), the control socket closed with every other one.

    Every way out here is ``SETUP_FAILED_EXIT``: a child given up by the server (it closes the socket, or
    has the template kill it) never had a job, and a child that cannot place its job's descriptors never
    runs it. Nothing of the job is in this process yet: its payload is read only once these are in place."""
    control = setup.at(CONTROL)
    if control is None:
        os._exit(SETUP_FAILED_EXIT)
    try:
        with socket.socket(fileno=control) as control_socket:
            _, fds = recv_raw(control_socket)
    except (EOFError, OSError, ValueError):
        os._exit(SETUP_FAILED_EXIT)  # discarded: no job will come
    try:
        set_process_name("pynox-job")
    except OSError:
        pass  # a name is for operators; the job runs all the same
    expected = handed_to_prepared(setup.confinement.host_channel)
    if len(fds) != len(expected):
        os._exit(SETUP_FAILED_EXIT)  # the server broke its own protocol: run nothing rather than guess
    try:
        arrange([*zip(fds, expected, strict=True), (0, 0)])
    except OSError:
        os._exit(SETUP_FAILED_EXIT)


def _fail(report: int | None, setup_error: str) -> NoReturn:
    """The setup could not be done: report why, where the job's report descriptor is, and never run the code."""
    if report is None:  # no report descriptor came with the job: the exit status alone says it
        os._exit(SETUP_FAILED_EXIT)
    _finish(report, Report(exit=SETUP_FAILED_EXIT, setup_error=setup_error))


def _warm_up() -> None:
    """Touch, before the job exists, what every job touches: reading its payload, compiling, running,
    printing, reporting.

    The child shares the template's memory copy-on-write; the first write to each page costs a fault
    (microseconds each, hundreds of them). Taking them now, while the child waits, keeps them off the
    job's critical path. Output goes to /dev/null: the job's own descriptors are not here yet."""
    try:
        main = types.ModuleType("__warm_up__")
        exec(compile("print(sum(range(3)), 'x'.upper())", "<warm-up>", "exec"), main.__dict__)
        sys.stdout.flush()
        msgspec.json.encode(Report(exit=0, error=ErrorInfo(type="", message="")))
        reading, writing = os.pipe()
        write_payload_to(writing, Payload(code="", script=None, name="", args=[], env={}, functions=[]))
        os.close(writing)
        read_payload(reading)
    except Exception:  # a warm-up is an optimisation: whatever fails here, the job still runs
        pass


def _new_main(confinement: Confinement, payload: Payload) -> types.ModuleType:
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


def _execute(main: types.ModuleType, code: str | None, script: str | None, name: str, args: list[str],
             confinement: Confinement, *, shutdown: bool = True, return_value: bool = False,
             images: int = 0) -> Report:
    sys.argv = [name, *args]
    main.__file__ = name
    try:
        source = code if code is not None else _read_script(script or "")
        # Tracebacks then show the model its own lines, as they would for a file on disk.
        linecache.cache[name] = (len(source), None, source.splitlines(True), name)
        value = _run(source, name, main.__dict__, return_value=return_value and code is not None)
        drawn = _figures(images)  # before the exit hooks: matplotlib's destroys every figure
        if shutdown:
            _shutdown()
    except SystemExit as exc:
        return Report(exit=_exit_status(exc), exited=True, images=_figures(images))
    except BaseException as exc:
        _print_traceback(exc)
        return Report(exit=1, error=_describe(exc, name, confinement), images=_figures(images))
    return Report(exit=0, return_value=value, images=drawn)


def _figures(limit: int) -> list[str]:
    """The figures the code showed or left open (only if it drew with pyplot: nothing is imported here)."""
    if not limit or "matplotlib.pyplot" not in sys.modules:
        return []
    try:
        from . import figures

        return figures.collect(limit)
    except Exception:  # a figure that cannot be drawn must not cost the code its result
        return []


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
    return None if value is None else _shown(value)


def _shown(value: object) -> str:
    try:
        text = repr(value)
    except Exception as exc:  # the value's own __repr__ failed: say so rather than fail the code that ran
        text = f"<{type(value).__name__} object: repr() raised {type(exc).__name__}>"
    return text if len(text) <= _MAX_VALUE else text[:_MAX_VALUE] + f"... ({len(text) - _MAX_VALUE} more characters)"


def _serve_session(confinement: Confinement, main: types.ModuleType, first: StepSpec) -> NoReturn:
    """Run steps until the pool closes the control channel. An exception keeps the session; an exit ends it."""
    control = socket.socket(fileno=CONTROL)
    devnull = os.open("/dev/null", os.O_WRONLY)
    step: StepSpec | None = first
    while True:
        if step is None:
            try:
                payload, fds = recv_raw(control)
            except (EOFError, OSError):
                os._exit(0)
            if len(fds) != len(STEP):
                os._exit(SETUP_FAILED_EXIT)  # the pool broke its own protocol: end the session rather than guess
            step = _step_decoder.decode(payload)
            for target, fd in zip(STEP, fds, strict=True):
                os.dup2(fd, target)
                os.close(fd)
        report = _execute(main, step.code, None, step.name, step.args, confinement, shutdown=False,
                          return_value=step.return_value, images=step.images)
        if report.exited:  # sys.exit() or exit(): the session ends with this step
            _finish(REPORT, report)
        _flush_streams()
        _write_report(REPORT, report)
        # Hand the step's pipes back (EOF tells the pool the step is over); keep 1-3 valid for the next.
        for fd in STEP:
            os.dup2(devnull, fd)
        step = None


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
    if threading.active_count() > 1:
        threading._shutdown()  # type: ignore[attr-defined]
    if atexit._ncallbacks():
        atexit._run_exitfuncs()


def _exit_status(exc: SystemExit) -> int:
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _print_traceback(exc: BaseException) -> None:
    """The traceback Python would print, without our own frames: the model should see its code, not ours."""
    try:
        sys.stdout.flush()
        report = traceback.TracebackException(type(exc), exc, exc.__traceback__)
        for part in _chain(report):
            part.stack = traceback.StackSummary.from_list(
                [frame for frame in part.stack if frame.filename not in _OWN_FILES])
        sys.stderr.write("".join(report.format()))
    except Exception:  # a broken sys.stderr must not hide the report
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
        return exc.lineno
    line = None
    for frame, lineno in traceback.walk_tb(exc.__traceback__):
        if frame.f_code.co_filename == name:
            line = lineno
    return line


def _frames_in(exc: BaseException, *modules: str) -> bool:
    names = {os.path.basename(frame.f_code.co_filename) for frame, _ in traceback.walk_tb(exc.__traceback__)}
    return any(module in names for module in modules)


def _describe(exc: BaseException, name: str, spec: Confinement) -> ErrorInfo:
    line = _location(exc, name)
    path = exc.filename if isinstance(exc, OSError) and isinstance(exc.filename, str) else None
    # A SyntaxError's str() adds "(agent.py, line 1)": the location is in file and line already.
    syntax = isinstance(exc, SyntaxError) and exc.msg
    message = exc.msg if syntax else str(exc) or _DEFAULT_MESSAGES.get(type(exc), "")  # type: ignore[attr-defined]
    if len(message) > _MAX_MESSAGE:
        message = message[:_MAX_MESSAGE] + f"... ({len(message) - _MAX_MESSAGE} more characters)"
    return ErrorInfo(type=type(exc).__name__, message=message, file=name if line else None,
                     line=line, path=path, hint=_hint(exc, path, spec), traceback=_frames(exc, name))


def _frames(exc: BaseException, name: str) -> list[Frame]:
    """Where ``exc`` was raised, outermost first: the frames of the job's own code (``name``), each run of
    other frames (a library's) collapsed into a count; Pynox's own frames are left out."""
    if isinstance(exc, SyntaxError) and exc.filename == name and exc.lineno:
        source = (exc.text or "").rstrip("\n") or None
        return [Frame(file=name, line=exc.lineno, source=source, column=exc.offset)]
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
        entries.append(Frame(file=name, line=frame.lineno, source=frame.line or None))
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


def _hint(exc: BaseException, path: str | None, spec: Confinement) -> str | None:
    style = spec.hint_style
    if isinstance(exc, MemoryError):
        return hints.memory_hint(spec.memory, style)
    if isinstance(exc, RuntimeError) and str(exc) == "can't start new thread" and spec.max_tasks is not None:
        return hints.threads_hint(spec.max_tasks)
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


def _flush_streams() -> None:
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            if stream is not None:
                stream.flush()
        except Exception:  # the job may have closed or replaced its streams
            pass


def _write_report(report_fd: int, report: Report) -> None:
    try:
        data = msgspec.json.encode(report)
        while data:
            data = data[os.write(report_fd, data):]
    except OSError:
        pass


def _finish(report_fd: int, report: Report, *, measured: bool = False) -> NoReturn:
    """Flush, write the report, close the outputs before exiting (the reader sees EOF sooner).

    ``measured``: a job's normal end. The process stops itself here, its memory intact, so that the pool
    can read what it used from the kernel (server/usage.py) and then kill it: the result leaves without
    waiting for the exit teardown, and the figures are the kernel's, not the job's. A pool that needs
    the exit status instead continues it (SIGCONT)."""
    _flush_streams()
    _write_report(report_fd, report)
    for fd in (STDOUT, STDERR, report_fd):
        close_quietly(fd)
    if measured:
        os.kill(os.getpid(), signal.SIGSTOP)
    os._exit(report.exit)
