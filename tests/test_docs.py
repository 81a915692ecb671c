"""The docs are tested like code: their examples run, and their protocol lines are ones the code speaks.

- Every ```python block of ``docs/*.md`` and ``README.md`` runs as its own program (warnings are
  errors), in a fresh directory holding ``data/orders.csv`` and an empty ``out/``, against the real
  pool. A ``#> text`` comment in a block is a line the program must print, in that order; one
  ending in ``...`` gives the start of the line. A block right after a ``<!-- no-test -->`` line is
  skipped (for snippets that need a package the test environment lacks); one right after
  ``<!-- run-by: tests/PATH.py -->`` is left to that test file, which must exist and name the
  document (for snippets that need a fixture, such as a scripted model).
- Every line of a ```json block of ``docs/protocol.md`` is JSON. Requests and replies must pass the
  pool's own parser, unless the same block shows their refusal; results, events, stats and log
  lines must have exactly the fields the code writes (a result may leave out ``runtime`` and
  ``policy`` when the text says so).
- Every ```json block that shows lines a pool wrote is a transcript, right after a
  ``<!-- transcript: NAME -->`` line. The test of that NAME (below) starts a real pool the way the
  text says, sends the block's client lines one at a time, and compares each line the pool writes
  with the documented one: every field and value, except timings, which need only be integers.
- ```toml blocks load with the pool's config loader.
- ``docs/python-api.md`` names every entry of ``pynox.__all__``, and ``docs/protocol.md`` every
  field of every message and every config key.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import tomllib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import pytest

import pynox
from pynox import config as pynox_config
from pynox.client import pool_command
from pynox.protocol import (
    CallEvent,
    CancelAnswer,
    Closed,
    DisplayEvent,
    Download,
    Downloaded,
    FileChunk,
    FilesListed,
    JobLogLine,
    LineError,
    ReadyEvent,
    Request,
    Result,
    ResultPolicy,
    ResultRuntime,
    ScratchFile,
    SessionResult,
    StartErrorEvent,
    StatsEvent,
    StreamEvent,
    Upload,
    Uploaded,
    parse_line,
)
from pynox.wire.spec import ErrorInfo
from tests.harness import procfs

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PROTOCOL = DOCS / "protocol.md"
PYTHON_API = DOCS / "python-api.md"
DOCUMENTS = [*sorted(DOCS.glob("*.md")), ROOT / "README.md"]

ORDERS_CSV = "product,amount\nlamp,25.00\ndesk,180.00\nlamp,12.50\n"
EXAMPLE_TIMEOUT = 100  # seconds; the outer pytest timeout is 120

_FENCE = re.compile(r"^```(?P<lang>[^\s`]*)[^\n]*\n(?P<body>.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
_NO_TEST = re.compile(r"^\s*<!--\s*no-test\s*-->\s*$")
_RUN_BY = re.compile(r"^\s*<!--\s*run-by:\s*(?P<test>\S+)\s*-->\s*$")
_TRANSCRIPT = re.compile(r"^\s*<!--\s*transcript:\s*(?P<name>[\w-]+)\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # of the opening fence, 1-based
    lang: str
    body: str
    no_test: bool
    run_by: str | None = None  # a test file that runs this block itself
    transcript: str | None = None  # the name of the test below that replays this block

    @property
    def name(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def _blocks(path: Path) -> list[Block]:
    return _blocks_from(path, path.read_text(encoding="utf-8"))


def _blocks_from(path: Path | str, text: str) -> list[Block]:
    path = ROOT / path
    blocks: list[Block] = []
    for match in _FENCE.finditer(text):
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        run_by = _RUN_BY.match(before)
        transcript = _TRANSCRIPT.match(before)
        blocks.append(Block(path, text.count("\n", 0, match.start()) + 1, match.group("lang"), match.group("body"),
                            bool(_NO_TEST.match(before)), run_by.group("test") if run_by else None,
                            transcript.group("name") if transcript else None))
    return blocks


ALL_BLOCKS = [block for path in DOCUMENTS if path.exists() for block in _blocks(path)]


def _select(lang: str, path: Path | None = None) -> list[Block]:
    return [b for b in ALL_BLOCKS if b.lang == lang and (path is None or b.path == path)]


def _marks(block: Block) -> list[Any]:
    if block.no_test:
        return [pytest.mark.skip(reason="marked <!-- no-test -->")]
    if block.run_by:
        return [pytest.mark.skip(reason=f"run by {block.run_by}")]
    return []


def _params(blocks: list[Block]) -> list[Any]:
    return [pytest.param(b, id=b.name, marks=_marks(b)) for b in blocks]


# --- python blocks run --------------------------------------------------------------------------------------


def _expected_lines(body: str) -> list[str]:
    return [line.strip()[3:] if line.strip() != "#>" else "" for line in body.splitlines()
            if line.strip().startswith("#> ") or line.strip() == "#>"]


def _matches(want: str, got: str) -> bool:
    if want.endswith("..."):
        return got.startswith(want[:-3].rstrip())
    return got.rstrip() == want.rstrip()


def _check_output(block: Block, stdout: str) -> None:
    printed = stdout.splitlines()
    position = 0
    for want in _expected_lines(block.body):
        while position < len(printed) and not _matches(want, printed[position]):
            position += 1
        assert position < len(printed), (
            f"{block.name}: the example should print {want!r} (in this order), but printed:\n{stdout}")
        position += 1


@pytest.mark.parametrize("block", _params(_select("python")))
def test_python_example_runs(block: Block, tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "orders.csv").write_text(ORDERS_CSV)
    (tmp_path / "out").mkdir()
    script = tmp_path / "example.py"
    script.write_text(block.body)
    # The example must not depend on the caller's config; PYNOX_BIN is kept, so CI can test a built binary.
    env = {key: value for key, value in os.environ.items() if key != "PYNOX_CONFIG"}
    done = subprocess.run([sys.executable, "-W", "error", str(script)], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=EXAMPLE_TIMEOUT, check=False)
    assert done.returncode == 0, f"{block.name} failed (exit {done.returncode}):\n{done.stdout}\n{done.stderr}"
    _check_output(block, done.stdout)


def test_expected_output_is_checked() -> None:
    block = Block(PYTHON_API, 1, "python", "print('a')\n#> a\nprint('bcd')\n#> b...\n", False)
    _check_output(block, "a\nbcd\n")
    with pytest.raises(AssertionError):
        _check_output(block, "bcd\na\n")


@pytest.mark.pure
def test_python_blocks_are_found() -> None:
    assert sum(1 for b in ALL_BLOCKS if b.lang == "python" and b.path == PYTHON_API) >= 10
    marked = _blocks_from("x.md", "<!-- no-test -->\n```python\nimport missing\n```\n"
                                  "<!-- run-by: tests/test_x.py -->\n```python\nmodel\n```\n```python\npass\n```\n")
    assert [(b.no_test, b.run_by) for b in marked] == [(True, None), (False, "tests/test_x.py"), (False, None)]


@pytest.mark.pure
def test_blocks_left_to_another_test_are_run_there() -> None:
    for block in (b for b in ALL_BLOCKS if b.run_by):
        runner = ROOT / str(block.run_by)
        assert runner.is_file(), f"{block.name}: <!-- run-by: {block.run_by} --> names no test file"
        assert block.path.name in runner.read_text(encoding="utf-8"), f"{block.run_by} never opens {block.path.name}"


# --- json blocks of the protocol -----------------------------------------------------------------------------


def _fields(struct: type[msgspec.Struct]) -> set[str]:
    return set(struct.__struct_fields__)


def _json_lines(block: Block) -> list[tuple[str, dict[str, Any]]]:
    lines: list[tuple[str, dict[str, Any]]] = []
    for raw in block.body.splitlines():
        if not raw.strip():
            continue
        try:
            value = json.loads(raw)
        except json.JSONDecodeError as exc:
            pytest.fail(f"{block.name}: not a JSON line ({exc}): {raw[:200]}")
        assert isinstance(value, dict), f"{block.name}: a protocol line is a JSON object: {raw[:200]}"
        lines.append((raw, value))
    return lines


PROTOCOL_JSON_BLOCKS = _select("json", PROTOCOL)
PROTOCOL_JSON = _params(PROTOCOL_JSON_BLOCKS)
EVENT_FIELDS: dict[str, set[str]] = {
    "call": {"event", *_fields(CallEvent)},
    "stats": set(_fields(StatsEvent)),
    "job": set(_fields(JobLogLine)),
    "error": {"event", *_fields(StartErrorEvent)},
    "ready": {"event", *_fields(ReadyEvent)},
    # Output as it happens; a session step's carry its session too.
    "stream": {"event", *_fields(StreamEvent)} - {"session"},
    "display_data": {"event", *_fields(DisplayEvent)} - {"session"},
}
RESULT_FIELDS = _fields(Result)
SESSION_RESULT_FIELDS = _fields(SessionResult)


@pytest.mark.pure
@pytest.mark.parametrize("block", PROTOCOL_JSON)
def test_protocol_json_lines_parse(block: Block) -> None:
    assert _json_lines(block), f"{block.name}: an empty json block"


# What a documented result may leave out, when the text above it says so.
_TRIMMABLE = {"runtime", "policy", "usage"}
# What a result has only sometimes: a value when the request asks for it, images when the code drew some,
# refused in a refusal, files for a job with a scratch directory, outputs when it displayed some (or its value
# has a bundle), a session step's execution_count when it ran, traceback_at when stderr holds the error's
# traceback.
_ONLY_SOMETIMES = {"return_value", "images", "images_dropped", "refused", "files", "outputs", "execution_count",
                   "traceback_at"}
# And a session step's: why its session was reopened, whether a cancel interrupted it; a save's state; a fork's copy.
_ONLY_SOMETIMES_IN_A_SESSION = {"session_reopened", "interrupted", "state", "skipped", "forked"}


def _check_result(block: Block, value: dict[str, Any]) -> None:
    keys = set(value) | _TRIMMABLE | _ONLY_SOMETIMES | (_ONLY_SOMETIMES_IN_A_SESSION if "session" in value else set())
    # execution_count, a session step's only, is among those a result has only sometimes.
    assert keys in (RESULT_FIELDS | {"execution_count"}, SESSION_RESULT_FIELDS), (
        f"{block.name}: result fields {sorted(value)} are not those the pool writes")
    if isinstance(value.get("runtime"), dict):
        assert set(value["runtime"]) == _fields(ResultRuntime), f"{block.name}: runtime fields"
    if isinstance(value.get("policy"), dict):
        # hosts is on the line only with network "hosts".
        expected = _fields(ResultPolicy) - (set() if value["policy"].get("network") == "hosts" else {"hosts"})
        assert set(value["policy"]) == expected, f"{block.name}: policy fields"
    if value["error"] is not None:
        assert set(value["error"]) == _fields(ErrorInfo), f"{block.name}: error fields"
    # A refusal says so in the pool's own field; a result of code that ran never has it.
    refusal = value["exit"] == 2 and value["error"] is not None and value["error"]["type"] == "RequestError"
    assert value.get("refused") is (True if refusal else None), f"{block.name}: refused"


@pytest.mark.pure
@pytest.mark.parametrize("block", PROTOCOL_JSON)
def test_protocol_lines_are_what_the_code_speaks(block: Block) -> None:
    lines = _json_lines(block)
    for index, (raw, value) in enumerate(lines):
        if "event" in value:
            event = value["event"]
            assert event in EVENT_FIELDS, f"{block.name}: unknown event {event!r}"
            fields = set(value) - {"session"} if event in ("stream", "display_data") else set(value)
            assert fields == EVENT_FIELDS[event], f"{block.name}: fields of the {event} event: {sorted(value)}"
        elif "exit" in value:
            _check_result(block, value)
        elif "closed" in value:
            assert set(value) == _fields(Closed), f"{block.name}: fields of a closed answer"
        elif "cancelled" in value:
            assert set(value) == _fields(CancelAnswer), f"{block.name}: fields of a cancel answer"
        elif "uploaded" in value or "downloaded" in value or isinstance(value.get("files"), list):
            _check_file_answer(block, value)
        else:
            try:
                parse_line(raw.encode())
            except LineError as exc:
                # A refused request is shown with its refusal, later in the same block.
                later = [v for _, v in lines[index + 1:] if "exit" in v]
                assert any(v["exit"] == 2 and v["error"]["type"] == "RequestError" and v["id"] == exc.request_id
                           for v in later), f"{block.name}: {raw[:120]} is refused ({exc}) but no refusal is shown"


def _check_file_answer(block: Block, value: dict[str, Any]) -> None:
    """An answer to a session's upload, download or files request: its fields, and each file's."""
    shape, files = ((Uploaded, [value.get("uploaded")]) if "uploaded" in value
                    else (Downloaded, []) if "downloaded" in value else (FilesListed, value["files"]))
    assert set(value) == _fields(shape), f"{block.name}: fields of a {shape.__name__} answer"
    for file in files:
        assert set(file) == _fields(ScratchFile) - {"data"}, f"{block.name}: fields of a file"
    if "downloaded" in value:
        assert set(value["downloaded"]) == _fields(FileChunk), f"{block.name}: fields of a downloaded piece"


@pytest.mark.pure
def test_protocol_check_catches_a_wrong_line() -> None:
    bad = Block(PROTOCOL, 1, "json", '{"id": 1, "cod": "print(1)"}\n', False)
    with pytest.raises(AssertionError):
        test_protocol_lines_are_what_the_code_speaks(bad)
    extra = Block(PROTOCOL, 1, "json", '{"id":1,"exit":0,"stdout":"","surprise":true}\n', False)
    with pytest.raises(AssertionError):
        test_protocol_lines_are_what_the_code_speaks(extra)


def test_documented_messages_match_a_real_pool(tmp_path: Path) -> None:
    """The ready, result, session result, closed and stats lines of the doc have a real pool's fields."""
    requests = [
        {"id": 1, "code": "print(1)"},
        {"id": 2, "session": "s", "code": "x = 1", "open": True},
        {"id": 3, "session": "s", "close": True},
        {"id": 4, "stats": True},
    ]
    stdin = "".join(json.dumps(r) + "\n" for r in requests)
    done = subprocess.run([*pool_command(None), "pool", "--workers=1"], input=stdin, cwd=tmp_path,
                          capture_output=True, text=True, timeout=EXAMPLE_TIMEOUT, check=False)
    assert done.returncode == 0, done.stderr
    real = [json.loads(line) for line in done.stdout.splitlines()]
    shapes = {_shape(value): set(value) for value in real}
    for block in PROTOCOL_JSON_BLOCKS:
        for _, value in _json_lines(block):
            shape = _shape(value)
            if shape not in shapes:
                continue
            # A result shown without its runtime, policy and usage (the text says so) is otherwise complete.
            shown = set(value) | (_TRIMMABLE if shape.startswith("result") else set())
            shown -= _ONLY_SOMETIMES | _ONLY_SOMETIMES_IN_A_SESSION  # not asked for a value, drew nothing
            # ... but its session step ran, so it has an execution_count: compared without those, as the doc's.
            assert shown == shapes[shape] - _ONLY_SOMETIMES - _ONLY_SOMETIMES_IN_A_SESSION, (
                f"{block.name}: documented {shape} fields differ from a real pool's")
    assert {"ready", "stats", "closed", "result", "result-session"} <= set(shapes)


