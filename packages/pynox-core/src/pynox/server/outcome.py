"""What happened to one job, and the protocol result that says so.

The exit status comes from the kernel (the template's ``wait4``), or, for a
job answered from its report, from the shape of that report (report.py), never
from a number the job wrote: a job can write anything on its report
descriptor, but it cannot fake having been killed, or not, and every verdict
here (timeout, cancellation, setup failure, worker failure) is set from what
the pool itself saw.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass, field
from typing import TypeVar

import msgspec

from .. import hints
from ..policy import BACKEND
from ..protocol import Output, RequestId, Result, ResultPolicy, ResultRuntime, SessionResult, Usage
from ..units import format_duration, format_size
from ..wire.exits import CANCELLED_EXIT, SETUP_FAILED_EXIT, TIMEOUT_EXIT, WORKER_ERROR_EXIT
from ..wire.spec import ErrorInfo, JobSpec

__all__ = ["Gathering", "Outcome", "to_result", "to_session_result", "traceback_at"]


class Outcome(msgspec.Struct, frozen=True):
    """What happened to one job (or session step), as its result says it: built once, never changed.

    Frozen from a :class:`Gathering` once the pool knows everything it will know of the job, or built whole
    for a job the pool answers itself (a worker error, a cancel before it ran). A frozen struct, not a frozen
    dataclass: the dataclass's ``__init__`` sets each of its 25 fields through ``object.__setattr__`` (~2 µs
    on every job's and every step's path, against ~0.5 µs)."""

    exit: int = 0
    error: ErrorInfo | None = None
    stdout: bytes = b""
    stderr: bytes = b""
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    timed_out: bool = False
    signal: int | None = None
    duration_us: int = 0
    # What the process used (see usage.py), and what the job did through the pool.
    cpu_us: int = 0
    max_rss_kb: int | None = 0
    delegated_cpu_us: int = 0  # the pool's own CPU answering the job's delegated calls (steward.py)
    # What the template's memory cgroup held above the job's start at its peak (None: no cgroup counts it).
    memory_peak_kb: int | None = None
    shmem_kb: int = 0  # what the job added to its cgroup and left in shared memory and TCP buffers
    socket_kb: int = 0
    host_calls: int = 0
    stdout_bytes: int = 0
    stderr_bytes: int = 0
    # The process ended (always for a job; for a session step, the session is over).
    ended: bool = False
    # The code called sys.exit().
    exited: bool = False
    # repr() of the code's trailing expression (see Payload.return_value).
    return_value: str | None = None
    # It reached a process (False: cancelled while on its way to one, so nothing of it ran).
    handed_over: bool = True
    # Its figures as base64 PNGs (see figures.py), and how many were left out (over max_output in all).
    images: tuple[str, ...] = ()
    images_dropped: int = 0
    # Its rich outputs in order, as the pool took them from its display channel (see display.py).
    outputs: tuple[Output, ...] = ()


@dataclass
class Gathering:
    """What the pool learns of one job while it serves it, filled in as it comes (templates.py reads the
    kernel's word and the job's report into it, capture.py its output), then frozen once into its
    :class:`Outcome` by :meth:`freeze`, which takes the verdict.

    The worker that ran the job freezes it (serve.py, sessions.py, runner.py), once it knows whether a cancel
    killed the job: the one thing it learns after the template is done with it."""

    exit: int = 0
    error: ErrorInfo | None = None
    stdout: bytearray = field(default_factory=bytearray)
    stderr: bytearray = field(default_factory=bytearray)
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    timed_out: bool = False
    signal: int | None = None
    setup_error: str | None = None
    duration_us: int = 0
    cpu_us: int = 0
    max_rss_kb: int | None = 0
    delegated_cpu_us: int = 0
    memory_peak_kb: int | None = None
    # Whether the kernel killed the job for reaching its memory limit in the template's memory cgroup.
    memory_exceeded: bool = False
    # Killed for memory, not at its own limit but at its tenant's memory_budget: (tenant, budget in bytes).
    budget: tuple[str, int] | None = None
    shmem_kb: int = 0  # what the job added to its cgroup and left in shared memory and TCP buffers
    socket_kb: int = 0
    host_calls: int = 0
    stdout_bytes: int = 0
    stderr_bytes: int = 0
    ended: bool = False
    exited: bool = False
    # The job broke the host-call protocol and was killed.
    protocol_violation: str | None = None
    return_value: str | None = None
    # Why its process was killed while it ran: the client cancelled it, or the pool's shutdown stopped it.
    cancelled: str | None = None
    handed_over: bool = True
    images: list[str] = field(default_factory=list)
    images_dropped: int = 0
    outputs: list[Output] = field(default_factory=list)

    def freeze(self, spec: JobSpec, timeout: float) -> Outcome:
        """The outcome: a kill, a signal or a setup failure turned into the exit status and error the protocol
        promises, and what was gathered, as it is now."""
        exit, error = self._verdict(spec, timeout)
        return Outcome(
            exit=exit, error=error, stdout=bytes(self.stdout), stderr=bytes(self.stderr),
            stdout_truncated=self.stdout_truncated, stderr_truncated=self.stderr_truncated,
            timed_out=self.timed_out, signal=self.signal, duration_us=self.duration_us, cpu_us=self.cpu_us,
            max_rss_kb=self.max_rss_kb, delegated_cpu_us=self.delegated_cpu_us,
            memory_peak_kb=self.memory_peak_kb, shmem_kb=self.shmem_kb, socket_kb=self.socket_kb,
            host_calls=self.host_calls, stdout_bytes=self.stdout_bytes, stderr_bytes=self.stderr_bytes,
            ended=self.ended, exited=self.exited, return_value=self.return_value, handed_over=self.handed_over,
            images=tuple(self.images), images_dropped=self.images_dropped, outputs=tuple(self.outputs),
        )

    @property
    def budget_killed(self) -> str | None:
        """The tenant whose memory_budget the verdict names (what the stats' budget_kills count, so that the count
        and the result agree), or None: not killed at a budget, or a verdict that outranks it (a cancel, a
        protocol violation, a timeout) says what happened instead."""
        if self.cancelled or self.protocol_violation is not None or self.timed_out or self.signal == signal.SIGXCPU:
            return None
        return self.budget[0] if self.memory_exceeded and self.budget is not None else None

    def _verdict(self, spec: JobSpec, timeout: float) -> tuple[int, ErrorInfo | None]:
        if self.cancelled:
            how = "its process was killed" if self.handed_over else "before it reached a process; nothing of it ran"
            return CANCELLED_EXIT, ErrorInfo(type="CancelledError", message=f"{self.cancelled}; {how}")
        if self.protocol_violation is not None:
            return WORKER_ERROR_EXIT, ErrorInfo(type="PoolWorkerError",
                                                message=f"the job was killed: {self.protocol_violation}")
        if self.timed_out or self.signal == signal.SIGXCPU:
            return TIMEOUT_EXIT, ErrorInfo(type="TimeoutError",
                                           message=f"the code did not finish within {format_duration(timeout)}",
                                           hint=hints.timeout_hint(timeout, spec.confinement.hint_style))
        if self.budget_killed is not None and self.budget is not None:
            tenant, budget = self.budget
            return 1, ErrorInfo(  # a MemoryError, as for its own limit, but not of its own making
                type="MemoryError",
                message=f"the tenant {tenant!r} reached its memory budget of {format_size(budget)} (its jobs and "
                        f"sessions together), and the kernel killed this job to stay within it; the job's own "
                        f"memory limit of {format_size(spec.confinement.memory)} was not reached",
                hint=f"Not this code's own limit: other jobs and sessions of the same tenant held the memory. Retry "
                     f"once they finish, close idle sessions, or ask the operator for a larger memory_budget of "
                     f"tenant {tenant!r}.")
        if self.memory_exceeded:
            return 1, ErrorInfo(  # as for the MemoryError a job's own allocation raises
                type="MemoryError",
                message=f"the job reached its memory limit of {format_size(spec.confinement.memory)}, as the "
                        "kernel counts it (tmpfs pages and kernel buffers included), and the kernel killed it",
                hint=hints.memory_hint(spec.confinement.memory, spec.confinement.hint_style))
        if self.setup_error is not None:
            return SETUP_FAILED_EXIT, ErrorInfo(type="SandboxSetupError", message=self.setup_error)
        if self.signal is not None:
            name = _signal_name(self.signal)
            return self.exit, ErrorInfo(type="SignalError", message=f"the process was killed by {name}",
                                        hint=_signal_hint(self.signal, spec))
        return self.exit, self.error


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _signal_hint(number: int, spec: JobSpec) -> str:
    if number == signal.SIGSEGV:
        return ("Native code crashed (segmentation fault), often a bad ctypes call or an extension module "
                "fed invalid data.")
    if number == signal.SIGKILL:
        return (hints.memory_hint(spec.confinement.memory, spec.confinement.hint_style)
                + " (killed without warning: memory is the usual cause)")
    if number == signal.SIGABRT:
        return "The process aborted (os.abort() or a failed assertion in native code)."
    return "The process was ended by a signal."


def _text(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


_TRACEBACK = "Traceback (most recent call last):"
# How Python joins the tracebacks of a chain (an exception raised while handling another).
_CHAINED = ("During handling of the above exception, another exception occurred:",
            "The above exception was the direct cause of the following exception:")


def traceback_at(stderr: str, error: ErrorInfo | None) -> int | None:
    """Where in ``stderr`` (characters) the traceback the job printed for ``error`` begins, chained ones
    included; None if the error has no traceback or stderr does not hold it (cut by max_output, say).

    Found here, once, where the result is made, so that no client parses stderr for it (the result's
    ``traceback_at``)."""
    if error is None or error.traceback is None:
        return None
    lines = stderr.splitlines(keepends=True)
    starts = [i for i, line in enumerate(lines) if line.rstrip("\n") == _TRACEBACK]
    if not starts:  # a SyntaxError's report has no stack: it starts at its file and line
        mark = f'  File "{error.file}", line '
        starts = [i for i, line in enumerate(lines) if line.startswith(mark)]
    if not starts:
        return None
    at = len(starts) - 1  # the last traceback, then each it was chained to, walking back: once over the starts
    while at > 0 and (start := starts[at]) >= 3 and lines[start - 3] == "\n" \
            and lines[start - 2].rstrip("\n") in _CHAINED and lines[start - 1] == "\n":
        at -= 1  # the start before it (lines start-3 to start-1 are no start)
    return sum(len(line) for line in lines[:starts[at]])


AnyResult = TypeVar("AnyResult", bound=Result)


# The result's policy.network for each network mode of the job.
_NETWORK = {"none": "deny", "hosts": "hosts", "all": "allow"}


def _result(kind: type[AnyResult], request_id: RequestId, outcome: Outcome, spec: JobSpec, *, max_output: int,
            python: str, preloaded: list[str], landlock_abi: int, mode: str, queue_us: int) -> AnyResult:
    """The protocol result of ``outcome``, of the result type ``kind``; built field by field, so the type
    checker holds every field to the protocol's."""
    confinement = spec.confinement
    stderr = _text(outcome.stderr)
    at = traceback_at(stderr, outcome.error)
    return kind(
        id=request_id, exit=outcome.exit, stdout=_text(outcome.stdout), stderr=stderr,
        error=outcome.error, stdout_truncated=outcome.stdout_truncated,
        stderr_truncated=outcome.stderr_truncated, duration_ms=outcome.duration_us // 1000,
        duration_us=outcome.duration_us, queue_us=queue_us,
        runtime=ResultRuntime(name="pynox", python=python, mode=mode, preloaded_modules=preloaded),
        policy=ResultPolicy(
            allow_read=confinement.allow_read, allow_write=confinement.allow_write,
            network=_NETWORK[confinement.network], subprocesses="deny",
            timeout_ms=round(confinement.timeout * 1000), memory_bytes=confinement.memory, max_output=max_output,
            max_file_size=confinement.max_file_size, backend=BACKEND, landlock_abi=landlock_abi,
            hosts=spec.payload.allow_hosts if confinement.network == "hosts" else msgspec.UNSET,
        ),
        usage=Usage(cpu_ms=round(outcome.cpu_us / 1000, 3), max_rss_kb=outcome.max_rss_kb,
                    memory_peak_kb=outcome.memory_peak_kb, host_calls=outcome.host_calls,
                    stdout_bytes=outcome.stdout_bytes, stderr_bytes=outcome.stderr_bytes,
                    delegated_cpu_ms=round(outcome.delegated_cpu_us / 1000, 3) or msgspec.UNSET,
                    shmem_kb=outcome.shmem_kb or msgspec.UNSET, socket_kb=outcome.socket_kb or msgspec.UNSET),
        # Bounded where the report is read (report.py), like every value from the job. Unset fields stay
        # off the line: a trailing value only when asked for, figures only when there were some.
        return_value=outcome.return_value if spec.payload.return_value else msgspec.UNSET,
        images=list(outcome.images) if outcome.images else msgspec.UNSET,
        images_dropped=outcome.images_dropped if outcome.images_dropped else msgspec.UNSET,
        outputs=list(outcome.outputs) if outcome.outputs else msgspec.UNSET,
        traceback_at=at if at is not None else msgspec.UNSET,
    )


