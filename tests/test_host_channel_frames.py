"""The host channel's frames, both ways typed: what the job sends, what the pool answers, and how each side
reads the other's frame once, straight into its struct, with a clear error for what it cannot read.

Pure: no pool is started. The same frames through a real pool, and forged ones, are in
tests/pool/test_pool_host_functions.py and tests/faults/test_host_channel.py.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from types import FrameType

import msgspec
import pytest

from pynox.job import pynox_host
from pynox.protocol import LineError, Reply, ReplyBody, parse_line
from pynox.server.hostcalls import CallRegistry, Outbox, _call_decoder
from pynox.wire.frames import HEADER
from pynox.wire.host_channel import MAX_ANSWER, PIP_FUNCTION, HostAnswer, HostCall, encode_frame, tag_size
from tests.harness import procfs

pytestmark = pytest.mark.pure


@pytest.fixture
def channel() -> Iterator[tuple[socket.socket, socket.socket]]:
    job, pool = socket.socketpair()
    with job, pool:
        yield job, pool


@pytest.mark.parametrize("tag", [1, 9, 10, 123_456_789])
def test_a_call_frame_is_its_tag_then_exactly_the_arguments_object(tag: int) -> None:
    frame = encode_frame(HostCall(tag=tag, function="f", args=[1, "x", None], kwargs={"k": [True]}))
    (size,) = HEADER.unpack_from(frame)
    body = bytes(frame[HEADER.size:])
    assert size == len(body)
    arguments = msgspec.json.encode({"function": "f", "args": [1, "x", None], "kwargs": {"k": [True]}})
    # What the 1 MB limit measures, on both sides: the frame less its tag.
    assert body == b'{"tag":' + str(tag).encode() + b"," + arguments[1:]
    assert len(body) - tag_size(tag) == len(arguments)
    assert _call_decoder.decode(body) == HostCall(tag=tag, function="f", args=[1, "x", None], kwargs={"k": [True]})


@pytest.mark.parametrize(("answer", "wire"), [
    (HostAnswer(tag=3, result=None), b'{"tag":3,"result":null}'),
    (HostAnswer(tag=3, result={"a": [1, 2.5]}), b'{"tag":3,"result":{"a":[1,2.5]}}'),
    (HostAnswer(tag=3, error="no"), b'{"tag":3,"error":"no"}'),
])
def test_an_answer_frame_round_trips(answer: HostAnswer, wire: bytes,
                                     channel: tuple[socket.socket, socket.socket]) -> None:
    job, pool = channel
    frame = encode_frame(answer)
    assert bytes(frame) == HEADER.pack(len(wire)) + wire
    pool.sendall(frame)
    assert pynox_host._Channel(job)._take() == answer


@pytest.mark.parametrize(("frame", "message"), [
    (b"not json", "malformed answer"),
    (b"[1, 2]", "malformed answer"),
    (b'{"result": 1}', "malformed answer"),  # no tag: nobody it could be for
    (b'{"tag": "1", "result": 1}', "malformed answer"),
    (b'{"tag": 1, "error": 5}', "malformed answer"),
    (b'{"tag": 1, "result": 1, "extra": 2}', "malformed answer"),
    (b'{"tag": 1, "result": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "malformed answer"),
])
def test_an_answer_the_job_cannot_read_breaks_the_channel_with_a_clear_error(
        frame: bytes, message: str, channel: tuple[socket.socket, socket.socket]) -> None:
    job, pool = channel
    pool.sendall(HEADER.pack(len(frame)) + frame)
    with pytest.raises(OSError, match=message):
        pynox_host._Channel(job)._take()


def test_an_answer_announced_too_large_is_refused_before_it_is_read(
        channel: tuple[socket.socket, socket.socket]) -> None:
    job, pool = channel
    pool.sendall(HEADER.pack(MAX_ANSWER + 1))
    with pytest.raises(OSError, match=f"answer of {MAX_ANSWER + 1} bytes is too large"):
        pynox_host._Channel(job)._take()


def test_warming_the_call_path_leaves_no_module_and_no_descriptor() -> None:
    """The template runs it before any job exists: a job without host functions must not find pynox_host,
    and the template proves afterwards that it holds only its expected descriptors."""
    before = procfs.fds(os.getpid())
    pynox_host.warm_up()
    pynox_host.warm_up(calls=2)
    assert procfs.fds(os.getpid()) == before
    assert "pynox_host" not in sys.modules and "pynox_host.aio" not in sys.modules



# -- a reader interrupted: the stream in step, or the channel broken for good -------------------------------------
# Through a real pool, with the interrupt after bytes were taken: tests/client/test_client_cancel.py. Here the two
# windows where the stream stays in step, made certain by a profile hook that raises as a signal's handler would.


def _interrupt_at(wanted: str, name: str) -> Callable[[FrameType, str, object], None]:
    def hook(frame: FrameType, event: str, arg: object) -> None:
        if event == wanted and (getattr(arg, "__name__", None) == name or frame.f_code.co_name == name):
            sys.setprofile(None)
            raise KeyboardInterrupt
    return hook


def _call_interrupted_at(host: pynox_host._Channel, event: str, name: str) -> None:
    """A call on ``host`` that a KeyboardInterrupt ends at the profile ``event`` of ``name`` (see _interrupt_at)."""
    sys.setprofile(_interrupt_at(event, name))
    try:
        with pytest.raises(KeyboardInterrupt):
            host.call("f", (), {})
    finally:
        sys.setprofile(None)


def _another_threads_call_answered(host: pynox_host._Channel, pool: socket.socket) -> pynox_host._Waiting:
    """A call of another thread (tag 7), waiting on ``host`` to be handed its answer, which the pool has sent."""
    other = pynox_host._Waiting()
    host._waiting[7] = other
    pool.sendall(encode_frame(HostAnswer(tag=7, result="theirs")))
    return other


def test_a_reader_interrupted_before_it_took_a_byte_leaves_the_channel_in_step(
        channel: tuple[socket.socket, socket.socket]) -> None:
    """As a signal while the reader waits in recv (EINTR): nothing was taken, the next call gets its answer."""
    job, pool = channel
    host = pynox_host._Channel(job)
    _call_interrupted_at(host, "c_call", "recv_into")
    pool.sendall(encode_frame(HostAnswer(tag=1, result="late")) + encode_frame(HostAnswer(tag=2, result="next")))
    assert host.call("f", (), {}) == "next"  # the late answer to the interrupted call was read whole, and dropped


def test_a_reader_interrupted_once_it_took_a_whole_frame_delivers_its_answer(
        channel: tuple[socket.socket, socket.socket]) -> None:
    """The frame was taken whole and decoded but not yet handed over: the interrupted reader hands it to the
    call it answers (another thread's, here), and the channel stays in step."""
    job, pool = channel
    host = pynox_host._Channel(job)
    other = _another_threads_call_answered(host, pool)
    _call_interrupted_at(host, "return", "_take")
    assert other.finished and other.answer == HostAnswer(tag=7, result="theirs")
    pool.sendall(encode_frame(HostAnswer(tag=2, result="next")))
    assert host.call("f", (), {}) == "next"


def test_a_reader_interrupted_as_it_decodes_a_frame_breaks_the_channel(
        channel: tuple[socket.socket, socket.socket]) -> None:
    """The frame was taken, its answer lost: the call it answers would wait for ever, so it fails at once."""
    job, pool = channel
    host = pynox_host._Channel(job)
    other = _another_threads_call_answered(host, pool)
    _call_interrupted_at(host, "c_return", "decode")
    assert other.finished and other.answer is None
    with pytest.raises(pynox_host.HostError, match=r"^f\(\): the host channel failed: reading an answer was "
                                                  r"interrupted \(KeyboardInterrupt\) partway through it"):
        host.call("f", (), {})


# -- overlapping calls wait on _thread's locks (the template leaves threading unloaded) ----------------------------


def test_at_most_the_turns_count_of_callers_are_inside_at_once() -> None:
    turns, lock = pynox_host._Turns(3), threading.Lock()
    inside, most, done = [0], [0], []

    def caller(n: int) -> None:
        with turns:
            with lock:
                inside[0] += 1
                most[0] = max(most[0], inside[0])
            time.sleep(0.02)
            with lock:
                inside[0] -= 1
        done.append(n)

    callers = [threading.Thread(target=caller, args=(n,)) for n in range(8)]
    for thread in callers:
        thread.start()
    for thread in callers:
        thread.join(10)
    assert sorted(done) == list(range(8)) and most[0] == 3


def test_a_caller_interrupted_while_it_waits_for_a_turn_takes_no_turn_away() -> None:
    """A session step's KeyboardInterrupt can come while a call waits for its turn: the turn the caller would
    have had must go to the next one, not to the interrupted caller."""
    turns, release = pynox_host._Turns(1), threading.Event()

    def holder() -> None:
        with turns:
            release.wait(10)

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    holding = threading.Thread(target=holder)
    holding.start()
    time.sleep(0.05)  # the holder has the one turn
    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.05)
        with pytest.raises(KeyboardInterrupt), turns:
            pass
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    release.set()
    holding.join(10)
    entered: list[int] = []

    def two_in_turn() -> None:
        for n in range(2):
            with turns:
                entered.append(n)

    after = threading.Thread(target=two_in_turn, daemon=True)  # a turn lost would hold it forever
    after.start()
    after.join(5)
    assert entered == [0, 1]  # the turn came back: two callers in turn, neither waiting for a lost one


