"""The JSON Lines protocol of ``pynox pool``: message shapes and line parsing, with no I/O.

Every message the pool reads or writes is defined here. Parsing is strict:
unknown fields, wrong types and over-long lines are refused with a message
that says which field broke which rule, and the request's ``id`` is recovered
whenever the line was JSON at all, so the client can match the refusal.
"""

from __future__ import annotations

import json
import operator
import re
from typing import Any, Literal

import msgspec

from .errors import quoted
from .wire.exits import REFUSED_EXIT
from .wire.spec import ErrorInfo
from .wire.state import Skipped

__all__ = [
    "FILE_CHUNK",
    "IMPORTABLE_LISTED",
    "MAX_LINE",
    "CallEvent",
    "CancelAnswer",
    "Closed",
    "DisplayEvent",
    "Download",
    "Downloaded",
    "ErrorInfo",
    "FileChunk",
    "FilesListed",
    "Histogram",
    "JobLogLine",
    "Output",
    "PoolLogEvent",
    "ReadyEvent",
    "Reply",
    "ReplyBody",
    "Request",
    "Result",
    "ResultPolicy",
    "ResultRuntime",
    "ScratchFile",
    "Skipped",
    "StartError",
    "StartErrorEvent",
    "StatsEvent",
    "StreamEvent",
    "Upload",
    "Uploaded",
    "Usage",
    "decode_answer",
    "encode",
    "first_line_decoder",
    "parse_line",
    "refusal",
    "reply_call_id",
    "request_id_from_head",
    "session_refusal",
]

MAX_LINE = 1 << 20  # bytes, without the newline

RequestId = str | int | float | None
Units = str | int | float


class Upload(msgspec.Struct, forbid_unknown_fields=True):
    """A file (or a piece of one) into a session's scratch directory: ``data`` is base64. ``offset`` 0 creates
    the file or empties it first; any other offset must be the file's current size (the pieces of a file
    larger than one line come in order)."""

    path: str
    data: str
    offset: int = 0


class Download(msgspec.Struct, forbid_unknown_fields=True):
    """A file of a session's scratch directory, from ``offset`` on (one answer carries at most
    :data:`FILE_CHUNK` bytes of it)."""

    path: str
    offset: int = 0


# Bytes of a file one download answer carries (as base64, well under the 1 MiB line a client may keep to).
FILE_CHUNK = 512 << 10