def _shape(value: dict[str, Any]) -> str:
    if "event" in value:
        return str(value["event"])
    if "closed" in value:
        return "closed"
    if "exit" in value:
        return "result-session" if "session" in value else "result"
    return "request"


# --- the transcripts of the protocol are what a real pool writes ----------------------------------------------

# How the transcripts write what differs from run to run (see the top of docs/protocol.md).
DOC_CWD = "/srv/agent"  # the pool's working directory
DOC_PYTHON = "3.11.7"
DOC_LANDLOCK_ABI = 7
_TIMINGS = {"duration_ms", "duration_us", "queue_us", "uptime_ms", "ts_ms", "duration_ms_total", "queue_us_total",
            "cpu_ms", "max_rss_kb", "pid"}
# The stats' latency histograms: which bucket a result falls in is a timing too; their bounds and count are not.
_HISTOGRAMS = {"duration_seconds", "queue_seconds"}
# Values that depend on the machine rather than on the code: (pattern, what both sides become).
_MACHINE = [(re.compile(r"\d+ MiB with its preloaded modules"), "N MiB with its preloaded modules")]
# Fields whose value depends on whether this setup has cgroups (root here; none for an ordinary user).
_SETUP_FIELDS = {"memory_peak_kb", "bounds_not_in_force"}
# The ready event's runtime paths are the machine's (a few dozen); the doc shows two.
DOC_RUNTIME_PATHS = ["/usr/lib", "/usr/local/lib/python3.11"]
# What the documented ready events list as importable: each machine's own site-packages differ.
DOC_IMPORTABLE = ["numpy", "pandas"]


