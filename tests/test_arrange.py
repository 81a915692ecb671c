"""setup.arrange, directly: each source at its target, whatever the numbers, and nothing else left open.

Each case runs in a subprocess of its own (arrange closes every other descriptor): descriptors are opened at
chosen numbers (each a pipe's read end, told apart by its inode), arranged, then each target's inode and every
number left open are written out. The warm-up's case (each descriptor onto itself, as a prepared child's warm-up
arranges them: job/child.py) keeps them all. The chain (one move's target is the next one's source) and the cycle
fail if a target overwrites a source still to be moved; the control shows that a naive order of dup2 does that.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

_CASE = """
import json, os, sys
from pynox.job.setup import arrange
moves = [tuple(move) for move in json.loads(sys.argv[1])]
inode = {}
for source in sorted({source for source, _ in moves}):  # a pipe of its own at each source's number
    read, write = os.pipe()
    inode[source] = os.fstat(read).st_ino
    if read != source:
        os.dup2(read, source)
        os.close(read)
    if write != source:  # else the read end is there now
        os.close(write)
if sys.argv[3] == "naive":
    for source, target in moves:
        os.dup2(source, target)
    arrange([(target, target) for _, target in moves])
else:
    arrange(moves)
open_now, landed = [], {}
for fd in range(64):
    try:
        landed[fd] = os.fstat(fd).st_ino
        open_now.append(fd)
    except OSError:
        pass
right = all(landed.get(target) == inode[source] for source, target in moves)
with open(sys.argv[2], "w") as out:
    json.dump({"right": right, "open": open_now}, out)
"""

_CASES = {
    "apart": [(20, 1), (21, 2), (22, 3)],
    "chain": [(4, 5), (5, 6), (6, 7)],
    "cycle": [(4, 5), (5, 4), (6, 3)],
    "in place": [(3, 3), (4, 1)],
    "hand-over": [(4, 1), (6, 2), (7, 3), (8, 10), (9, 7), (11, 8)],  # a prepared child's, as it receives them
    "warm-up": [(fd, fd) for fd in (0, 1, 2, 3, 5, 10)],  # a prepared child's warm-up keeps each where it is
}


def _arranged(tmp_path: Path, moves: list[tuple[int, int]], how: str = "arrange") -> dict[str, object]:
    out = tmp_path / "arranged.json"
    subprocess.run([sys.executable, "-c", _CASE, json.dumps(moves), str(out), how], timeout=60, check=True,
                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)  # its outputs are arranged away
    found: dict[str, object] = json.loads(out.read_text())
    return found


@pytest.mark.parametrize("moves", list(_CASES.values()), ids=list(_CASES))
def test_each_source_lands_at_its_target_and_nothing_else_stays_open(tmp_path: Path,
                                                                     moves: list[tuple[int, int]]) -> None:
    found = _arranged(tmp_path, moves)
    assert found == {"right": True, "open": sorted({target for _, target in moves})}, found


def test_control_a_naive_order_overwrites_a_source_still_to_be_moved(tmp_path: Path) -> None:
    assert _arranged(tmp_path, _CASES["chain"], "naive")["right"] is False
