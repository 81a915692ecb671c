"""The two ways a child comes to its job, from the fork to the job's end.

The template forks a child either for its job (:func:`run_job`) or ahead of it, for a job like the
one before (:func:`run_prepared`); neither returns. Both confine themselves with the same ordered
steps (setup.py), only then read the payload (code, arguments, environment) from the descriptor the
server filled, run the code as ``__main__`` (execute.py) and write one report (report.py). If any
step of the setup fails, the code never runs: the report carries ``setup_error`` and the exit status
is ``SETUP_FAILED_EXIT`` (125).
"""

from __future__ import annotations

import builtins
import linecache
import os
import socket
import sys
from typing import NoReturn

from ..policy import MAX_FD, Runtime
from ..policy.grants import close_all
from ..policy.native import NativeCall, hand_over_call
from ..policy.privileges import ProcessName
from ..wire.descriptors import CLAIM, CONTROL, OUTPUTS, PAYLOAD, REPORT, STAGING, handed_to_prepared, sent_with_job
from ..wire.exits import SETUP_FAILED_EXIT
from ..wire.frames import MAX_FRAME, pack, recv_raw
from ..wire.payload import CLAIMED, encode_payload, read_payload
from ..wire.spec import Confinement, Payload, Report, StepSpec

# session_state, session_fork: loaded with the template, so a session's save, restore and fork steps find
# them in memory.
from . import display, preload_warm, pynox_host, session_fork, session_state  # noqa: F401
from .execute import execute, new_main, prepare_jobs, serve_session
from .native_setup import confine_steps
from .report import finish, flush_streams, unreported, write_report
from .setup import READ, Setup, arrange, run_steps

__all__ = ["Setup", "job_setup", "prepare_template", "prepared_setup", "run_job", "run_prepared"]
# Builtins as they were in the template (see report.py): the code's own changes to them (BaseException, len) do
# not reach how its end is handled.
globals()["__builtins__"] = dict(vars(builtins))


def prepare_template() -> None:
    """In the template, once the operator's modules are preloaded and before any job exists: build what every
    job would otherwise build for itself from them (IPython's display formatter, see display.prepare), and
    warm the host functions' call path (see pynox_host.warm_up) and the preloaded modules' common paths (see
    preload_warm); then set up what every job's interpreter has beside its own __main__ (see
    execute.prepare_jobs)."""
    display.prepare()
    pynox_host.warm_up()
    preload_warm.warm_preloaded()
    prepare_jobs()


# The Setup a child works on is built by the template, before the fork (job_setup, prepared_setup): Setup.__init__
# then runs warm there (its code quickened, the type's attribute lookups cached), where a child running it cold
# wrote its code object, each attribute's name and the type cache's entries: ~20 copy-on-write faults a child.
# It holds the template's own descriptors and the job's confinement, nothing of the job's payload.


def job_setup(confinement: Confinement, runtime: Runtime, fds: list[int], grants: list[int],
              native_call: NativeCall | None = None) -> Setup:
    """In the template: what :func:`run_job` works on. ``fds``: stdout, stderr, report, payload, claim, then the
    host channel and the control channel if the job has them; ``grants``: one descriptor per granted path,
    which the rules are built from; ``native_call``: the setup's native call, laid out before the fork."""
    return Setup(confinement, runtime, grants, fds, sent_with_job(confinement.host_channel, confinement.session),
                 prepared=False, native_call=native_call)


def prepared_setup(confinement: Confinement, runtime: Runtime, control: int, grants: list[int],
                   native_call: NativeCall | None = None) -> Setup:
    """In the template: what :func:`run_prepared` works on; ``control``: the child's end of its control socket.
    A child confined natively takes its job natively too (see :func:`_await_job`)."""
    hand_over = hand_over_call(CONTROL, (*handed_to_prepared(confinement.host_channel, confinement.session), 0),
                               _HANDED_NAME_TEXT[confinement.session], STAGING, MAX_FD,
                               MAX_FRAME) if runtime.native is not None else None
    return Setup(confinement, runtime, grants, [control], (CONTROL,), prepared=True, native_call=native_call,
                 hand_over=hand_over)


def run_job(setup: Setup) -> NoReturn:
    """A child forked for its job (``setup``: :func:`job_setup`, made by the template before the fork)."""
    failure = run_steps(setup, confine_steps(setup)) or run_steps(setup, READ)
    if failure is not None or setup.payload is None:
        _fail(setup, failure)
    _run_or_serve(setup.confinement, setup.payload)


