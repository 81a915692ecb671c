"""A job as the server resolved it, the two halves it is sent in, and the report the child writes back.

The server turns a protocol request (relative paths, units, profile, ceiling)
into a :class:`JobSpec`: absolute paths, seconds and bytes, nothing left to
interpret. It holds the two halves it travels in, made once as the request is
resolved, which never meet in the template:

* :class:`Confinement`, what the template needs to confine a child: grants,
  limits, identity. The template keeps it (and may confine the next child
  with it), so it carries nothing a job said, only what it was allowed.
* :class:`Payload`, what the job says: code, arguments, environment, the names
  of its host functions. It goes from the server straight to the confined
  child on a descriptor of its own; the template passes the descriptor on
  unread, so no process a later job is forked from ever holds it.

The child answers with one :class:`Report` on its report descriptor.
"""

from __future__ import annotations

from typing import Literal

import msgspec

__all__ = ["MAX_GRANTS", "MAX_OPEN_FILES", "Confinement", "ErrorInfo", "Frame", "JobSpec", "NetworkMode", "Payload",
           "Report", "StepSpec"]

# Descriptors a job may hold open at once (its RLIMIT_NOFILE).
MAX_OPEN_FILES = 1024
# Granted paths per job (reads, writes, package directories, the script): each travels as a descriptor.
MAX_GRANTS = 128
# What a job's sockets may reach: nothing, the hosts of its allow_hosts (the pool connects each socket to a
# listed address, see pynox.server.steward), or everything the host can reach.
NetworkMode = Literal["none", "hosts", "all"]


class Confinement(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Everything that shapes a child's confinement, and nothing else: where it runs, what it may touch and
    what it may use (the result's policy reports these), and how it is confined.

    Two jobs with equal confinements whose granted paths name the same files can share a child
    confined ahead of time. ``allow_read`` and ``allow_write`` travel with one descriptor each, opened
    by the server when the job starts: the rules are built from those, never by name in the template."""

    cwd: str
    allow_read: list[str]
    allow_write: list[str]
    network: NetworkMode
    timeout: float
    memory: int
    max_file_size: int | None
    package_dirs: list[str]
    # The job has a host-call channel (descriptor 4); which functions it may call is in its payload.
    host_channel: bool
    max_open_files: int
    uid: int | None
    gid: int | None
    # A session child serves steps on its control channel until it is closed.
    session: bool
    # How hints name a grant: keyword arguments ("api") or command-line flags ("cli").
    hint_style: Literal["api", "cli"]
    # Threads the job may run, bounded by its template's pids cgroup; None where nothing bounds them.
    max_tasks: int | None = None
    # The pool installs packages a request names: a ModuleNotFoundError's hint names the packages grant.
    installs_packages: bool = False


class Payload(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """What the job itself says; read by the confined child, never by the template."""

    code: str | None
    script: str | None
    name: str
    args: list[str]
    env: dict[str, str]
    functions: list[str]
    # Report repr() of a trailing expression statement (the request's return_value).
    return_value: bool = False
    # Bytes of PNG the job's figures may come back as, in all (its max_output); 0: none. Its display
    # outputs are bounded by the same number.
    images: int = 0
    # Output as it happens (the request's stream): stdout is line-buffered, so the pool sees each line as
    # it is written.
    stream: bool = False
    # The host functions as globals of __main__ too: called, or awaited (see protocol.Request).
    host_globals: Literal["call", "await"] | None = None
    # With network "hosts": the names the job's resolver answers, and their addresses (see job/resolver.py),
    # resolved by the pool as the job starts (server/templates.py); None otherwise.
    pinned: dict[str, list[str]] | None = None
    # With network "hosts": the allow_hosts entries, one port each, as the result's policy lists them.
    allow_hosts: list[str] = []


class JobSpec(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A job as the pool resolved it: its two halves, made once where the request is resolved
    (:meth:`pynox.grants.Grants.job`), and what of it is the pool's alone and travels in neither."""

    confinement: Confinement
    payload: Payload
    # The pool's scratch directory of this session or job (also its cwd and a write grant), or None; the pool
    # alone reads it: it reaches the confinement only as cwd and grant, the payload as $PYNOX_SCRATCH.
    scratch: str | None = None
    # The packages the pool installs before the job starts (the pool adds their environment to package_dirs;
    # see pynox.server.packages); whether its pool installs any is the confinement's installs_packages.
    packages: list[str] = []
    # A session opened with pip_install: the directory its `%pip install` lines install into (granted
    # read-only, on sys.path); the pool's, never sent to the template or the job.
    pip_dir: str | None = None


class StepSpec(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One step of a session: only code and how to name it; permissions were fixed by the first request."""

    code: str
    name: str
    args: list[str]
    return_value: bool = False
    images: int = 0
    stream: bool = False
    # A session fork's step (see job/session_fork.py): its frame brings the copy's end of its own control channel,
    # put at FORK_CONTROL, with host functions the copy's end of its own host-call channel, put at FORK_CHANNEL,
    # and the write ends of the copy's own stdout, stderr and report pipes, put at FORK_OUTPUTS.
    fork: bool = False
    # The step's number in its session, which its report's head repeats (wire.frames.STEP_REPORT): a report
    # that is not this step's (one the code wrote itself, then the step's own after it) is none the pool takes.
    serial: int = 0
    # The frame brings new stdout, stderr and report pipes for the session (first, before a fork's): an earlier
    # step's code closed every copy of one of them.
    outputs: bool = False


class Frame(msgspec.Struct, omit_defaults=False):
    """One entry of an error's traceback, outermost first: a frame of the job's own code (its file, line and
    source line; ``column`` for a SyntaxError, 1-based), or, with ``omitted`` > 0 and the rest null, that
    many frames in between that are not the job's own code (a library's), collapsed."""

    file: str | None
    line: int | None
    source: str | None
    column: int | None = None
    omitted: int = 0


class ErrorInfo(msgspec.Struct, omit_defaults=False):
    type: str
    message: str
    file: str | None = None
    line: int | None = None
    path: str | None = None
    hint: str | None = None
    # Where an exception of the job's code was raised (None for the pool's own errors: timeouts, kills).
    traceback: list[Frame] | None = None


class Report(msgspec.Struct):
    """What the child says about its own end. ``setup_error`` means the code never ran."""

    exit: int
    error: ErrorInfo | None = None
    setup_error: str | None = None
    # The process ends with this report: the code called sys.exit() (no error), or, with an error, a session step's
    # code took what the child needs to serve another step. In a session, the session ends with this step.
    exited: bool = False
    # repr() of the trailing expression's value, when asked and it was not None.
    return_value: str | None = None
    # The figures the code showed or left open, base64 PNG ("" for one over the size limit).
    images: list[str] = []
