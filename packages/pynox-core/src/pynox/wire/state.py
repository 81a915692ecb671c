"""A session's saved state as it crosses from the job to the pool: the line the save step writes.

The save step (job/session_state.py) serializes ``__main__`` inside the confined process and writes one
line on its stdout: :data:`MARK`, then a JSON :class:`JobState`. The pool reads it as hostile input
(server/session_state.py): bounded by the step's output cap, decoded once into this type, never unpickled.
"""

from __future__ import annotations

import struct

import msgspec

__all__ = ["FORK_CODE", "FORK_PID", "MARK", "RESTORE_CODE", "SAVE_CODE", "JobState", "Skipped"]

# Starts the line that carries the state: a control character no print() of a value starts a line with.
MARK = "\x1epynox-state "

# The pool's own code for the save and restore steps; no name is bound in ``__main__`` by either.
SAVE_CODE = "__import__('pynox.job.session_state', fromlist=['save']).save()\n"
RESTORE_CODE = "__import__('pynox.job.session_state', fromlist=['restore']).restore()\n"
# A session fork's step (job/session_fork.py), and what its copy writes on its own control channel: its pid.
FORK_CODE = "__import__('pynox.job.session_fork', fromlist=['fork']).fork()\n"
FORK_PID = struct.Struct("=i")


class Skipped(msgspec.Struct, frozen=True):
    """A variable of ``__main__`` the save left out, and why (the pickler's words)."""

    name: str
    reason: str


class JobState(msgspec.Struct, forbid_unknown_fields=True):
    """What the save step reports: the pickled variables (``data``: base64 in JSON) and what it skipped."""

    data: bytes
    skipped: list[Skipped]