def test_a_wake_set_twice_wakes_once_and_is_clear_after() -> None:
    wake, woken = pynox_host._Wake(), []
    wake.set()
    wake.set()
    wake.wait()  # set: returns at once, and takes the set
    waiter = threading.Thread(target=lambda: (wake.wait(), woken.append(True)))
    waiter.start()
    time.sleep(0.05)
    assert woken == []  # cleared by the wait before
    wake.set()
    waiter.join(10)
    assert woken == [True]


# -- the pool's reply path: a reply line decoded once, with every rule of the general path ---------------------


@pytest.mark.parametrize(("line", "expected"), [
    (b'{"reply": {"call_id": 3, "result": {"a": 1, "b": [1, {"c": 2}]}}}',
     ReplyBody(call_id=3, result={"a": 1, "b": [1, {"c": 2}]})),
    (b' { "reply" : {"call_id": 1, "error": null}}', ReplyBody(call_id=1, error=None)),
    (b'{"reply": {"call_id": 3, "result": "\\":"}}', ReplyBody(call_id=3, result='":')),  # a colon in a string
])
def test_a_reply_line_is_read(line: bytes, expected: ReplyBody) -> None:
    assert parse_line(line) == Reply(reply=expected)


@pytest.mark.parametrize(("line", "message"), [
    (b'{"reply": {"call_id": 3, "result": {"a": 1, "a": 2}}}', "duplicate key 'a'"),
    (b'{"reply": {"call_id": 3, "result": [{"a": {"b": 1}, "a": {"b": 1}}]}}', "duplicate key 'a'"),
    (b'{"reply": {"call_id": 3, "call_id": 4, "result": 1}}', "duplicate key 'call_id'"),
    (b'{"reply": {"call_id": 3, "result": 1, "result": 2}}', "duplicate key 'result'"),
    (b'{"reply": {"call_id": 3, "result": 1}, "reply": {"call_id": 3, "result": 1}}', "duplicate key 'reply'"),
    (b'{"reply": {"call_id": 3, "result": 1, "error": "x"}}', "give result or error, not both"),
    (b'{"reply": {"call_id": 3}}', "give a result or an error"),
    (b'{"reply": {"call_id": 3, "x": 1}}', "unknown field `x`"),
    (b'{"reply": {"call_id": 3, "result": 1}} x', "not valid JSON"),
    (b'{"reply": {"call_id": 3, "result": ' + b"[" * 5000 + b"]" * 5000 + b"}}", "nested too deeply"),
])
def test_a_bad_reply_line_is_refused_saying_why(line: bytes, message: str) -> None:
    with pytest.raises(LineError, match=message):
        parse_line(line)



