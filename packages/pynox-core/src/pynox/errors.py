"""Exceptions raised by Pynox itself.

A failure of the *sandboxed* code (it raised, timed out, hit a limit, was
denied a path) is never an exception: it is a :class:`pynox.Result`. These
exceptions are for our failures and for misuse by the host application::

    PynoxError
    ├── ConfigError            a bad pynox.toml, a bad unit, a bad option
    ├── RequestError           a request the pool refuses before anything runs
    ├── KernelSupportError     this kernel cannot enforce the policy (fail closed)
    ├── SandboxSetupError      the policy could not be applied to one job
    ├── PoolError              the pool process or a template broke
    │   └── PoolWorkerError    one worker (template) died under a job
    ├── JobError               raised only on request, by Result.raise_for_error()
    ├── SessionStateError      a session's save or restore did not work (the state, not the request)
    └── HostError              raised by a host function, on purpose: its message reaches the job

The names ``RequestError``, ``SandboxSetupError`` and ``PoolWorkerError`` are
also the ``error.type`` strings of the matching results in the protocol.
"""

from __future__ import annotations

__all__ = [
    "START_ERRORS",
    "ConfigError",
    "HostError",
    "JobError",
    "KernelSupportError",
    "PoolError",
    "PoolWorkerError",
    "PynoxError",
    "RequestError",
    "SandboxSetupError",
    "SessionStateError",
]


class PynoxError(Exception):
    """Base class of every exception Pynox raises."""


class ConfigError(PynoxError, ValueError):
    """A configuration value, file or option is invalid."""


class RequestError(PynoxError, ValueError):
    """A request was refused before anything ran: malformed, or outside the ceiling."""


class KernelSupportError(PynoxError):
    """The kernel lacks a feature the policy needs; Pynox refuses to run code unconfined."""


class SandboxSetupError(PynoxError):
    """Applying the policy to a job failed, so its code never ran."""


class PoolError(PynoxError):
    """The pool process or one of its templates failed."""


class PoolWorkerError(PoolError):
    """A worker (template process) died or misbehaved while serving a job.

    ``started`` says whether the job's process had been created: a job that
    never started may safely be retried, one that started may not (its side
    effects may have happened).
    """

    def __init__(self, message: str, *, started: bool = True, transient: bool = False) -> None:
        super().__init__(message)
        self.started = started
        # The template died (was killed, ran out of memory) rather than failed a check: starting
        # another may work, where a preload that cannot be imported would fail again.
        self.transient = transient


class JobError(PynoxError):
    """The sandboxed code failed; raised only by :meth:`pynox.Result.raise_for_error`. ``result`` has the details."""

    def __init__(self, message: str, *, result: object) -> None:
        super().__init__(message)
        self.result = result


class SessionStateError(PynoxError):
    """A session's state could not be saved (over the pool's max_session_state, its process ended) or restored
    (its unpickling raised in the new process: a module it names is missing there, say). Its
    ``error.type`` in the protocol is ``SessionStateError`` where the pool says it, else the job's own."""


class HostError(PynoxError):
    """Raise it in a host function to fail the call with this message, shown to the job as
    ``pynox_host.HostError``. Any other exception reaches the job only as its type, unless the pool or
    tool was made with ``host_errors="full"`` (see :mod:`pynox.client.host_functions`)."""


# What a pool's start-error event may name (its error.type), and the exception the client raises for it.
START_ERRORS: dict[str, type[PynoxError]] = {cls.__name__: cls for cls in (KernelSupportError, ConfigError,
                                                                           PoolWorkerError)}

_QUOTED = 80  # characters of a caller's value quoted back in a message


def quoted(value: object) -> str:
    """``repr(value)``, cut to a readable length: a message never echoes a megabyte of input back."""
    return cut(repr(value))


def cut(text: str) -> str:
    """``text`` (a caller's path, a name) as it is, if it is short; its start and its length if not."""
    return text if len(text) <= _QUOTED else f"{text[:_QUOTED]}... ({len(text)} characters)"
