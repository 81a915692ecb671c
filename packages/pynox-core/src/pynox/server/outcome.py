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

__all__ = ["Outcome", "to_result", "to_session_result"]


@dataclass
class Outcome:
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
    # What the process used (see usage.py), and what the job did through the pool.
    cpu_us: int = 0
    max_rss_kb: int | None = 0
    delegated_cpu_us: int = 0  # the pool's own CPU answering the job's delegated calls (steward.py)
    # What the template's memory cgroup held above the job's start at its peak (None: no cgroup counts it),
    # and whether the kernel killed the job for reaching its limit there.
    memory_peak_kb: int | None = None
    memory_exceeded: bool = False
    # Killed for memory, not at its own limit but at its tenant's memory_budget: (tenant, budget in bytes).
    budget: tuple[str, int] | None = None
    shmem_kb: int = 0  # what the job added to its cgroup and left in shared memory and TCP buffers
    socket_kb: int = 0
    host_calls: int = 0
    stdout_bytes: int = 0
    stderr_bytes: int = 0
    # The process ended (always for a job; for a session step, the session is over).
    ended: bool = False
    # The code called sys.exit().
    exited: bool = False
    # The job broke the host-call protocol and was killed.
    protocol_violation: str | None = None
    # repr() of the code's trailing expression (see JobSpec.return_value).
    return_value: str | None = None
    # Why its process was killed while it ran: the client cancelled it, or the pool's shutdown stopped it.
    cancelled: str | None = None
    # It reached a process (False: cancelled while on its way to one, so nothing of it ran).
    handed_over: bool = True
    # Its figures as base64 PNGs (see figures.py), and how many were left out (over max_output in all).
    images: list[str] = field(default_factory=list)
    images_dropped: int = 0
    # Its rich outputs in order, as the pool took them from its display channel (see display.py).
    outputs: list[Output] = field(default_factory=list)

    def conclude(self, spec: JobSpec, timeout: float) -> None:
        """Turn a kill, a signal or a setup failure into the exit status and error the protocol promises."""
        if self.cancelled:
            self.exit = CANCELLED_EXIT
            how = "its process was killed" if self.handed_over else "before it reached a process; nothing of it ran"
            self.error = ErrorInfo(type="CancelledError", message=f"{self.cancelled}; {how}")
        elif self.protocol_violation is not None:
            self.exit = WORKER_ERROR_EXIT
            self.error = ErrorInfo(type="PoolWorkerError", message=f"the job was killed: {self.protocol_violation}")
        elif self.timed_out or self.signal == signal.SIGXCPU:
            self.exit = TIMEOUT_EXIT
            self.error = ErrorInfo(type="TimeoutError",
                                   message=f"the code did not finish within {format_duration(timeout)}",
                                   hint=hints.timeout_hint(timeout, spec.hint_style))
        elif self.memory_exceeded and self.budget is not None:
            tenant, budget = self.budget
            self.exit = 1  # a MemoryError, as for its own limit, but not of its own making
            self.error = ErrorInfo(type="MemoryError",
                                   message=f"the tenant {tenant!r} reached its memory budget of "
                                           f"{format_size(budget)} (its jobs and sessions together), and the "
                                           f"kernel killed this job to stay within it; the job's own memory limit "
                                           f"of {format_size(spec.memory)} was not reached",
                                   hint=f"Not this code's own limit: other jobs and sessions of the same tenant held "
                                        f"the memory. Retry once they finish, close idle sessions, or ask the "
                                        f"operator for a larger memory_budget of tenant {tenant!r}.")
        elif self.memory_exceeded:
            self.exit = 1  # as for the MemoryError a job's own allocation raises
            self.error = ErrorInfo(type="MemoryError",
                                   message=f"the job reached its memory limit of {format_size(spec.memory)}, as the "
                                           "kernel counts it (tmpfs pages and kernel buffers included), and the "
                                           "kernel killed it",
                                   hint=hints.memory_hint(spec.memory, spec.hint_style))
        elif self.setup_error is not None:
            self.exit = SETUP_FAILED_EXIT
            self.error = ErrorInfo(type="SandboxSetupError", message=self.setup_error)
        elif self.signal is not None:
            name = _signal_name(self.signal)
            self.error = ErrorInfo(type="SignalError", message=f"the process was killed by {name}",
                                   hint=_signal_hint(self.signal, spec))


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
        return hints.memory_hint(spec.memory, spec.hint_style) + " (killed without warning: memory is the usual cause)"
    if number == signal.SIGABRT:
        return "The process aborted (os.abort() or a failed assertion in native code)."
    return "The process was ended by a signal."


def _text(data: bytearray) -> str:
    return data.decode("utf-8", errors="replace")


AnyResult = TypeVar("AnyResult", bound=Result)


# The result's policy.network for each network mode of the job.
_NETWORK = {"none": "deny", "hosts": "hosts", "all": "allow"}


def _result(kind: type[AnyResult], request_id: RequestId, outcome: Outcome, spec: JobSpec, *, max_output: int,
            python: str, preloaded: list[str], landlock_abi: int, mode: str, queue_us: int) -> AnyResult:
    """The protocol result of ``outcome``, of the result type ``kind``; built field by field, so the type
    checker holds every field to the protocol's."""
    return kind(
        id=request_id, exit=outcome.exit, stdout=_text(outcome.stdout), stderr=_text(outcome.stderr),
        error=outcome.error, stdout_truncated=outcome.stdout_truncated,
        stderr_truncated=outcome.stderr_truncated, duration_ms=outcome.duration_us // 1000,
        duration_us=outcome.duration_us, queue_us=queue_us,
        runtime=ResultRuntime(name="pynox", python=python, mode=mode, preloaded_modules=preloaded),
        policy=ResultPolicy(
            allow_read=spec.allow_read, allow_write=spec.allow_write,
            network=_NETWORK[spec.network], subprocesses="deny",
            timeout_ms=round(spec.timeout * 1000), memory_bytes=spec.memory, max_output=max_output,
            max_file_size=spec.max_file_size, backend=BACKEND, landlock_abi=landlock_abi,
            hosts=spec.allow_hosts if spec.network == "hosts" else msgspec.UNSET,
        ),
        usage=Usage(cpu_ms=round(outcome.cpu_us / 1000, 3), max_rss_kb=outcome.max_rss_kb,
                    memory_peak_kb=outcome.memory_peak_kb, host_calls=outcome.host_calls,
                    stdout_bytes=outcome.stdout_bytes, stderr_bytes=outcome.stderr_bytes,
                    delegated_cpu_ms=round(outcome.delegated_cpu_us / 1000, 3) or msgspec.UNSET,
                    shmem_kb=outcome.shmem_kb or msgspec.UNSET, socket_kb=outcome.socket_kb or msgspec.UNSET),
        # Bounded where the report is read (report.py), like every value from the job. Unset fields stay
        # off the line: a trailing value only when asked for, figures only when there were some.
        return_value=outcome.return_value if spec.return_value else msgspec.UNSET,
        images=outcome.images if outcome.images else msgspec.UNSET,
        images_dropped=outcome.images_dropped if outcome.images_dropped else msgspec.UNSET,
        outputs=outcome.outputs if outcome.outputs else msgspec.UNSET,
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
