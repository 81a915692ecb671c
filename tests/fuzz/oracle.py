"""What the pool must answer to one input line, decided by the protocol's own pure parser.

The pool reads a line, skips it if blank, refuses it if longer than 1 MiB,
then parses it with :func:`pynox.protocol.parse_line`. The oracle replays that
decision in the test process, so a fuzzed line has one expected answer:

* ``none``: a blank line gets no answer at all;
* ``refused``: exactly one ``RequestError`` result, with the id recovered from
  the line (or null) and, for a parse error, the parser's own message;
* ``stats``: exactly one stats event;
* ``request``: a well-formed job or session request: exactly one answer with
  its id, a refusal (a path that does not exist...) or a result of its run.
"""

from __future__ import annotations

from dataclasses import dataclass

from pynox.protocol import MAX_LINE, LineError, Reply, RequestId, parse_line, request_id_from_head


@dataclass(frozen=True)
class Expected:
    kind: str  # none | refused | stats | request
    id: RequestId = None
    message: str | None = None  # exact, when the parser decides the refusal
    contains: str | None = None  # a part of the refusal's message, when the server decides it
    session: str | None = None  # a request that opens a session, to be closed afterwards
    # Nested deeper than the parser's recursion allows in the pool's thread: the line may be refused whole.
    too_deep: bool = False


NO_CALL_PENDING = "no such call is pending"


# msgspec recurses once per level, under Python's recursion limit counted from the caller's own depth,
# so the depth at which a line is "nested too deeply" differs between the pool and this test process.
# Beyond this depth either answer is right: the refusal of the whole line, or what this process finds.
UNCERTAIN_DEPTH = 200
TOO_DEEP = ("not valid JSON: nested too deeply", "invalid request: nested too deeply")
# The bytes of an over-long line the pool keeps to name it (server/io.py): its id is found in them or not at all.
_HEAD = 256


def nesting(line: bytes) -> int:
    """The deepest nesting of arrays and objects in ``line``, strings skipped (good enough for bad JSON)."""
    depth = deepest = 0
    in_string = escaped = False
    for byte in line:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):  # [ {
            depth += 1
            deepest = max(deepest, depth)
        elif byte in (0x5D, 0x7D):  # ] }
            depth -= 1
    return deepest


def expect(line: bytes) -> Expected:
    """``line`` without its newline, exactly as the pool will read it."""
    expected = _expect(line)
    if expected.kind == "refused" and len(line) <= MAX_LINE and nesting(line) > UNCERTAIN_DEPTH:
        return Expected(expected.kind, expected.id, expected.message, expected.contains, too_deep=True)
    return expected


def _expect(line: bytes) -> Expected:
    if len(line) > MAX_LINE:
        # Never parsed: its id is known only when the line starts with it, within the head the pool keeps.
        return Expected("refused", request_id_from_head(line[:_HEAD]),
                        message=f"line of {len(line)} bytes exceeds the 1 MiB limit; it was discarded")
    if not line.strip():
        return Expected("none")
    try:
        message = parse_line(line)
    except LineError as exc:
        return Expected("refused", exc.request_id, str(exc))
    if isinstance(message, Reply):
        return Expected("refused", contains=NO_CALL_PENDING)  # the fuzzing pool never has a call pending
    if message.stats:
        return Expected("stats", message.id)
    if message.close:
        return Expected("refused", message.id)  # nor an open session when a line is fuzzed
    return Expected("request", message.id, session=message.session)