def _file_cap_of_the_setup(result: dict[str, Any]) -> bool:
    """A result whose file cap is the fail-safe one, not the request's: memory not counted, files at ``memory``."""
    usage, policy = result.get("usage"), result.get("policy")
    return (isinstance(usage, dict) and isinstance(policy, dict) and usage.get("memory_peak_kb", 0) is None
            and policy.get("max_file_size") == policy.get("memory_bytes"))
TRANSCRIPTS = ("ready", "start-errors", "result", "gallery", "cancel", "long-line", "setup-error", "worker-error",
               "configuration", "session", "host-functions", "stats", "logs", "display", "stream", "session-state")


def _from_pool(value: dict[str, Any]) -> bool:
    return "exit" in value or "event" in value or "closed" in value or "cancelled" in value


def _transcript(name: str) -> Block:
    [block] = [b for b in PROTOCOL_JSON_BLOCKS if b.transcript == name]
    return block


class _Pool:
    """A real ``pynox pool`` for one transcript: the lines it writes, as the doc writes them."""

    def __init__(self, cwd: Path, *args: str) -> None:
        self.cwd = cwd
        self.proc = subprocess.Popen([*pool_command(None), "pool", *args], cwd=cwd, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self._lines: queue.Queue[str | None] = queue.Queue()
        self.stderr: list[str] = []
        self._readers = [threading.Thread(target=self._read, args=(self.proc.stdout, self._lines.put), daemon=True),
                         threading.Thread(target=self._read, args=(self.proc.stderr, self.stderr.append), daemon=True)]
        for reader in self._readers:
            reader.start()
        self.first = self.read()  # the ready event, or the error event of a pool that could not start
        ready = json.loads(self.first)
        self.python, self.landlock_abi = ready.get("python"), ready.get("landlock_abi")

    def _read(self, stream: Any, put: Callable[[Any], None]) -> None:
        with stream:
            for raw in stream:
                put(self.as_documented(raw.decode("utf-8").rstrip("\n")))
        if put == self._lines.put:
            put(None)  # the end of stdout

    def as_documented(self, line: str) -> str:
        documented = line.replace(str(self.cwd), DOC_CWD)
        if documented == line or '"usage":{' not in line:
            return documented
        # The byte counts of a stream that named the working directory, as the documented one would be.
        value = json.loads(documented)
        for stream in ("stdout", "stderr"):
            real = json.loads(line)[stream]
            value["usage"][f"{stream}_bytes"] -= len(real.encode()) - len(value[stream].encode())
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))

    def read(self) -> str:
        try:
            line = self._lines.get(timeout=EXAMPLE_TIMEOUT / 2)
        except queue.Empty:
            pytest.fail(f"the pool wrote no line within {EXAMPLE_TIMEOUT / 2}s")
        assert line is not None, f"the pool exited ({self.proc.wait()}): {self.stderr[-5:]}"
        return line

    def send(self, line: str | bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write((line.encode() if isinstance(line, str) else line) + b"\n")
        self.proc.stdin.flush()

    def finish(self) -> int:
        """End of input: the pool drains and exits; its exit status."""
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        status = self.proc.wait(timeout=EXAMPLE_TIMEOUT / 2)
        for reader in self._readers:
            reader.join(timeout=10)
        return status

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()

    def normal(self, value: Any, key: str | None = None) -> Any:
        """``value`` with what differs from run to run made equal: timings, and the machine's own numbers."""
        if key in _SETUP_FIELDS:
            return "<as the setup has it>"
        if isinstance(value, dict) and _file_cap_of_the_setup(value):
            # Where no cgroup counts memory, the pool caps each file at the job's memory (sandbox contract): the
            # request set no cap, as the doc's result shows it.
            value = {**value, "policy": {**value["policy"], "max_file_size": None}}
        if isinstance(value, dict) and key in _HISTOGRAMS:
            return {k: "<timings>" if k in ("counts", "sum") else v for k, v in value.items()}
        if isinstance(value, dict):
            return {k: self.normal(v, k) for k, v in value.items()}
        if key == "runtime_paths" and isinstance(value, list) and value:
            return DOC_RUNTIME_PATHS
        if key == "importable" and isinstance(value, list) and value:
            return DOC_IMPORTABLE
        if isinstance(value, list):
            return [self.normal(v) for v in value]
        if key in _TIMINGS and isinstance(value, int | float):
            return "<a number>"
        if key == "python" and value == self.python:
            return DOC_PYTHON
        if key == "landlock_abi" and value == self.landlock_abi:
            return DOC_LANDLOCK_ABI
        if key == "stderr" and isinstance(value, str) and self.python != DOC_PYTHON:
            return value.rstrip("\n").rsplit("\n", 1)[-1]  # another Python prints other tracebacks
        if isinstance(value, str):
            for pattern, same in _MACHINE:
                value = pattern.sub(same, value)
        return value


@contextlib.contextmanager
def _pool(cwd: Path, *args: str) -> Iterator[_Pool]:
    pool = _Pool(cwd, *args)
    try:
        yield pool
    finally:
        pool.kill()


def _workdir(tmp_path: Path) -> Path:
    cwd = tmp_path.resolve()
    (cwd / "data").mkdir()
    (cwd / "data" / "orders.csv").write_text(ORDERS_CSV)
    (cwd / "out").mkdir()
    return cwd


def _replay(block: Block, pool: _Pool, on_sent: Mapping[object, Callable[[_Pool], None]] | None = None) -> list[str]:
    """Send the block's client lines one at a time and read one line of the pool for each of its lines: the
    transcript as it happened this time."""
    happened: list[str] = []
    for raw, value in _json_lines(block):
        if value.get("event") == "ready":
            happened.append(pool.first)
        elif _from_pool(value):
            happened.append(pool.read())
        else:
            pool.send(raw)
            happened.append(raw)
            hook = (on_sent or {}).get(value.get("id"))
            if hook is not None:
                hook(pool)
    return happened


def _check(block: Block, pool: _Pool, happened: list[str], *, trimmed: bool = False,
           documented: list[dict[str, Any]] | None = None) -> None:
    """The documented pool lines are those that happened; with ``trimmed``, a result may leave out
    ``runtime``, ``policy`` and ``usage``."""
    shown = documented if documented is not None else [value for _, value in _json_lines(block)]
    assert len(happened) == len(shown), f"{block.name}: {len(shown)} lines shown, {len(happened)} happened"
    for want, line in zip(shown, happened, strict=True):
        if not _from_pool(want):
            continue
        got = json.loads(line)
        if trimmed and "exit" in want and "runtime" not in want:
            for name in _TRIMMABLE:
                got.pop(name, None)
        assert pool.normal(got) == pool.normal(want), (
            f"{block.name}: the pool wrote\n{json.dumps(got, ensure_ascii=False, separators=(',', ':'))}\n"
            f"where the doc shows\n{json.dumps(want, ensure_ascii=False, separators=(',', ':'))}")


@pytest.mark.pure
def test_every_transcript_is_replayed() -> None:
    shown = [b for b in ALL_BLOCKS if b.lang == "json" and any(_from_pool(v) for _, v in _json_lines(b))]
    assert all(b.path == PROTOCOL and b.transcript for b in shown), (
        f"pool lines outside a <!-- transcript: NAME --> block of protocol.md: {[b.name for b in shown]}")
    assert sorted(b.transcript or "" for b in shown) == sorted(TRANSCRIPTS)
    intro = PROTOCOL.read_text(encoding="utf-8").split("## Starting")[0]
    for convention in (f"`{DOC_CWD}`", f"CPython {DOC_PYTHON}", f"Landlock ABI {DOC_LANDLOCK_ABI}"):
        assert convention in intro, f"the top of protocol.md should say how transcripts write {convention}"



@pytest.mark.pure
def test_transcript_check_catches_a_wrong_value() -> None:
    pool = _Pool.__new__(_Pool)
    pool.python, pool.landlock_abi = DOC_PYTHON, DOC_LANDLOCK_ABI
    request = '{"id": 1, "code": "print(1)"}'
    block = Block(PROTOCOL, 1, "json", request + '\n{"id":1,"exit":0,"stdout":"1\\n","duration_ms":3}\n', False)
    _check(block, pool, [request, '{"id":1,"exit":0,"stdout":"1\\n","duration_ms":9}'])  # another timing
    with pytest.raises(AssertionError):
        _check(block, pool, [request, '{"id":1,"exit":0,"stdout":"2\\n","duration_ms":3}'])
    with pytest.raises(AssertionError):
        _check(block, pool, [request, '{"id":1,"exit":0,"stdout":"1\\n","duration_ms":3,"session":"s"}'])

def test_transcript_ready(tmp_path: Path) -> None:
    request = '{"id":1,"code":"print(2+2)"}'
    assert f"printf '{request}\\n' | pynox pool --workers=2" in PROTOCOL.read_text(encoding="utf-8")
    block = _transcript("ready")
    with _pool(_workdir(tmp_path), "--workers=2") as pool:
        pool.send(request)
        happened = _replay(block, pool)
        assert pool.finish() == 0  # "After the last result the pool saw the end of its input and exited"
    _check(block, pool, happened)


def test_transcript_start_errors(tmp_path: Path) -> None:
    cwd = _workdir(tmp_path)
    (cwd / "typo.toml").write_text("[pool]\nworker = 2\n")
    (cwd / "spawner.py").write_text("import threading, time\n"
                                    "threading.Thread(target=time.sleep, args=(5,), daemon=True).start()\n")
    block = _transcript("start-errors")
    starts = [("--config=typo.toml",), ("--preload=spawner", f"--package-dir={cwd}")]
    happened = []
    for args in starts:
        with _pool(cwd, *args) as pool:
            happened.append(pool.first)
            assert pool.finish() == 1
    _check(block, pool, happened)


@pytest.mark.parametrize(("name", "trimmed"), [("result", False), ("gallery", True), ("setup-error", True),
                                               ("configuration", False), ("session", False),
                                               ("host-functions", True), ("display", True), ("stream", True)])
def test_transcript(name: str, trimmed: bool, tmp_path: Path) -> None:
    cwd = _workdir(tmp_path)
    args = ["--workers=2"]
    if name == "configuration":  # the file of the Configuration section, as /srv/agent/pynox.toml
        [config] = _select("toml", PROTOCOL)
        (cwd / "pynox.toml").write_text(config.body)
        args = ["--config=pynox.toml"]
    block = _transcript(name)
    with _pool(cwd, *args) as pool:
        happened = _replay(block, pool)
        assert pool.finish() == 0
    _check(block, pool, happened, trimmed=trimmed)


def test_transcript_session_state(tmp_path: Path) -> None:
    # The key the section names: with it, the pool signs the documented state byte for byte.
    cwd = _workdir(tmp_path)
    (cwd / "state.key").write_bytes(b"0123456789abcdef0123456789abcdef")
    (cwd / "pynox.toml").write_text('[pool]\nsession_key_file = "state.key"\n')
    block = _transcript("session-state")
    with _pool(cwd, "--workers=1", "--config=pynox.toml") as pool:
        happened = _replay(block, pool)
        assert pool.finish() == 0
    _check(block, pool, happened, trimmed=True)


def test_transcript_cancel(tmp_path: Path) -> None:
    block = _transcript("cancel")
    # One worker: "slow" runs, "waiting" waits behind it; the pause lets "slow" start before the cancels.
    with _pool(_workdir(tmp_path), "--workers=1") as pool:
        happened = _replay(block, pool, on_sent={"waiting": lambda _: time.sleep(0.5)})
        assert pool.finish() == 0
    _check(block, pool, happened, trimmed=True)


def test_transcript_long_line(tmp_path: Path) -> None:
    block = _transcript("long-line")
    size = 1_048_602  # "The answer to a line of 1,048,602 bytes"
    head, tail = b'{"id": "long", "code": "', b'"}'
    with _pool(_workdir(tmp_path), "--workers=2") as pool:
        pool.send(head + b"#" * (size - len(head) - len(tail)) + tail)
        happened = _replay(block, pool)
        assert pool.finish() == 0
    _check(block, pool, happened, trimmed=True)


def _kill_the_template_of_the_job(pool: _Pool) -> None:
    """SIGKILL the template whose job is running (the text: "killed with SIGKILL from outside while the job
    slept")."""
    from tests.pool.pool_driver import descendants, proc_table

    def sleeping(pid: int) -> bool:
        # In its code's sleep, so begun: a template killed while its child still sets up has its job taken
        # back and run again by a new one (the claim; see wire/payload.py), and the transcript would differ.
        try:
            return "nanosleep" in procfs.read(pid, "wchan")
        except OSError:
            return False

    end = time.monotonic() + EXAMPLE_TIMEOUT / 4
    while time.monotonic() < end:
        table = proc_table()
        jobs = [pid for pid, depth in descendants(pool.proc.pid, table).items()
                if depth == 2 and table[pid][3] == "pynox-job" and sleeping(pid)]
        if jobs:
            os.kill(table[jobs[0]][0], signal.SIGKILL)
            return
        time.sleep(0.01)
    pytest.fail("no job started")


def test_transcript_worker_error(tmp_path: Path) -> None:
    block = _transcript("worker-error")
    with _pool(_workdir(tmp_path), "--workers=1") as pool:  # so that w2 waits for the new template
        happened = _replay(block, pool, {"w1": _kill_the_template_of_the_job})
        assert pool.finish() == 0
    _check(block, pool, happened, trimmed=True)


def test_transcripts_stats_and_logs(tmp_path: Path) -> None:
    """The requests the text of the Stats section names, then the stats; the log lines of that run."""
    stats, logs = _transcript("stats"), _transcript("logs")
    with _pool(_workdir(tmp_path), "--workers=2", "--log=json") as pool:
        pool.send('{"id": "tool-41", "code": "print(sum(range(10)))"}')
        pool.read()
        pool.send('{"id": "tool-42", "code": "open(\'/etc/passwd\').read()"}')
        pool.send('{"id": "tool-43", "code": "print(1)", "allow_network": "yes"}')
        pool.read(), pool.read()
        pool.send('{"id": "nb", "session": "nb-1", "code": "rows = [1, 2, 3]", "open": true}')
        pool.read()
        pool.send('{"id": "nb2", "session": "nb-1", "code": "print(len(rows))"}')
        pool.read()
        happened = _replay(stats, pool)
        assert pool.finish() == 0
    _check(stats, pool, happened)
    written = [line for line in pool.stderr if line.startswith("{") and json.loads(line).get("event") == "job"]
    # Log lines are not ordered with other jobs' results: compared in the order of their ids.
    _check(logs, pool, sorted(written, key=lambda line: str(json.loads(line)["id"])),
           documented=sorted((value for _, value in _json_lines(logs)), key=lambda value: str(value["id"])))


# --- toml blocks load -----------------------------------------------------------------------------------------


def _relative_paths(raw: dict[str, Any]) -> list[str]:
    tables: list[dict[str, Any]] = []
    pool = raw.get("pool", {})
    tables += [pool, pool.get("limits", {}), *raw.get("profiles", {}).values()]
    return [path for table in tables for key in ("allow_read", "allow_write", "package_dirs")
            for path in table.get(key, []) if not os.path.isabs(path)]


@pytest.mark.pure
@pytest.mark.parametrize("block", _params(_select("toml")))
def test_toml_example_loads(block: Block, tmp_path: Path) -> None:
    home = tmp_path / "conf"
    home.mkdir()
    for path in _relative_paths(tomllib.loads(block.body)):
        (home / path).mkdir(parents=True, exist_ok=True)
    (home / "pynox.toml").write_text(block.body)
    pynox_config.load_config(home / "pynox.toml")


# --- every name and field is documented ------------------------------------------------------------------------


@pytest.mark.pure
def test_python_api_names_every_public_name() -> None:
    text = PYTHON_API.read_text(encoding="utf-8")
    missing = [name for name in pynox.__all__ if not re.search(rf"`(pynox\.)?{re.escape(name)}\b", text)]
    assert not missing, f"docs/python-api.md does not mention {missing}"


def _protocol_names() -> dict[str, set[str]]:
    return {
        "request": _fields(Request),
        "reply": {"reply", "call_id", "result", "error"},
        "result": SESSION_RESULT_FIELDS,
        "runtime": _fields(ResultRuntime),
        "policy": _fields(ResultPolicy),
        "error": _fields(ErrorInfo),
        "closed": _fields(Closed),
        "upload": _fields(Upload),
        "download": _fields(Download),
        "file": _fields(ScratchFile),
        "downloaded": _fields(FileChunk),
        "file answers": _fields(Uploaded) | _fields(Downloaded) | _fields(FilesListed),
        **{f"{event} event": fields for event, fields in EVENT_FIELDS.items()},
        "[pool]": {key for key in pynox_config._POOL_KEYS if key != "limits"},  # pyright: ignore[reportPrivateUsage]
        "[pool.limits]": set(pynox_config._LIMIT_KEYS),  # pyright: ignore[reportPrivateUsage]
        "[profiles.NAME]": set(pynox_config._PROFILE_KEYS),  # pyright: ignore[reportPrivateUsage]
    }


@pytest.mark.pure
def test_protocol_documents_every_field() -> None:
    text = PROTOCOL.read_text(encoding="utf-8")
    missing = {what: sorted(name for name in names if f"`{name}`" not in text)
               for what, names in _protocol_names().items()}
    assert not {what: names for what, names in missing.items() if names}, f"docs/protocol.md lacks {missing}"


@pytest.mark.pure
def test_protocol_tells_the_exit_statuses() -> None:
    text = PROTOCOL.read_text(encoding="utf-8")
    for status in ("| 0 |", "| 1 |", "| 2 |", "| 70 |", "| 124 |", "| 125 |", "| 128 + N |"):
        assert status in text, f"docs/protocol.md: exit status row {status}"