def test_a_pip_install_the_pool_could_not_start_leaves_the_sessions_next_one_free(
        channel: tuple[socket.socket, socket.socket], monkeypatch: pytest.MonkeyPatch) -> None:
    """A session runs one `%pip install` at a time. When no thread can be had for one (a pool at its threads'
    limit), the job is told so, and the session's next install is served: before, the failed start left the
    session marked as installing for good (every later install refused as 'still running'), and its error
    escaped the reader of the job's channel."""
    job, pool = channel
    registry = CallRegistry(emit=lambda _: None, on_call=lambda: None)
    installed = threading.Event()
    registry.pip = lambda directory, words: (installed.set(), f"installed {' '.join(words[1:])}")[1]
    calls = registry.open("step", [], Outbox(pool), pip_dir="/pip/session")
    frame = encode_frame(HostCall(tag=1, function=PIP_FUNCTION, args=["install six"], kwargs={}))
    with monkeypatch.context() as patched:
        def no_thread(self: threading.Thread) -> None:
            raise RuntimeError("can't start new thread")
        patched.setattr(threading.Thread, "start", no_thread)
        calls.readable(bytes(frame))
    reader = pynox_host._Channel(job)
    refused = reader._take()
    assert refused.tag == 1 and "could not start" in str(refused.error), refused
    calls.readable(bytes(encode_frame(HostCall(tag=2, function=PIP_FUNCTION, args=["install six"], kwargs={}))))
    assert installed.wait(10)
    assert reader._take() == HostAnswer(tag=2, result="installed six")
