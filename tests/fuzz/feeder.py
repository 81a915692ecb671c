"""Feed fuzzed lines to the shared pool and check each one got exactly the answer the oracle expects.

After every input a normal job runs through the same pool: its answer proves
the pool still serves, and, since the pool answers a line it refuses before it
reads the next one, it also marks where the fuzzed lines' answers end.
"""

from __future__ import annotations

import itertools
from collections import Counter
from typing import Any

from tests.pool.pool_driver import PoolProcess, same_id

from .oracle import TOO_DEEP, Expected, expect

# Inputs fed, by test, for the figures in docs/reliability.md.
FED: Counter[str] = Counter()
WAIT = 60.0  # seconds for any one answer: generous on a loaded machine
_probes = itertools.count()
_MARK = "\u2063"  # no fuzzed id starts with an invisible separator


def _new_id(kind: str) -> str:
    return f"{_MARK}{kind}-{next(_probes)}"


class Feeder:
    def __init__(self, pool: PoolProcess, name: str) -> None:
        self.pool = pool
        self.name = name

    def feed(self, lines: list[bytes]) -> list[dict[str, Any]]:
        """Send ``lines`` (without newlines) in one write; returns the answers they got, in order."""
        expected = [expect(line) for line in lines]
        requests = [e for e in expected if e.kind == "request"]
        assert len(requests) <= 1 and (not requests or len(lines) == 1), "the strategy must not mix requests"
        FED[self.name] += len(lines)
        pool = self.pool
        start = len(pool.messages)
        pool.send(b"".join(line + b"\n" for line in lines))
        extra: set[str] = set()  # ids of our own lines in between: the close of a fuzzed session
        if requests:
            self._request(requests[0], start, extra)
        answers = self.barrier(start, extra)
        if requests:
            assert len(answers) == 1, f"{len(answers)} answers to one request line: {answers}"
            return answers
        index = 0
        for line, wanted in zip(lines, expected, strict=True):
            if wanted.kind == "none":
                continue
            assert index < len(answers), f"no answer to {line[:200]!r}; expected {wanted}"
            check(answers[index], wanted, line)
            index += 1
        assert index == len(answers), f"answers nobody asked for: {answers[index:]}"
        return answers

    def barrier(self, start: int, extra: set[str] | None = None) -> list[dict[str, Any]]:
        """Run a normal job; returns every answer since ``start`` before its own (our own lines excepted)."""
        probe = _new_id("probe")
        self.pool.send({"id": probe, "code": "print('alive')"})
        answer = self.pool.wait_for(lambda m: m.get("id") == probe, timeout=WAIT, start=start)
        assert answer["exit"] == 0 and answer["stdout"] == "alive\n", f"the pool stopped serving: {answer}"
        messages = self.pool.messages
        end = next(i for i in range(start, len(messages)) if messages[i] is answer)
        skip = extra or set()
        return [m for m in messages[start:end] if not (isinstance(m.get("id"), str) and m["id"] in skip)]

    def _request(self, wanted: Expected, start: int, extra: set[str]) -> None:
        """A well-formed request: one answer with its id, refused or run, never the pool's own failure."""
        answer = self.pool.wait_for(lambda m: same_id(m.get("id"), wanted.id) and "exit" in m, timeout=WAIT,
                                    start=start)
        error = answer.get("error")
        assert error is None or error["type"] != "PoolWorkerError", answer
        if error is not None and error["type"] == "RequestError":
            assert answer["exit"] == 2 and error["message"], answer
        if wanted.session is not None and answer.get("step") is not None and not answer.get("session_ended"):
            close = _new_id("close")
            extra.add(close)
            self.pool.send({"id": close, "session": wanted.session, "close": True})
            closed = self.pool.wait_for(lambda m: m.get("id") == close, timeout=WAIT, start=start)
            assert closed.get("closed") is True, closed


def check(answer: dict[str, Any], wanted: Expected, line: bytes) -> None:
    where = f"for line {line[:200]!r}"
    error = answer.get("error")
    if wanted.too_deep and isinstance(error, dict) and error.get("message") in TOO_DEEP:
        # Refused as too deep: the whole line (id null) or after its id was read.
        expected_id = None if error["message"] == TOO_DEEP[0] else wanted.id
        assert answer.get("exit") == 2 and same_id(answer.get("id"), expected_id), f"{answer} {where}"
        return
    assert same_id(answer.get("id"), wanted.id), f"answer id {answer.get('id')!r}, expected {wanted.id!r} {where}"
    if wanted.kind == "stats":
        assert answer.get("event") == "stats", f"{answer} {where}"
        return
    error = answer.get("error")
    assert answer.get("exit") == 2 and error is not None and error["type"] == "RequestError", f"{answer} {where}"
    message = error["message"]
    assert isinstance(message, str) and message.strip(), f"an empty refusal {where}"
    assert "Traceback" not in message, message
    if wanted.message is not None:
        assert message == wanted.message, f"{message!r} != {wanted.message!r} {where}"
    if wanted.contains is not None:
        assert wanted.contains in message, f"{message!r} lacks {wanted.contains!r} {where}"