def to_result(request_id: RequestId, outcome: Outcome, spec: JobSpec, *, max_output: int,
              python: str, preloaded: list[str], landlock_abi: int, mode: str, queue_us: int = 0) -> Result:
    return _result(Result, request_id, outcome, spec, max_output=max_output, python=python, preloaded=preloaded,
                   landlock_abi=landlock_abi, mode=mode, queue_us=queue_us)


def to_session_result(request_id: RequestId, outcome: Outcome, spec: JobSpec, *, max_output: int,
                      python: str, preloaded: list[str], landlock_abi: int, mode: str, queue_us: int,
                      session: str, step: int | None, session_ended: bool) -> SessionResult:
    result = _result(SessionResult, request_id, outcome, spec, max_output=max_output, python=python,
                     preloaded=preloaded, landlock_abi=landlock_abi, mode=mode, queue_us=queue_us)
    if step is not None and outcome.handed_over:
        # The step's number is its execution count, as a notebook numbers its cells, in its execute_result too.
        outputs = result.outputs
        if isinstance(outputs, list):
            outputs = [msgspec.structs.replace(output, execution_count=step)
                       if output.output_type == "execute_result" else output for output in outputs]
        return msgspec.structs.replace(result, session=session, step=step, session_ended=session_ended,
                                       execution_count=step, outputs=outputs)
    return msgspec.structs.replace(result, session=session, step=step, session_ended=session_ended)
