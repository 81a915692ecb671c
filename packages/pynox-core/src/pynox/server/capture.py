"""A job's output: its stdout, stderr, report and display pipes, read to EOF with a cap on each.

Past ``max_output`` a stream is still drained and counted, and what is read is
dropped, so a flood never blocks the job and ``usage`` still says how much it
wrote. The report is the child's word on how its code ended (and its figures,
at most ``max_output`` bytes of PNG, in base64); one larger than the child
ever writes is dropped whole (the exit status then speaks alone). Display frames are decoded and
bounded as they arrive (display.py). With a :class:`~.streaming.Streamer` (a request with ``stream``), what
is kept of each is also sent as it comes.

Two paths, the same rules: the native relay (``_relay.c``: the job's loop waits and reads its pipes in C,
without the GIL, and returns to Python only for what Python decides) where the extension loads, unless
``$PYNOX_NATIVE`` is ``0``; and this module's Python reads, the fallback, also taken by a request that streams
(each chunk is sent as it comes). tests/pool/test_native_relay.py runs the same jobs on both and compares.
"""

from __future__ import annotations

import os
from types import ModuleType

from ..errors import ConfigError
from ..policy.grants import close_all
from .display import DisplayReader, Shown
from .outcome import Gathering
from .streaming import Streamer

__all__ = ["MAX_REPORT", "Capture", "relay_load_error", "relay_native"]

_READ_CHUNK = 1 << 16  # as _relay.c's READ_CHUNK: both paths read the same chunks
MAX_REPORT = 1 << 20

_relay: ModuleType | None
_relay_error: str | None
try:
    from . import _relay  # type: ignore[attr-defined, no-redef]  # built by setup.py; optional
    _relay_error = None
except ImportError as exc:  # no compiler where the package was built, or a foreign build
    _relay, _relay_error = None, str(exc)


def relay_load_error() -> str | None:
    """Why the native relay cannot load here, or None when it can."""
    return _relay_error


def relay_native(native: bool | None) -> bool:
    """Whether a pool's jobs are relayed natively, from ``$PYNOX_NATIVE`` as read (``native``: see
    ``config.native_from_environment``): when the extension loads, unless it is ``0``; ``1`` requires it."""
    if native and _relay is None:
        raise ConfigError(f"$PYNOX_NATIVE=1, but the native relay cannot load: {_relay_error}")
    return native is not False and _relay is not None


class Capture:
    """The pool's read ends of one job's (or one session step's) pipes: stdout, stderr, report, display."""

    def __init__(self, reads: list[int], outcome: Gathering, max_output: int, *, return_value: bool = False,
                 streamer: Streamer | None = None, native: bool = False) -> None:
        """``native``: the relay in C reads the pipes (see :attr:`relay`), unless the request streams."""
        self.stdout, self.stderr, self.report_fd, self.display_fd = reads
        self.display = DisplayReader(max_output, return_value=return_value)
        self.streamer = streamer
        self.pipes = list(reads)
        # The job's output is over when stdout, stderr and the report are closed: a job that closes those and
        # stops (or hands them back) is done, whatever it does with its display channel, which is drained then.
        self._open = len(reads) - 1
        self._display_ended = False
        self.outcome = outcome
        self.max_output = max_output
        self._report = bytearray()
        self.report_limit = MAX_REPORT + 2 * max_output  # the figures, base64: 4/3 of their bytes
        # The native relay (_relay.c), which reads all four pipes and waits for the loop (see templates.py's
        # _Relayed); None: this module reads them, each chunk as the loop's poll finds it readable.
        self.relay = _relay.Relay(*reads, max_output, self.report_limit) \
            if native and streamer is None and _relay is not None else None
        self._kept = False  # what the relay kept was given to the outcome (see close)

    @property
    def open(self) -> int:
        """How many of stdout, stderr and the report are not at their end yet."""
        return self.relay.open if self.relay is not None else self._open

    @property
    def report(self) -> bytes | bytearray:
        """What is kept of the report so far."""
        return self.relay.report() if self.relay is not None else self._report

    def read(self, fd: int) -> bool:
        """Read what ``fd`` has; False at its EOF (the caller stops watching it). With the native relay, only
        the display channel comes here, with a chunk the relay read (its end is taken by drain_display)."""
        if self.relay is not None:
            self._shown(self.display.feed(self.relay.take_display()))
            return True
        chunk = os.read(fd, _READ_CHUNK)
        if not chunk:
            if fd == self.display_fd:
                self._display_ended = True
                self._shown(self.display.finish())
            else:
                self._open -= 1
            return False
        if fd == self.display_fd:
            self._shown(self.display.feed(chunk))
        elif fd == self.report_fd:
            if len(self._report) + len(chunk) > self.report_limit:
                self._report.clear()  # not a report the child wrote: ignored, the exit status still counts
            else:
                self._report += chunk
        else:
            self._keep(fd == self.stdout, chunk)
        return True

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
        if self.relay is not None and not self._display_ended and self.relay.counts()[5]:
            self._display_ended = True  # the relay read its end: every chunk before it was taken
            self._shown(self.display.finish())
        if self._display_ended:
            return
        os.set_blocking(self.display_fd, False)
        try:
            while chunk := os.read(self.display_fd, _READ_CHUNK):
                self._shown(self.display.feed(chunk))
        except BlockingIOError:
            pass
        self._display_ended = True
        self._shown(self.display.finish())

    def close(self) -> None:
        """Close the pipes; what the native relay kept is the outcome's from now on."""
        close_all(self.pipes)
        self.pipes = []
        relay, self._kept = self.relay if not self._kept else None, True
        if relay is not None:
            outcome = self.outcome
            outcome.stdout_bytes, outcome.stderr_bytes, stdout_cut, stderr_cut, _, _ = relay.counts()
            outcome.stdout_truncated |= stdout_cut
            outcome.stderr_truncated |= stderr_cut
            outcome.stdout += relay.stdout()
            outcome.stderr += relay.stderr()
