"""A job's output: its stdout, stderr, report and display pipes, read to EOF with a cap on each.

Past ``max_output`` a stream is still drained and counted, and what is read is
dropped, so a flood never blocks the job and ``usage`` still says how much it
wrote. The report is the child's word on how its code ended (and its figures,
at most ``max_output`` bytes of PNG, in base64); one larger than the child
ever writes is dropped whole (the exit status then speaks alone). Display frames are decoded and
bounded as they arrive (display.py). With a :class:`~.streaming.Streamer` (a request with ``stream``), what
is kept of each is also sent as it comes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from ..policy.grants import close_all
from ..wire.frames import HEADER, REPORT_HEAD, STEP_REPORT
from .display import DisplayReader, Shown
from .outcome import Gathering
from .streaming import Streamer
from .waiting import readable

__all__ = ["MAX_REPORT", "Capture", "SessionStream"]

_READ_CHUNK = 1 << 16
_HUNG_UP_READS = 16  # a pipe's largest buffer an unprivileged job can set (fs.pipe-max-size, 1 MiB), read on hang-up
MAX_REPORT = 1 << 20


@dataclass
class SessionStream:
    """What a session's pool end of its report pipe, kept for the session's life, carries from one step to the
    next: the bytes read past a step's report (frames a thread the step left running showed after it), which are
    the next step's, and the serial the next step's report must bear."""

    carry: bytearray = field(default_factory=bytearray)
    serial: int = 0
    # A step's code closed every copy of one of the pipes (its end was read): the next step brings new ones.
    broken: bool = False


class Capture:
    """The pool's read ends of one job's (or one session step's) pipes: stdout, stderr, report, display."""

    def __init__(self, reads: list[int], outcome: Gathering, max_output: int, *, return_value: bool = False,
                 streamer: Streamer | None = None, session: SessionStream | None = None) -> None:
        # Three: a later session step's, whose display frames come on its report pipe (wire.frames.STEP_REPORT).
        self.stdout, self.stderr, self.report_fd = reads[:3]
        self.display_fd = reads[3] if len(reads) > 3 else None
        self.display = DisplayReader(max_output, return_value=return_value)
        self.streamer = streamer
        self.reads = list(reads)  # what the loop watches
        # What close() closes: a session keeps its stdout, stderr and report pipes for its life (only a first
        # step's display channel is its own).
        self.pipes = list(reads) if session is None else list(reads[3:])
        # The job's output is over when stdout, stderr and the report are closed: a job that closes those and
        # stops (or hands them back) is done, whatever it does with its display channel, which is drained then.
        # A session step's is over as soon as its whole report is read (its mark, its head, that many bytes):
        # then what stdout and stderr hold is read, and the step is over, whoever still holds a copy of its pipes.
        self.open = 3
        self._display_ended = False
        # On a report pipe that carries frames: the bytes of the frame being read still to come, the header
        # being read, and whether the report began (all that follows its mark is the report).
        self._frame_left = 0
        self._header = bytearray()
        self._in_report = self.display_fd is not None
        # A session step's report: its length once its mark and head are read (-1 while the head is read, None
        # before), and whether the first bytes of a first step's report pipe are still to be told apart: its mark
        # (a step's report), or a setup failure's report, which has no mark and ends with the pipe.
        self.session = session
        self._report_size: int | None = None
        self._first_bytes = session is not None and self._in_report
        self.outcome = outcome
        self.max_output = max_output
        self.report = bytearray()
        self.report_limit = MAX_REPORT + 2 * max_output  # the figures, base64: 4/3 of their bytes
        if session is not None and session.carry:  # read past the last step's report: this step's first bytes
            carried = bytes(session.carry)
            session.carry.clear()
            self._take(self.report_fd, carried)

    def read(self, fd: int, *, hung_up: bool = False) -> bool:
        """Read what ``fd`` has; False at its EOF, or once a session step's report is read from it (the caller stops
        watching it: what follows is the next step's).

        ``hung_up``: the poll said its write end is closed. Then what the pipe holds is most often all it will ever
        hold, so it is read to its end now: a job's pipes closing at its end cost one turn of the loop, not two.
        The pool's end is non-blocking (templates._job_descriptors): a job holding a read end of its own output
        (opened through /proc/self/fd) can empty the pipe first, or open a new write end through it; a read
        that finds nothing then returns to the loop, which watches on (and keeps the deadline)."""
        report = fd == self.report_fd and self.session is not None
        if report and not self.open:
            return False  # the step's report is read: what the pipe holds now is the next step's
        try:
            chunk = os.read(fd, _READ_CHUNK)
            for _ in range(_HUNG_UP_READS if hung_up else 0):  # bounded: a writer it reopened may write on
                if not chunk:
                    break
                self._take(fd, chunk)
                if report and not self.open:
                    return False
                # Read again even after a short read: a job may put its end in packet mode (O_DIRECT), where
                # each read returns one write, however much more the pipe holds.
                chunk = os.read(fd, _READ_CHUNK)
        except BlockingIOError:  # emptied by the job through a read end of its own, or a writer reopened by it
            return True
        if not chunk:
            if fd == self.display_fd or (fd == self.report_fd and self.display_fd is None):
                self._display_ended = True
                self._shown(self.display.finish())
            if fd != self.display_fd and self.open:
                self.open -= 1
                if self.session is not None:  # a session's pipe ended: its process died, or its code closed it
                    self.session.broken = True
                    if fd == self.report_fd:  # no report can come: the step is over (templates._enforce judges it)
                        self._over()
            return False
        self._take(fd, chunk)
        return not (report and not self.open)

    def _take(self, fd: int, chunk: bytes) -> None:
        if fd == self.display_fd:
            self._shown(self.display.feed(chunk))
        elif fd == self.report_fd:
            if not self._in_report or self._first_bytes:
                chunk = self._frames(chunk)
            if self._report_size is not None:
                self._step_report(chunk)
            elif len(self.report) + len(chunk) > self.report_limit:
                self.report.clear()  # not a report the child wrote: ignored, the exit status still counts
            else:
                self.report += chunk
        else:
            self._keep(fd == self.stdout, chunk)

    def _frames(self, chunk: bytes) -> bytes:
        """A later session step's report pipe: its display frames, each passed whole to the display reader (which
        bounds them), until the report's mark; what follows the mark is returned, the report's start (its head
        first). A first step's: its mark, or (not one) the start of a setup failure's report, returned whole."""
        view = memoryview(chunk)
        while view:
            if self._first_bytes:
                need = HEADER.size - len(self._header)
                self._header += view[:need]
                view = view[need:]
                if len(self._header) < HEADER.size:
                    break
                self._first_bytes = False
                if HEADER.unpack(self._header)[0] != STEP_REPORT:
                    header = bytes(self._header)
                    self._header.clear()
                    return header + bytes(view)
                self._header.clear()
                self._report_size = -1  # its mark is read: the report's head comes next
                return bytes(view)
            if self._frame_left:
                part = view[:self._frame_left]
                self._frame_left -= len(part)
                view = view[len(part):]
                self._shown(self.display.feed(bytes(part)))
                continue
            need = HEADER.size - len(self._header)
            self._header += view[:need]
            view = view[need:]
            if len(self._header) < HEADER.size:
                break
            (size,) = HEADER.unpack(self._header)
            header = bytes(self._header)
            self._header.clear()
            if size == STEP_REPORT:
                self._in_report = True
                self._report_size = -1  # its head comes first
                return bytes(view)
            self._frame_left = size
            self._shown(self.display.feed(header))
        return b""

    def _step_report(self, chunk: bytes) -> None:
        """A session step's report: its head (the step's serial, the report's length: REPORT_HEAD), then that many
        bytes; once all are read, stdout and stderr are read of what they hold and the step is over. A head that
        is not this step's (a report its code wrote itself, or an earlier step's after one it forged) or a length
        beyond what a child writes leaves no report: the step's process still runs, and the pool ends the session
        (see templates._enforce). Bytes after the report are the next step's (a frame a thread wrote after it)."""
        if self._report_size == -1:
            need = REPORT_HEAD.size - len(self._header)
            self._header += chunk[:need]
            chunk = chunk[need:]
            if len(self._header) < REPORT_HEAD.size:
                return
            serial, size = REPORT_HEAD.unpack(self._header)
            self._header.clear()
            expected = self.session.serial if self.session is not None else 0
            if size > self.report_limit or serial != expected & 0xFFFFFFFF:
                size = 0  # no report the pool takes: the step is over without one
                self.report.clear()
            self._report_size = size
        size = self._report_size
        if not self.open or size is None:
            return  # read after the step was over: not its own
        room = size - len(self.report)
        self.report += chunk[:room]
        if len(self.report) >= size:
            if self.session is not None and len(chunk) > room:
                self.session.carry += chunk[room:]
            self._over()

    def _over(self) -> None:
        """A session step's report is read whole (or cannot be): what its stdout and stderr hold is read now,
        without waiting for their ends (a copy of them the step's code kept would hold those until its
        deadline), and the step is over. What a thread of the step writes after this is read with the next step."""
        self.open = 0
        for fd in (self.stdout, self.stderr):
            try:
                for _ in range(_HUNG_UP_READS):  # bounded: a thread of the step's may still be writing
                    chunk = os.read(fd, _READ_CHUNK)
                    if not chunk:
                        break
                    self._keep(fd == self.stdout, chunk)
            except BlockingIOError:
                pass

    def _keep(self, is_stdout: bool, chunk: bytes) -> None:
        outcome = self.outcome
        buffer = outcome.stdout if is_stdout else outcome.stderr
        if is_stdout:
            outcome.stdout_bytes += len(chunk)
        else:
            outcome.stderr_bytes += len(chunk)
        room = self.max_output - len(buffer)
        if len(chunk) > room:
            chunk = chunk[: max(room, 0)]
            if is_stdout:
                outcome.stdout_truncated = True
            else:
                outcome.stderr_truncated = True
        buffer += chunk
        if self.streamer is not None and chunk:
            self.streamer.text("stdout" if is_stdout else "stderr", chunk)

    def _shown(self, outputs: list[Shown]) -> None:
        self.outcome.outputs = self.display.outputs
        if self.streamer is not None:
            for output, at in outputs:
                if output.output_type == "display_data":
                    self.streamer.display(output, at)

    def drain_display(self) -> None:
        """What the display channel still holds once the job's output is over, without waiting for it."""
        if self._display_ended:
            return
        if self.display_fd is None:  # on the report pipe, whose end the loop has not seen (a step killed)
            self._display_ended = True
            self._shown(self.display.finish())
            return
        # Asked first: a session's process holds its channel open until it hands it back after its report, and
        # what its code showed was read as the loop watched it, so most often nothing waits there. One poll then,
        # where a mode change and a read that fails (raising) cost two system calls and an exception per step.
        if readable(self.display_fd, 0):
            os.set_blocking(self.display_fd, False)
            try:
                for _ in range(_HUNG_UP_READS):  # bounded: a writer the job reopened through /proc may write on
                    chunk = os.read(self.display_fd, _READ_CHUNK)
                    if not chunk:
                        break
                    self._shown(self.display.feed(chunk))
            except BlockingIOError:
                pass
        self._display_ended = True
        self._shown(self.display.finish())

    def close(self) -> None:
        close_all(self.pipes)
        self.pipes = []
