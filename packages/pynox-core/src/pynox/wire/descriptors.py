"""Where a job's descriptors live in its child, and the order the server sends them in.

The server sends a job's own descriptors with its confinement (then one per
granted path) to the template, which passes them on untouched, or hands them
to a child prepared ahead itself; the child puts each at its number. Defined
here once, for all three and for the session's steps.
"""

from __future__ import annotations

__all__ = [
    "CHANNEL", "CLAIM", "CONTROL", "DISPLAY", "FORK_CHANNEL", "FORK_CONTROL", "FORK_OUTPUTS", "METADATA", "OUTPUTS",
    "PAYLOAD", "REPORT", "RULESET", "STAGING", "STDERR", "STDOUT", "STEP", "handed_to_prepared", "sent_with_job",
]

STDOUT, STDERR, REPORT = 1, 2, 3
CHANNEL = 4  # host-function calls, when the job declares functions
CONTROL = 5  # session steps, when the job is a session (in a prepared child: the server's hand-over)
RULESET = 6  # the Landlock ruleset, closed once enforced
PAYLOAD = 7  # the job's payload, read once confined
CLAIM = 8  # one byte: whoever reads it (the child, or the server taking it back) decides if the job runs
METADATA = 9  # a socket to the pool, which takes the seccomp listener on it (see server/steward.py)
# Rich display: the MIME bundles of display() and of a trailing value, as length-prefixed frames (see
# job/display.py, which writes them, and server/display.py, the one place that reads them).
DISPLAY = 10
# A session fork's step: the copy's end of its own control channel, until the copy puts it at CONTROL.
FORK_CONTROL = 11
# And, for a session with host functions, the copy's end of its own host-call channel, until it is put at CHANNEL.
FORK_CHANNEL = 12
STAGING = 16  # above every fixed number
# A job's outputs, report and display channel: what a prepared child holds as /dev/null until its job's arrive
# (job/setup.py, and the native call's layout in policy/), and what a session's first step has.
OUTPUTS = (STDOUT, STDERR, REPORT, DISPLAY)
# A session's outputs: its first step's stdout, stderr and report pipes, which it keeps for its life (a later step
# brings none; its display frames come on the report pipe, before its report: wire.frames.STEP_REPORT).
STEP = (STDOUT, STDERR, REPORT)
# A session fork's step: the copy's own stdout, stderr and report pipes, until the copy puts them at STEP.
FORK_OUTPUTS = (13, 14, 15)


def sent_with_job(host_channel: bool, session: bool) -> tuple[int, ...]:
    """The child's number for each of the job's own descriptors, in the order the server sends them."""
    return (STDOUT, STDERR, REPORT, DISPLAY, PAYLOAD, CLAIM, METADATA) + ((CHANNEL,) if host_channel else ()) + (
        (CONTROL,) if session else ())


def handed_to_prepared(host_channel: bool, session: bool = False) -> tuple[int, ...]:
    """The same for a job handed to a prepared child: no metadata socket, as the child sent its listener
    on its control socket when it was confined; a session's first step brings the session's control
    channel, which takes the hand-over socket's number."""
    return (STDOUT, STDERR, REPORT, DISPLAY, PAYLOAD, CLAIM) + ((CHANNEL,) if host_channel else ()) + (
        (CONTROL,) if session else ())
