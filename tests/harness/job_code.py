"""Job code the fault suites share: what a job does to the descriptors the pool gave its child, written once.

The child keeps a copy of its report descriptor (3) and of a session's control channel (5) at numbers of its own,
so that code closing or replacing one of those numbers does not cost the job its report or the session its next
step. A test whose job means to close or replace the channel itself (to forge a report, to stop reading its
steps) does it to every copy: they are found as the job finds them, by the open file each descriptor is.
"""

from __future__ import annotations

__all__ = ["CLOSE_OUTPUTS", "each_copy_of"]


def each_copy_of(fd: int, action: str) -> str:
    """Job code that runs ``action`` (one statement on ``_fd``) for ``fd`` and for every other descriptor the job
    holds on the same open file (the listing's own, closed by then, is skipped)."""
    return (f"import os as _os\n_file = _os.fstat({fd})\n"
            "for _fd in sorted(map(int, _os.listdir('/proc/self/fd'))):\n"
            "    try:\n        _found = _os.fstat(_fd)\n    except OSError:\n        continue\n"
            "    if (_found.st_dev, _found.st_ino) == (_file.st_dev, _file.st_ino):\n"
            f"        {action}\n")


# Close stdout, stderr and the report, every copy of it included: what the pool reads of the report is what the
# job wrote on it before.
CLOSE_OUTPUTS = "import os as _os\n_os.close(1)\n_os.close(2)\n" + each_copy_of(3, "_os.close(_fd)")
