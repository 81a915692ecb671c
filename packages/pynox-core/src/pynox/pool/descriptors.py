"""Where a job's descriptors live in its child, and the order the server sends them in.

The server sends a job's own descriptors with its confinement (then one per
granted path); the template passes them on untouched; the child puts each at
its number. Defined here once, for all three and for the session's steps.
"""

from __future__ import annotations

__all__ = [
    "CHANNEL", "CLAIM", "CONTROL", "LISTENER", "METADATA", "PAYLOAD", "REPORT", "RULESET", "STAGING", "STDERR",
    "STDOUT", "STEP", "sent_with_job",
]

STDOUT, STDERR, REPORT = 1, 2, 3
CHANNEL = 4  # host-function calls, when the job declares functions
CONTROL = 5  # session steps, when the job is a session (and, in a prepared child, the template's word)
RULESET = 6  # the Landlock ruleset, closed once enforced
PAYLOAD = 7  # the job's payload, read once confined
CLAIM = 8  # one byte: whoever reads it (the child, or the server taking it back) decides if the job runs
METADATA = 9  # a socket to the pool, which takes the seccomp listener on it (see pool/metadata.py)
LISTENER = 10  # where a prepared child keeps its listener until its job's descriptors arrive
STAGING = 16  # above every fixed number
# What each later step of a session brings: its own outputs and report.
STEP = (STDOUT, STDERR, REPORT)


def sent_with_job(host_channel: bool, session: bool) -> tuple[int, ...]:
    """The child's number for each of the job's own descriptors, in the order the server sends them."""
    return (STDOUT, STDERR, REPORT, PAYLOAD, CLAIM, METADATA) + ((CHANNEL,) if host_channel else ()) + (
        (CONTROL,) if session else ())
