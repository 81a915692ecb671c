"""A job's output: its stdout, stderr and report pipes, read to EOF with a cap on each.

Past ``max_output`` a stream is still drained and counted, and what is read is
dropped, so a flood never blocks the job and ``usage`` still says how much it
wrote. The report is the child's word on how its code ended (and its figures,
at most ``max_output`` bytes of PNG, in base64); one larger than the child
ever writes is dropped whole (the exit status then speaks alone).
"""

from __future__ import annotations

import os

from ..policy.grants import close_all
from .outcome import Outcome

__all__ = ["MAX_REPORT", "Capture"]

_READ_CHUNK = 1 << 16
MAX_REPORT = 1 << 20


class Capture:
    """The pool's read ends of one job's (or one session step's) pipes: stdout, stderr, report."""

    def __init__(self, reads: list[int], outcome: Outcome, max_output: int) -> None:
        self.stdout, self.stderr, self.report_fd = reads
        self.pipes = list(reads)
        self.open = len(reads)
        self.outcome = outcome
        self.max_output = max_output
        self.report = bytearray()
        self.report_limit = MAX_REPORT + 2 * max_output  # the figures, base64: 4/3 of their bytes

    def read(self, fd: int) -> bool:
        """Read what ``fd`` has; False at its EOF (the caller stops watching it)."""
        chunk = os.read(fd, _READ_CHUNK)
        if not chunk:
            self.open -= 1
            return False
        if fd == self.report_fd:
            if len(self.report) + len(chunk) > self.report_limit:
                self.report.clear()  # not a report the child wrote: ignored, the exit status still counts
            else:
                self.report += chunk
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

    def close(self) -> None:
        close_all(self.pipes)
        self.pipes = []