def run_prepared(setup: Setup) -> NoReturn:
    """A child forked and confined ahead of its job, with the confinement of the job before (``setup``:
    :func:`prepared_setup`, made by the template before the fork).

    Once confined, it sends its seccomp listener to the server on ``control`` (or nothing, if its setup
    failed), then waits there. The server hands it a job only if that job's confinement is the same and
    its grants name the same files as ``grants``; the job's own descriptors (outputs, report, payload)
    arrive on ``control``. Confinement happened before the job existed, so its cost is off the job's
    critical path, and the payload is read only now: nothing of any earlier job was ever in this process
    beyond what the template holds. A setup failure is reported to the job it receives. A session's child is
    prepared the same way (by the template waiting for the next session, see server/sessions.py): its first
    step is the job it is handed, with the session's control channel, which takes the hand-over socket's place.
    """
    confinement = setup.confinement
    failure = run_steps(setup, confine_steps(setup))
    if failure is not None:
        _no_listener(setup.at(CONTROL))
    else:
        _warm_up(setup, hand_over=setup.hand_over is not None and setup.arranged)
    _await_job(setup)
    failure = failure or run_steps(setup, READ)
    if failure is not None or setup.payload is None:
        _fail(setup, failure)
    _run_or_serve(confinement, setup.payload)


# From the job's payload to its end in one function, and the failure's path in another, called only on a failure:
# each function a child runs that its template never ran writes its code object (a copy-on-write fault on the
# job's path, as the job's first call of each was).
def _run_or_serve(confinement: Confinement, payload: Payload) -> NoReturn:
    """Run the job as ``__main__``; a session's child runs its first step (which came as the job), then serves the
    next ones."""
    main = new_main(confinement, payload)
    if confinement.session:
        serve_session(confinement, main, StepSpec(code=payload.code or "", name=payload.name, args=payload.args,
                                                  return_value=payload.return_value, images=payload.images,
                                                  stream=payload.stream))
    try:
        report = execute(main, payload.code, payload.script, payload.name, payload.args, confinement,
                         return_value=payload.return_value, images=payload.images, stream=payload.stream)
    except BaseException as failure:  # the code broke what execute's end uses: the report says so, not exit 125
        report = Report(exit=1, error=unreported(failure))
    finish(REPORT, report, measured=True)


def _fail(setup: Setup, failure: str | None) -> NoReturn:
    """A step was not done (or the job could not be read): report why, where the job's report descriptor is now,
    and exit without running the code."""
    report = setup.at(REPORT)
    if report is None:  # no report descriptor came with the job: the exit status alone says it
        os._exit(SETUP_FAILED_EXIT)
    finish(report, Report(exit=SETUP_FAILED_EXIT, setup_error=failure or "could not read the job"))


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
    if setup.hand_over is not None and setup.arranged:
        # Natively (policy/_confine.c, take_job): the same frame read, the same name, the same check and the same
        # arrangement, in one call that writes none of the template's objects (the Python path below wrote ~30 of
        # its pages, each a copy-on-write fault on the job's path). Its control socket is at CONTROL, as the
        # call was laid out for, once confined.
        take_job, args = setup.hand_over
        if take_job(*args):
            os._exit(SETUP_FAILED_EXIT)  # no job came, the frame was not the protocol's, or a descriptor not placed
        return
    try:
        with socket.socket(fileno=control) as control_socket:
            _, fds = recv_raw(control_socket)
    except (EOFError, OSError, ValueError):
        os._exit(SETUP_FAILED_EXIT)  # discarded: no job will come
    try:
        _HANDED_NAMES[setup.confinement.session].take()
    except OSError:
        pass  # a name is for operators; the job runs all the same
    expected = handed_to_prepared(setup.confinement.host_channel, setup.confinement.session)
    if len(fds) != len(expected):
        os._exit(SETUP_FAILED_EXIT)  # the server broke its own protocol: run nothing rather than guess
    try:
        setup.handed(fds, expected)
    except OSError:
        os._exit(SETUP_FAILED_EXIT)


