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


# A prepared child's hand-over (job/child._await_job), both ways: natively (policy/_confine.c, take_job) and through
# the Python steps (recv_raw, then Setup.handed), from the same frame: each of the job's descriptors at its number,
# standard input where it was, the control socket and every other descriptor closed, the job's name taken. The
# frame's descriptors arrive at the lowest free numbers; the sender's pipes are told apart by their inodes.
_HAND_OVER = """
import ctypes, json, os, socket, sys
from pynox.job import child
from pynox.job.setup import Setup
from pynox.wire import frames
from pynox.wire.descriptors import CONTROL, handed_to_prepared

way, session, frame, out = sys.argv[1], sys.argv[2] == "session", sys.argv[3], sys.argv[4]
targets = handed_to_prepared(False, session)
ours, theirs = socket.socketpair()
os.dup2(theirs.fileno(), CONTROL)
theirs.close()
server_end = ours.detach()
ours = socket.socket(fileno=os.dup2(server_end, 40))  # the server's end: sends the frame, then closed by it
os.close(server_end)
for stray in (20, 33):  # what a prepared child might still hold: closed by the hand-over
    os.dup2(0, stray)
inodes = []
sent = []
for _ in targets if frame != "short" else targets[1:]:
    read, write = os.pipe()
    inodes.append(os.fstat(read).st_ino)
    sent.append(read)
    os.close(write)
if frame == "eof":
    ours.close()
elif frame == "oversized":
    ours.sendmsg([frames.HEADER.pack(frames.MAX_FRAME + 1)], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                                                __import__("array").array("i", sent))])
else:
    frames.send_frame(ours, frames.HandOver(), sent)
for fd in sent:
    os.close(fd)
stdin = os.fstat(0).st_ino
if way == "native":
    take_job, args = child.hand_over_call(CONTROL, (*targets, 0), child._HANDED_NAME_TEXT[session], 16, 1 << 20,
                                          frames.MAX_FRAME)
    code = take_job(*args)
else:
    setup = Setup.__new__(Setup)
    setup.arranged = True
    with socket.socket(fileno=CONTROL) as control:
        try:
            _, fds = frames.recv_raw(control)
            code = 0
        except (EOFError, OSError):
            code = 1
        except ValueError:
            code = 2
    if not code:
        child._HANDED_NAMES[session].take()
        code = 2 if len(fds) != len(targets) else 0
        if not code:
            setup.handed(fds, targets)
name = ctypes.create_string_buffer(16)
ctypes.CDLL(None, use_errno=True).prctl(16, name)  # PR_GET_NAME
landed = {}
for fd in range(64):
    try:
        landed[fd] = os.fstat(fd).st_ino
    except OSError:
        pass
with open(out, "w") as result:
    json.dump({"code": code, "name": name.value.decode(), "right": code == 0 and all(
        landed.get(target) == inode for target, inode in zip(targets, inodes)) and landed.get(0) == stdin,
               "open": sorted(landed)}, result)
"""


def _handed(tmp_path: Path, way: str, session: str, frame: str) -> dict[str, object]:
    out = tmp_path / f"{way}-{session}-{frame}.json"
    subprocess.run([sys.executable, "-c", _HAND_OVER, way, session, frame, str(out)], timeout=60, check=True,
                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    found: dict[str, object] = json.loads(out.read_text())
    return found


def _native_loads() -> bool:
    from pynox.policy.native import load_error

    return load_error() is None


@pytest.mark.parametrize("session", ["job", "session"])
@pytest.mark.parametrize("way", ["native", "python"])
def test_a_hand_over_places_the_jobs_descriptors_closes_every_other_one_and_names_the_child(
        tmp_path: Path, way: str, session: str) -> None:
    if way == "native" and not _native_loads():
        pytest.skip("the native extension is not built here")
    found = _handed(tmp_path, way, session, "whole")
    targets = [1, 2, 3, 10, 7, 8] + ([5] if session == "session" else [])
    assert found == {"code": 0, "name": f"pynox-{session}", "right": True, "open": sorted({0, *targets})}, found


@pytest.mark.parametrize("frame", ["short", "eof", "oversized"])
def test_a_hand_over_the_protocol_does_not_allow_is_refused_both_ways(tmp_path: Path, frame: str) -> None:
    """One descriptor missing, the socket closed with no job, a frame longer than any: each way refuses it (the
    child then exits without running anything, job/child._await_job), with the same answer."""
    ways = ["native", "python"] if _native_loads() else ["python"]
    codes = {way: _handed(tmp_path, way, "job", frame)["code"] for way in ways}
    assert codes == dict.fromkeys(ways, 1 if frame == "eof" else 2), codes