class Request(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """One request line. Exactly one of ``code`` and ``script`` (or ``stats``/``close`` alone)."""

    id: RequestId = None
    code: str | None = None
    script: str | None = None
    name: str | None = None
    args: list[str] | None = None
    allow_read: list[str] | None = None
    allow_write: list[str] | None = None
    allow_network: bool | None = None
    # TCP to these hosts and ports only (see pynox.hosts); allow_network, if true, grants all of it.
    allow_hosts: list[str] | None = None
    env: dict[str, str] | None = None
    timeout: Units | None = None
    memory: Units | None = None
    max_output: Units | None = None
    max_file_size: Units | None = None
    package_dirs: list[str] | None = None
    # Distributions the pool installs for this job before it starts ("numpy", "pandas>=2,<3"; see
    # pynox.requirements), under the [pool.limits] ceiling; the job imports them, it never installs anything.
    packages: list[str] | None = None
    # A session's: a step's `%pip install NAME` line asks the pool to install NAME for this session, under
    # the same ceiling as packages.
    pip_install: bool | None = None
    profile: str | None = None
    functions: list[str] | None = None
    # The host functions are also globals of the code: "call" (as from pynox_host) or "await" (as from
    # pynox_host.aio), as CodeAct-style agents write their tool calls.
    host_globals: Literal["call", "await"] | None = None
    return_value: bool | None = None
    session: str | None = None
    # With ``session``: true, this request opens the session (a code-only first request opens one too, with
    # the pool's defaults); false, it is a later step of a session the client holds, refused rather than
    # run in a new process when the pool holds no session under the name (see server/ended.py).
    open: bool | None = None
    close: bool | None = None
    stats: bool | None = None
    cancel: str | int | float | None = None
    # A scratch directory the pool owns, for this session (or job): the code's working directory, granted for
    # writing to it alone, removed when it ends (see pynox.server.scratch).
    scratch: bool | None = None
    # Files in and out of a session's scratch directory (each alone, with id and session).
    upload: Upload | None = None
    download: str | Download | None = None
    files: bool | None = None
    # A session's state (see server/session_state.py). ``save``: true, alone with id and session, serializes
    # the session's variables inside its process; the answer's ``state`` carries them. ``restore``: a state
    # (base64) a save of a pool with the same key gave, on the request that opens the session (with its
    # grants, without code): its variables are loaded inside the new process, under the grants it brings.
    save: bool | None = None
    restore: str | None = None
    # A session fork (see server/session_fork.py): alone with id, session and timeout, the name of a new
    # session opened as a copy of this one's live process (its variables, grants and limits).
    fork: str | None = None

    # Output as it happens: stream and display_data events for this request before its result (a job, or
    # one session step).
    stream: bool | None = None
    # How long this job may wait for a worker, from the moment the pool read its line; past it, it is refused
    # ("the pool is saturated"). Else its profile's, else [pool] queue_timeout (see server/admission.py).
    queue_timeout: Units | None = None
    # W3C trace context ("00-<trace id>-<parent id>-<flags>"): carried into the request's job log line.
    traceparent: str | None = None

    def file_request(self) -> bool:
        """Whether this is a request for a session's files (upload, download or files)."""
        return self.upload is not None or self.download is not None or self.files is not None

    def grant_fields(self) -> list[str]:
        """The permission and limit fields this request sets (a session step may set none of them). Asked twice
        on each session step's path: read in one call, and named only if one is set."""
        values = _grant_values(self)
        if values.count(None) == len(values):
            return []
        return [name for name, value in zip(_GRANT_FIELDS, values, strict=True) if value is not None]


_GRANT_FIELDS = ("allow_read", "allow_write", "allow_network", "allow_hosts", "env", "memory", "max_file_size",
                 "package_dirs", "packages", "pip_install", "profile", "functions", "host_globals", "script",
                 "scratch")
_grant_values = operator.attrgetter(*_GRANT_FIELDS)


class ReplyBody(msgspec.Struct, forbid_unknown_fields=True):
    """Exactly one of ``result`` (any JSON value, null included) and ``error``; the other stays unset."""

    call_id: int
    result: Any = msgspec.UNSET
    error: str | msgspec.UnsetType | None = msgspec.UNSET


class Reply(msgspec.Struct, forbid_unknown_fields=True):
    """The client's answer to a host-function call event."""

    reply: ReplyBody


class ResultRuntime(msgspec.Struct):
    name: str
    python: str
    mode: str
    preloaded_modules: list[str]


class ResultPolicy(msgspec.Struct):
    allow_read: list[str]
    allow_write: list[str]
    network: str
    subprocesses: str
    timeout_ms: int
    memory_bytes: int
    max_output: int
    max_file_size: int | None
    backend: str
    landlock_abi: int
    # With network "hosts": the allow_hosts entries, one port each (left off the line otherwise).
    hosts: list[str] | msgspec.UnsetType = msgspec.UNSET


class Usage(msgspec.Struct, frozen=True):
    """What the job's process used, as the kernel counts it (see server/usage.py); a session step's
    ``cpu_ms`` is that step's, its ``max_rss_kb`` the process's peak so far (None: the process was gone
    before it could be measured, and the template did not say). ``memory_peak_kb``: what the job's memory
    cgroup held above its start at its peak, tmpfs pages and kernel buffers included (for a session, since
    its start); None where no cgroup counts a job's memory (``pynox check`` says)."""

    cpu_ms: float = 0.0
    max_rss_kb: int | None = 0
    memory_peak_kb: int | None = None
    host_calls: int = 0
    stdout_bytes: int = 0
    stderr_bytes: int = 0
    # Each on the line only when not 0. CPU the pool spent answering the job's delegated calls (metadata,
    # sysinfo, connect), on a thread of its own; what the job added to its memory cgroup and left there at
    # its end in shared memory (tmpfs and memfd pages) and in TCP buffers (within memory_peak_kb on v2; a
    # budget of their own on v1).
    delegated_cpu_ms: float | msgspec.UnsetType = msgspec.UNSET
    shmem_kb: int | msgspec.UnsetType = msgspec.UNSET
    socket_kb: int | msgspec.UnsetType = msgspec.UNSET


class Output(msgspec.Struct, kw_only=True):
    """One rich output, as nbformat shapes it: ``display_data`` (display(), a figure) or ``execute_result``
    (the trailing value, with the cell's ``execution_count``: a session's step, null for a job). ``data``
    maps MIME types to values: text as a string, JSON types as JSON, binary types (image/png) as base64."""

    output_type: Literal["display_data", "execute_result"]
    data: dict[str, Any]
    metadata: dict[str, Any] = msgspec.field(default_factory=dict)
    execution_count: int | msgspec.UnsetType | None = msgspec.UNSET


class Result(msgspec.Struct, omit_defaults=False):
    id: RequestId
    exit: int
    stdout: str = ""
    stderr: str = ""
    error: ErrorInfo | None = None
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    duration_ms: int = 0
    duration_us: int = 0
    queue_us: int = 0
    runtime: ResultRuntime | None = None
    policy: ResultPolicy | None = None
    usage: Usage | None = None
    # Only in the result of a request that asked for it (return_value: true): repr() of the value of the
    # code's trailing expression, or null.
    return_value: str | msgspec.UnsetType | None = msgspec.UNSET
    # Only when the code made figures (matplotlib): each a base64 PNG, at most max_output bytes of PNG in
    # all; images_dropped counts those left out over that size.
    images: list[str] | msgspec.UnsetType = msgspec.UNSET
    images_dropped: int | msgspec.UnsetType = msgspec.UNSET
    # Only when the code displayed something or asked for its trailing value and it had one: its rich
    # outputs in order, display_data and execute_result (see Output), bounded by max_output in all.
    outputs: list[Output] | msgspec.UnsetType = msgspec.UNSET
    # Only in the result of a request the pool refused before anything ran: true. Set by the pool alone
    # (a job's report reaches no field of the result but error, exit and its values), so a client tells
    # "refused, never ran" from "ran" by this, never by exit and error.type, which a job once could forge.
    refused: bool | msgspec.UnsetType = msgspec.UNSET
    # Only for a job that asked for a scratch directory: the files it left there, each with its content
    # (base64; null for one left out over the result's bounds), before the directory was removed.
    files: list[ScratchFile] | msgspec.UnsetType = msgspec.UNSET
    # Only when stderr holds the traceback Python printed for the error that ended the code: where it begins
    # (an index into stderr, in characters), chained tracebacks included. What comes before it is what the
    # code wrote itself; the error sums up the rest.
    traceback_at: int | msgspec.UnsetType = msgspec.UNSET


class SessionResult(Result):
    session: str | None = None
    step: int | None = None
    session_ended: bool = False
    # Only on the first step of a session opened under a name whose earlier session the pool ended (a
    # timeout, a crash, an exit, session_idle, a cancel past its grace): why. The state is gone.
    session_reopened: str | msgspec.UnsetType = msgspec.UNSET
    # Only on a step a cancel interrupted (KeyboardInterrupt) that ended within the interrupt grace: true.
    # The session and its variables live on. Set by the pool, never read from the job's report.
    interrupted: bool | msgspec.UnsetType = msgspec.UNSET
    # A session step that ran: its number in the session, as a notebook's In [n] (the step's).
    execution_count: int | msgspec.UnsetType | None = msgspec.UNSET
    # Only in the answer to a save that worked: the session's state (base64; give it back as ``restore``),
    # and the variables left out of it, each with the reason.
    state: str | msgspec.UnsetType = msgspec.UNSET
    skipped: list[Skipped] | msgspec.UnsetType = msgspec.UNSET
    # Only in the answer to a fork that worked: the name of the copy, an open session of its own.
    forked: str | msgspec.UnsetType = msgspec.UNSET


class ScratchFile(msgspec.Struct, omit_defaults=True):
    """A regular file of a scratch directory: its path there, size, mtime (seconds since the epoch) and MIME
    type as guessed from its name; ``data`` (base64) only where an answer carries its content."""

    path: str
    size: int
    mtime: float
    mime: str
    data: str | msgspec.UnsetType | None = msgspec.UNSET


class FilesListed(msgspec.Struct):
    """The answer to ``{"session": S, "files": true}``: every regular file of its scratch directory."""

    id: RequestId
    session: str
    files: list[ScratchFile]


class Uploaded(msgspec.Struct):
    """The answer to an upload: the file as it now is."""

    id: RequestId
    session: str
    uploaded: ScratchFile


class FileChunk(msgspec.Struct):
    """A piece of a file: ``data`` (base64) from ``offset``; ``eof``: it reaches the file's end."""

    path: str
    size: int
    mtime: float
    mime: str
    offset: int
    data: str
    eof: bool


class Downloaded(msgspec.Struct):
    """The answer to a download."""

    id: RequestId
    session: str
    downloaded: FileChunk


class StreamEvent(msgspec.Struct, kw_only=True, tag_field="event", tag="stream"):
    """Output as it happens (a request with ``stream``): a chunk of the code's stdout or stderr, as Jupyter
    names it. Chunks are coalesced (every 50 ms or 4 KiB) and count against max_output; the result that
    follows still carries all of it."""

    id: RequestId
    name: Literal["stdout", "stderr"]
    text: str
    session: str | msgspec.UnsetType = msgspec.UNSET


class DisplayEvent(msgspec.Struct, kw_only=True, tag_field="event", tag="display_data"):
    """A display output as it happens (a request with ``stream``); the result's ``outputs`` has it too."""

    id: RequestId
    data: dict[str, Any]
    metadata: dict[str, Any] = msgspec.field(default_factory=dict)
    session: str | msgspec.UnsetType = msgspec.UNSET


class Closed(msgspec.Struct):
    id: RequestId
    session: str
    closed: bool = True


class CancelAnswer(msgspec.Struct):
    """The answer to ``{"cancel": ID}`` when it found the job: its own result follows (or came first),
    as cancelled."""

    id: RequestId
    cancelled: RequestId


# Names the ready event's ``importable`` lists at most (then "and N more"): a model reads them in a description.
IMPORTABLE_LISTED = 60


class ReadyEvent(msgspec.Struct, kw_only=True, tag_field="event", tag="ready"):
    """The pool's first line, once every worker's template is ready. The client reads what is there: a
    field a pool does not send (a stand-in, an older version) takes its default."""

    workers: int
    runtime: str = "pynox"
    python: str = ""
    preloaded_modules: list[str] = []
    package_dirs: list[str] = []
    config: str | None = None
    profiles: list[str] = []
    landlock_abi: int = 0
    backend: str = ""
    # Each per-job bound this setup cannot give (no pids or memory cgroup), as a sentence; empty: all hold.
    bounds_not_in_force: list[str] = []
    # Where the interpreter and its packages live: no write grant may overlap them (a tool checks its
    # grants against them when it is made, rather than at each run).
    runtime_paths: list[str] = []
    # The longest timeout (seconds) a request that names none may get, from the default, the profiles and the
    # ceiling: how long a client waits for an answer without reading the pool's config. 0: not said (a
    # stand-in, an older version); the client then assumes the default.
    longest_timeout: float = 0.0
    # The top-level modules a job can import beyond the standard library, the preloaded ones first (bounded:
    # a model reads them in its tool's description); and whether requests may name packages to install.
    importable: list[str] = []
    installs_packages: bool = False
    # [pool] queue_timeout in seconds (0: none): how long a job that names none may wait for a worker; a client
    # bounds its own wait for a slot by it too.
    queue_timeout: float = 0.0


class StartError(msgspec.Struct):
    type: str = ""
    message: str = ""


class StartErrorEvent(msgspec.Struct, tag_field="event", tag="error"):
    """The pool's first and only line when it cannot start."""

    error: StartError = msgspec.field(default_factory=StartError)


first_line_decoder = msgspec.json.Decoder(ReadyEvent | StartErrorEvent)


class Histogram(msgspec.Struct, kw_only=True):
    """A distribution in fixed buckets, as a Prometheus histogram: ``counts[i]`` observations were at most
    ``le[i]`` seconds (cumulative, so the last bucket, +Inf, is ``count``); ``sum`` is their total."""

    le: list[float] = []
    counts: list[int] = []
    count: int = 0
    sum: float = 0.0


class StatsEvent(msgspec.Struct, kw_only=True):
    """The answer to ``{"stats": true}``: counters since the pool started, and gauges of this moment. A field
    a pool does not send (an older version) takes its default."""

    id: RequestId
    event: Literal["stats"] = "stats"
    uptime_ms: int
    workers: int
    sessions_active: int
    jobs: int
    ok: int
    failed: int
    timeouts: int
    signals: int
    setup_errors: int
    request_errors: int
    worker_errors: int
    cancelled: int
    host_calls: int
    duration_ms_total: int
    queue_us_total: int
    errors: dict[str, int]
    # CPU the pool spent answering jobs' delegated calls (see Usage.delegated_cpu_ms).
    delegated_cpu_ms_total: float = 0.0
    # Who answered: the pool's process and version.
    pid: int = 0
    version: str = ""
    # Saturation, at this moment: workers running a job, jobs waiting for one (and the most that wait before
    # intake stops reading), requests accepted and not yet answered (jobs and session steps), the session cap.
    busy_workers: int = 0
    queued: int = 0
    queue_capacity: int = 0
    in_flight: int = 0
    max_sessions: int = 0
    draining: bool = False  # input ended or a signal came: accepted work finishes, nothing new is read
    template_restarts: int = 0  # worker templates started to replace one that died or broke
    sessions_opened: int = 0  # sessions started since the pool did
    sessions_closed: int = 0  # sessions that ended, for any reason (closed, timed out, crashed, idle, shutdown)
    sessions_expired: int = 0  # of those, closed for being idle past session_idle
    # Latency of every result that was not refused: its run (duration_us) and its wait for a worker (queue_us).
    duration_seconds: Histogram = msgspec.field(default_factory=Histogram)
    queue_seconds: Histogram = msgspec.field(default_factory=Histogram)
    # Jobs and session steps the kernel killed because their tenant's jobs and sessions together reached its
    # memory_budget (not their own memory limit), by tenant; a tenant with none is not named.
    budget_kills: dict[str, int] = msgspec.field(default_factory=dict)


class JobLogLine(msgspec.Struct, kw_only=True):
    """One line on stderr per finished job (``log = "json"``): identifiers, outcome, timing; never output."""

    ts_ms: int
    event: Literal["job"] = "job"
    id: RequestId
    session: str | None
    step: int | None
    exit: int
    error: str | None
    message: str | None
    duration_ms: int
    queue_us: int
    network: str | None
    truncated: bool
    usage: Usage | None
    # The tenant of the request's connection (see server/tenants.py; "default" on stdin), the profile it ran
    # under (a session step: the one its session was opened with; null: none), and the W3C trace context the
    # request carried, so that an operator follows an agent's request into the pool; null when there is none.
    tenant: str | None = None
    traceparent: str | None = None
    profile: str | None = None


PoolEventName = Literal["start", "ready", "start_error", "signal", "drain", "stop", "exit", "template_error",
                        "config_warning", "bound_not_in_force", "log", "template_died", "template_replaced",
                        "zygote_died", "listening"]


class PoolLogEvent(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A line on stderr (``log = "json"``) about the pool itself: its lifecycle (``start``, ``ready``, a
    ``signal`` it received, the ``drain`` it began, the ``stop`` of what was left, its ``exit`` and
    ``status``), a ``start_error``, a template that failed to start (``retry`` counts the attempts at a
    replacement), a config file's warning, or a record of the pool's own Python logging (``log``, with its
    ``level``)."""

    ts_ms: int
    event: PoolEventName
    message: str
    retry: int | None = None
    pid: int | None = None
    status: int | None = None
    level: str | None = None


class CallEvent(msgspec.Struct, tag_field="event", tag="call"):
    id: RequestId
    call_id: int
    function: str
    args: list[Any]
    kwargs: dict[str, Any]


_encoder = msgspec.json.Encoder()


def encode(message: msgspec.Struct | dict[str, Any]) -> bytes:
    """One output line, newline included."""
    return _encoder.encode(message) + b"\n"


_REPLY_HEAD = re.compile(rb'\s*\{\s*"reply"\s*:\s*\{\s*"call_id"\s*:\s*(\d{1,18})\s*[,}]')


Answer = (SessionResult | CallEvent | StatsEvent | Closed | CancelAnswer | FilesListed | Uploaded | Downloaded
          | StreamEvent | DisplayEvent)


class _Kind(msgspec.Struct):
    """What tells one answer line from another: its ``event``, whether it is ``closed``, and which of the
    other answers' own fields it has (kept as raw bytes: the rest of the line is skipped, not built)."""

    event: Any = None
    closed: Any = None
    exit: msgspec.Raw = msgspec.Raw()
    cancelled: msgspec.Raw = msgspec.Raw()
    files: msgspec.Raw = msgspec.Raw()
    uploaded: msgspec.Raw = msgspec.Raw()
    downloaded: msgspec.Raw = msgspec.Raw()


_kind_decoder = msgspec.json.Decoder(_Kind)
_event_decoders: dict[str, msgspec.json.Decoder[Any]] = {
    "call": msgspec.json.Decoder(CallEvent), "stats": msgspec.json.Decoder(StatsEvent),
    "stream": msgspec.json.Decoder(StreamEvent), "display_data": msgspec.json.Decoder(DisplayEvent)}
_closed_decoder = msgspec.json.Decoder(Closed)
_cancel_decoder = msgspec.json.Decoder(CancelAnswer)
_files_decoder = msgspec.json.Decoder(FilesListed)
_uploaded_decoder = msgspec.json.Decoder(Uploaded)
_downloaded_decoder = msgspec.json.Decoder(Downloaded)
_result_decoder = msgspec.json.Decoder(SessionResult)


def decode_answer(line: bytes) -> Answer:
    """One line the pool wrote after its ready event, as the client reads it: a host-function call, the
    stats event, output as it happens (stream, display_data), a closed session, or a result
    (a session step's carries its session fields). One path for every line: its kind is read first
    (:class:`_Kind`), then the line is decoded once, straight into that kind's struct. Raises
    ``msgspec.DecodeError`` (or ``ValidationError``) for a line that is none of these."""
    return _decoder_for(_kind_decoder.decode(line)).decode(line)  # type: ignore[no-any-return]


def _decoder_for(kind: _Kind) -> msgspec.json.Decoder[Any]:
    if kind.event is not None:
        decoder = _event_decoders.get(kind.event) if isinstance(kind.event, str) else None
        if decoder is None:
            raise msgspec.ValidationError(f"unknown event {kind.event!r}")
        return decoder
    if kind.exit:  # a result: whatever else it carries
        return _result_decoder
    if kind.closed is True:
        return _closed_decoder
    if kind.cancelled:
        return _cancel_decoder
    if kind.files:
        return _files_decoder
    if kind.uploaded:
        return _uploaded_decoder
    if kind.downloaded:
        return _downloaded_decoder
    return _result_decoder


_REQUEST_HEAD = re.compile(rb'\s*\{\s*"id"\s*:\s*("(?:[^"\\]|\\.){0,256}"|-?\d{1,18})\s*[,}]')


def request_id_from_head(head: bytes) -> RequestId:
    """The id of a request line too long to parse, from its first bytes only, when the id comes first (as
    the Python client writes it): its refusal then reaches the caller waiting for it."""
    match = _REQUEST_HEAD.match(head)
    if match is None:
        return None
    try:
        value = msgspec.json.decode(match.group(1))
    except msgspec.DecodeError:
        return None
    return value if isinstance(value, str | int) else None


def reply_call_id(head: bytes) -> int | None:
    """The call a reply line answers, from its first bytes only (for a line too long to parse): a
    client that writes ``call_id`` first, as the Python client does, still gets its call answered."""
    match = _REPLY_HEAD.match(head)
    return int(match.group(1)) if match else None


def refusal(request_id: RequestId, message: str) -> Result:
    """The result of a request refused before anything ran."""
    return Result(id=request_id, exit=REFUSED_EXIT, error=ErrorInfo(type="RequestError", message=message),
                  refused=True)


def session_refusal(request_id: RequestId, message: str, *, session: str, session_ended: bool) -> SessionResult:
    """The result of a session request refused before anything ran: which session it was for, and whether the
    pool holds none under that name (``session_ended``: a refused first request, whose client must forget
    the name)."""
    return SessionResult(id=request_id, exit=REFUSED_EXIT, error=ErrorInfo(type="RequestError", message=message),
                         refused=True, session=session, session_ended=session_ended)


class LineError(Exception):
    """A line that is not a valid request; ``request_id`` is recovered when the line was JSON."""

    def __init__(self, request_id: RequestId, message: str) -> None:
        super().__init__(message)
        self.request_id = request_id


def _find_id(raw: Any) -> RequestId:
    if isinstance(raw, dict):
        candidate = raw.get("id")
        if isinstance(candidate, str | int | float) and not isinstance(candidate, bool):
            return candidate
    return None


def parse_line(line: bytes) -> Request | Reply:
    """Parse one line (without its newline). Raises :class:`LineError` with a message for the client."""
    if len(line) > MAX_LINE:
        raise LineError(None, f"line of {len(line)} bytes exceeds the {MAX_LINE}-byte limit; it was discarded")
    reply = _parse_reply(line) if _REPLY_START.match(line) else None
    if reply is not None:
        return reply
    request = _parse_request(line)
    if request is not None:
        return request
    try:
        raw = msgspec.json.decode(line)
    except msgspec.DecodeError as exc:
        raise LineError(None, f"not valid JSON: {exc}") from None
    except RecursionError:  # msgspec recurses per nesting level; "[" * 1000 is enough
        raise LineError(None, "not valid JSON: nested too deeply") from None
    if not isinstance(raw, dict):
        raise LineError(None, f"a request must be a JSON object, got {type(raw).__name__}")
    request_id = _find_id(raw)
    duplicate = _duplicate_key(line, raw)
    if duplicate is not None:
        # The last one would win here; a filter in front of the pool may have read the first.
        raise LineError(request_id, f"duplicate key {quoted(duplicate)}: every key may appear once")
    try:
        if "reply" in raw:
            reply = msgspec.convert(raw, Reply)
            _check_reply(reply)
            return reply
        request = msgspec.convert(raw, Request)
    except msgspec.ValidationError as exc:
        raise LineError(request_id, f"invalid request: {exc}") from None
    except RecursionError:
        raise LineError(request_id, "invalid request: nested too deeply") from None
    _check_shape(request)
    return request


_KEY = re.compile(rb'"\s*:')
_REPLY_START = re.compile(rb'\s*\{\s*"reply"\s*:')
_reply_decoder = msgspec.json.Decoder(Reply)


def _parse_reply(line: bytes) -> Reply | None:
    """A reply line (one whose first key is ``reply``: no request has that key) decoded once, straight into
    :class:`Reply`, with the same duplicate-key rule as every line; None when it is not a valid reply, for
    :func:`parse_line`'s general path to say why in its own words."""
    try:
        reply = _reply_decoder.decode(line)
    except Exception:  # whatever it is, the general path reads it again and names the rule it broke
        return None
    body = reply.reply
    keys = 2 + (body.result is not msgspec.UNSET) + (body.error is not msgspec.UNSET)  # reply, call_id
    if keys + _count_keys(body.result) != len(_KEY.findall(line)):
        duplicate = _exact_duplicate_key(line)
        if duplicate is not None:
            raise LineError(None, f"duplicate key {quoted(duplicate)}: every key may appear once")
    _check_reply(reply)
    return reply


_request_decoder = msgspec.json.Decoder(Request)


def _parse_request(line: bytes) -> Request | None:
    """A valid request decoded once, straight into :class:`Request` (the usual line), with the same duplicate-key
    rule and shape checks as every line; None when it is not one, for :func:`parse_line`'s general path to read
    again and say why in its own words (a request id recovered, the rule it broke named)."""
    try:
        request = _request_decoder.decode(line)
    except Exception:  # whatever it is, the general path reads it again
        return None
    # Each field given counts one key, and env its own (a null field counts none, nor do the keys of a nested
    # object: the count is then short, and the exact parse decides).
    given = msgspec.structs.astuple(request)
    keys = len(given) - given.count(None) + (len(request.env) if request.env else 0)
    if keys != len(_KEY.findall(line)):
        duplicate = _exact_duplicate_key(line)
        if duplicate is not None:
            raise LineError(request.id, f"duplicate key {quoted(duplicate)}: every key may appear once")
    _check_shape(request)
    return request


def _check_reply(reply: Reply) -> None:
    body = reply.reply
    if body.result is not msgspec.UNSET and body.error is not msgspec.UNSET:
        raise LineError(None, f"reply to call {body.call_id}: give result or error, not both")
    if body.result is msgspec.UNSET and body.error is msgspec.UNSET:
        raise LineError(None, f"reply to call {body.call_id}: give a result or an error; the call "
                              "is still waiting for one")


def _count_keys(value: Any) -> int:
    """Keys of every object in ``value``, at any depth."""
    keys, pending = 0, [value]
    while pending:
        item = pending.pop()
        if isinstance(item, dict):
            keys += len(item)
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
    return keys


def _duplicate_key(line: bytes, raw: Any) -> str | None:
    """A key that appears twice in one object of ``line``, at any depth, or None.

    Every key is a string followed by a colon, so a line holds at least as many of those as it has
    keys; when the decoded value counts as many, no key was merged away and the line is let through
    without a second parse (the usual case). Otherwise the line is parsed again, keeping pairs."""
    if _count_keys(raw) == len(_KEY.findall(line)):
        return None
    return _exact_duplicate_key(line)


def _exact_duplicate_key(line: bytes) -> str | None:
    """The first key that appears twice in one object of ``line``, found by a parse that keeps pairs."""
    found: list[str] = []

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        seen: set[str] = set()
        for key, _ in items:
            if key in seen and not found:
                found.append(key)
            seen.add(key)
        return dict(items)

    try:
        json.loads(line, object_pairs_hook=pairs)
    except (ValueError, RecursionError):  # msgspec read it: a stricter parser's doubt is not the client's
        return None
    return found[0] if found else None


def _check_shape(request: Request) -> None:
    def refuse(message: str) -> LineError:
        return LineError(request.id, message)

    if request.stats:
        extra = [f for f in request.__struct_fields__ if f not in ("id", "stats") and getattr(request, f) is not None]
        if extra:
            raise refuse(f"a stats request takes only id, got {', '.join(extra)}")
        return
    if request.cancel is not None:
        extra = [f for f in request.__struct_fields__ if f not in ("id", "cancel") and getattr(request, f) is not None]
        if extra:
            raise refuse(f"a cancel request takes only id and cancel, got {', '.join(extra)}")
        return
    # Checked here, on the name as the client gave it: a listening pool's tag makes the pool's own name longer.
    if request.session is not None and not 1 <= len(request.session) <= 256:
        raise refuse("session: a name of 1 to 256 characters is required")
    if request.file_request():
        given = [f for f in ("upload", "download", "files") if getattr(request, f) is not None]
        extra = [f for f in request.__struct_fields__
                 if f not in ("id", "session", "upload", "download", "files") and getattr(request, f) is not None]
        if request.session is None:
            raise refuse(f"{given[0]} needs the session whose scratch directory it is for")
        if len(given) > 1 or extra:
            raise refuse(f"a {given[0]} request takes only id and session, got {', '.join([*given[1:], *extra])}")
        if request.files is not None and request.files is not True:
            raise refuse("files must be true")
        return
    if request.open is not None and request.session is None:
        raise refuse("open needs the session to open")
    if request.save is not None:
        extra = [f for f in request.__struct_fields__
                 if f not in ("id", "session", "save", "timeout") and getattr(request, f) is not None]
        if request.save is not True:
            raise refuse("save must be true")
        if request.session is None:
            raise refuse("save needs the session whose state it saves")
        if extra:
            raise refuse(f"a save request takes only id, session and timeout, got {', '.join(extra)}")
        return
    if request.fork is not None:
        extra = [f for f in request.__struct_fields__
                 if f not in ("id", "session", "fork", "timeout") and getattr(request, f) is not None]
        if request.session is None:
            raise refuse("fork needs the session it copies")
        if not request.fork or len(request.fork) > 256:
            raise refuse("fork: the copy's name, of 1 to 256 characters, is required")
        if request.fork == request.session:
            raise refuse("fork: the copy needs a name of its own, not the session's")
        if extra:
            raise refuse(f"a fork request takes only id, session, fork and timeout, got {', '.join(extra)}")
        return
    if request.restore is not None:
        if request.session is None:
            raise refuse("restore needs the session it opens")
        if request.code is not None or request.script is not None or request.open is False:
            raise refuse("restore opens a session with the state and nothing else: it takes no code or script, "
                         "and no open: false (send the code as the session's next step)")
        return
    if request.close:
        if request.session is None:
            raise refuse("close needs the session to close")
        extra = [f for f in request.__struct_fields__
                 if f not in ("id", "session", "close") and getattr(request, f) is not None]
        if extra:
            raise refuse(f"a close request takes only id and session, got {', '.join(extra)}")
        return
    if (request.code is None) == (request.script is None):
        raise refuse("exactly one of code and script is required")
    if request.name is not None and (not request.name or "\0" in request.name):
        raise refuse("name must be a non-empty file name without NUL")