# A prepared child's name once its job arrived (by whether it is a session's), laid out in the template.
_HANDED_NAME_TEXT = {False: "pynox-job", True: "pynox-session"}
_HANDED_NAMES = {session: ProcessName(name) for session, name in _HANDED_NAME_TEXT.items()}
_READY_NAME = ProcessName("pynox-ready")  # a prepared child's name until then (setup.name_of)
# What the warm-up reads as its payload: a job's own path from the decoder on, without a descriptor.
_WARM_UP_PAYLOAD = encode_payload(Payload(code="print(1)", script=None, name="<warm-up>", args=[], env={},
                                          functions=[]))


def _rehearse_read(setup: Setup, reads: int) -> Payload:
    """The job's own READ step (setup._read_job: the payload read, the environment, the claim), on the warm-up's
    payload at PAYLOAD and a claim of its own at CLAIM: its functions run cold after the hand-over wrote their code
    objects, ~5 faults on the job's path. Both numbers are closed again by the step itself, before any job exists
    (the hand-over puts the job's own there). A job with host functions reads only its payload here: the step
    would install a host module on a channel that is not there yet."""
    if setup.confinement.host_channel or setup.payload is not None:
        return read_payload(reads)
    claim_reads, claim_writes = os.pipe()
    try:
        os.write(claim_writes, CLAIMED)
    finally:
        os.close(claim_writes)
    for fd, number in ((reads, PAYLOAD), (claim_reads, CLAIM)):
        if fd != number:
            os.dup2(fd, number)
            os.close(fd)
    failure = run_steps(setup, READ)
    payload, setup.payload = setup.payload, None
    if failure is not None or payload is None:
        raise RuntimeError(failure)
    return payload


def _warm_up(setup: Setup, *, hand_over: bool) -> None:
    """Run, before the job exists, the path every job runs once it has its payload: decode it, compile and
    run the code (``execute``, the job's own function), flush, encode and write the report; and, for a job
    with host functions, the call path.

    The child shares the template's memory copy-on-write; the first write to each page costs a fault
    (5-15 µs each on a VM, hundreds of them). Taking them now, while the child waits, keeps them off the
    job's critical path; running the job's own functions rather than a likeness of them takes those and no
    others, so the warm-up costs the child little more CPU than the job then saves. Output and report go to
    /dev/null: the job's own descriptors are not here yet."""
    confinement = setup.confinement
    try:
        # The payload read as the job's is (read_payload), from a pipe: its 64 KiB read buffer's heap pages and
        # the reader's code, ~7 faults.
        reads, writes = os.pipe()
        try:
            os.write(writes, _WARM_UP_PAYLOAD)
        finally:
            os.close(writes)
        payload = _rehearse_read(setup, reads)
        # The job's __main__ made as the job's is (new_main: sys.modules, sys.path; what is the same for every
        # job, display and the import system's finders, the template set up once, see execute.prepare_jobs):
        # the job's own new_main makes it again (a new module); only the package directories it adds to
        # sys.path are taken out again (new_main put them first), or the job would find them twice.
        main = new_main(confinement, payload)
        del sys.path[:len(confinement.package_dirs)]
        report = execute(main, payload.code, None, payload.name, payload.args, confinement)
        linecache.cache.pop(payload.name, None)  # execute's copy of the source, for tracebacks
        flush_streams()
        write_report(REPORT, report)
        if confinement.host_channel:
            pynox_host.warm_up(calls=2)
        if hand_over:  # the hand-over is one native call, which writes none of the template's objects
            return
        # The hand-over's receiving end (a socket object, recvmsg, a descriptor received), over a socketpair.
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        with ours, theirs:
            socket.send_fds(theirs, [pack(b"")], [theirs.fileno()])
            close_all(recv_raw(ours)[1])
        # The hand-over's renaming (ctypes' call path into libc, ~12 faults), to the name the child has already.
        _READY_NAME.take()
        # The hand-over's arranging (setup.arrange: its code and calls, ~10 faults), last, of the descriptors a
        # prepared child holds once confined (setup._arrange_descriptors: standard input, the outputs it warms up
        # on, its control socket) each onto its own number. Any other it held would be closed by the hand-over's
        # own arranging: this one closes nothing that one keeps. One not open fails its staging, before any move.
        arrange([(fd, fd) for fd in (0, *OUTPUTS, CONTROL)])
    except Exception:  # a warm-up is an optimisation: whatever fails here, the job still runs
        pass
