"""How long each part of a job's report may be: the pool's bounds, and the child's own cuts within them.

The pool bounds every string and list of a report it reads (server/report.py), whatever the child wrote. The
child cuts what it writes a little shorter (job/report.py), by :data:`NOTE_ROOM` characters: its cut adds a note
of how much was cut ("... (1234 more characters)"), and a report over the pool's bound for one part would have
that part cut again by the pool, the child's note with it. One home for both sides, so that they cannot drift.
"""

from __future__ import annotations

__all__ = ["MAX_ERROR_TYPE", "MAX_FRAMES", "MAX_HINT", "MAX_MESSAGE", "MAX_PATH", "MAX_SETUP", "MAX_SOURCE",
           "NOTE_ROOM", "within"]

# Characters of each string the pool takes from a report.
MAX_ERROR_TYPE = 128  # a class name; Python's longest builtin is 25
MAX_MESSAGE = 4000
MAX_PATH = 4096  # PATH_MAX: an error's file and path, a frame's file
MAX_HINT = 8000  # a path hint lists the grants
MAX_SOURCE = 1000  # one line of source in a traceback entry
MAX_SETUP = 4000
# Traceback entries: the child keeps its outermost and innermost ten frames and counts the middle in one.
MAX_FRAMES = 21
# The longest note a cut adds: "... (" and " more characters)" around a count of up to 10 digits (a string of
# 10**10 characters is beyond any job's memory).
NOTE_ROOM = 32


def within(bound: int) -> int:
    """The child's cut for a part the pool bounds at ``bound``: its note included, the part stays within it."""
    return bound - NOTE_ROOM
