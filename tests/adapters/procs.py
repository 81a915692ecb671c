"""Processes below the test process, read from /proc: what an agent run leaves behind.

The test process is a child subreaper while the adapter suite runs (see
``conftest.py``), so a process the pool orphans is re-parented here and is
still counted: nothing escapes the check by being adopted by init.
"""

from __future__ import annotations

import os
import time

from tests.harness import procfs
from tests.pool.pool_driver import PREPARED_PER_WORKER, READY_CHILD, ZYGOTE, prepared_for_a_session, walk

DEADLINE = 10.0  # a closed session or pool is gone well within this


def _table() -> dict[int, tuple[int, str, str]]:
    """pid -> (ppid, state, command line) for every process visible in /proc."""
    table: dict[int, tuple[int, str, str]] = {}
    for pid in procfs.pids():
        try:
            stat = procfs.stat(pid)
            command = procfs.read_bytes(pid, "cmdline").replace(b"\0", b" ").decode("utf-8", "replace").strip()
        except OSError:
            continue  # it ended while we looked
        table[pid] = (stat.ppid, stat.state, command)
    return table


def descendants(root: int | None = None, ignore: frozenset[int] = frozenset()) -> dict[int, tuple[int, int, str]]:
    """Live (non-zombie) processes below ``root`` (default: this process): pid -> (depth, parent, command line).

    Depth 1 is a pool server, 2 its templates, 3 a template's children. The processes in ``ignore``
    and everything below them are left out.
    """
    table = _table()
    found = walk(root if root is not None else os.getpid(), {pid: entry[0] for pid, entry in table.items()}, ignore)
    # A pool's zygote forks sessions' templates (server/zygote.py): they count as the pool's templates, below
    # the pool, and the zygote itself at depth 0 (no template, no pool), so only the leftover check sees it.
    zygotes = {pid for pid in found if _comm(pid) == ZYGOTE}

    def placed(pid: int) -> tuple[int, int]:
        depth, parent = found[pid]
        if pid in zygotes:
            return 0, parent
        above = parent
        while above in found:
            if above in zygotes:
                depth -= 1
                if parent == above:
                    parent = found[above][1]
            above = found[above][1]
        return depth, parent

    return {pid: (*placed(pid), table[pid][2]) for pid in found if table[pid][1] != "Z"}


def _comm(pid: int) -> str:
    try:
        return procfs.stat(pid).comm
    except OSError:
        return ""


def pynox_processes(ignore: frozenset[int] = frozenset()) -> dict[int, tuple[int, int, str]]:
    """The processes below this one that are Pynox's: pool servers, templates, jobs, sessions.

    ``ignore``: pools that were already running (another module's default pool, say) and their subtrees.
    """
    return {pid: entry for pid, entry in descendants(ignore=ignore).items() if "pynox" in entry[2]}


def running_pools() -> frozenset[int]:
    """The Pynox pool servers running below this process now: what a later check should leave out."""
    return frozenset(pid for pid, (depth, _parent, _command) in pynox_processes().items() if depth == 1)


def wait_for_idle(templates: int, ignore: frozenset[int] = frozenset(),
                  deadline: float = DEADLINE) -> dict[int, tuple[int, int, str]]:
    """Wait until the pools below us are idle: at most ``templates`` templates serving something, each with one
    child, or with no more than :data:`PREPARED_PER_WORKER` children all confined ahead ("pynox-ready").

    An idle template keeps children forked and confined ahead of the next job; beside them, a child of
    another name is a job still running. A session has a template of its own, so a session still open
    shows as one template too many. Once a pool has had a session, one more template waits for the next
    session, childless or with a child confined ahead for it: it is allowed here (one per pool), and the
    pool's close ends it (see :func:`wait_for_none`). Returns what is left.
    """
    end = time.monotonic() + deadline
    while True:
        left = pynox_processes(ignore)
        template_pids = [pid for pid, (depth, _parent, _command) in left.items() if depth == 2]
        children = [parent for depth, parent, _command in left.values() if depth == 3]
        deeper = [pid for pid, (depth, _parent, _command) in left.items() if depth > 3]
        serving = [pid for pid in template_pids if pid in children and not _waiting_for_a_session(pid, left)]
        pools = {parent for depth, parent, _command in left.values() if depth == 2}
        ready = [parent for pid, (depth, parent, _command) in left.items() if depth == 3 and _comm(pid) == READY_CHILD]
        if (len(serving) <= templates and len(template_pids) <= templates + len(pools) and not deeper
                and all(children.count(t) <= 1 or children.count(t) == ready.count(t) <= PREPARED_PER_WORKER
                        for t in template_pids)):
            return left
        if time.monotonic() > end:
            raise AssertionError(f"still running {deadline}s after the agent finished: {left}")
        time.sleep(0.05)


def _waiting_for_a_session(template: int, left: dict[int, tuple[int, int, str]]) -> bool:
    """A template whose only child was confined ahead for a session: the one waiting for the next session."""
    own = [pid for pid, (depth, parent, _command) in left.items() if depth == 3 and parent == template]
    return len(own) == 1 and _comm(own[0]) == READY_CHILD and prepared_for_a_session(own[0])


def wait_for_none(ignore: frozenset[int] = frozenset(), deadline: float = DEADLINE) -> None:
    """Wait until no Pynox process runs below this one, but those of ``ignore`` (after our pools closed)."""
    end = time.monotonic() + deadline
    while True:
        left = pynox_processes(ignore)
        if not left:
            return
        if time.monotonic() > end:
            raise AssertionError(f"Pynox processes left {deadline}s after the pool closed: {left}")
        time.sleep(0.05)
