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
- ```toml blocks load with the pool's config loader.
- ``docs/python-api.md`` names every entry of ``pynox.__all__``, and ``docs/protocol.md`` every
  field of every message and every config key.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import pytest

import pynox
from pynox import config as pynox_config
from pynox.client import pool_command
from pynox.job import ErrorInfo
from pynox.pool.stats import Stats, log_line
from pynox.protocol import (
    CallEvent,
    Closed,
    LineError,
    Request,
    Result,
    ResultPolicy,
    ResultRuntime,
    SessionResult,
    parse_line,
)

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


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # of the opening fence, 1-based
    lang: str
    body: str
    no_test: bool
    run_by: str | None = None  # a test file that runs this block itself

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
        blocks.append(Block(path, text.count("\n", 0, match.start()) + 1, match.group("lang"), match.group("body"),
                            bool(_NO_TEST.match(before)), run_by.group("test") if run_by else None))
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
    "stats": set(Stats(1).snapshot("s", sessions_active=0)),
    "job": set(log_line(Result(id=1, exit=0))),
    "error": {"event", "error"},
    "ready": {"event", "workers", "runtime", "python", "preloaded_modules", "package_dirs", "config", "profiles",
              "landlock_abi", "backend"},
}
RESULT_FIELDS = _fields(Result)
SESSION_RESULT_FIELDS = _fields(SessionResult)


@pytest.mark.pure
@pytest.mark.parametrize("block", PROTOCOL_JSON)
def test_protocol_json_lines_parse(block: Block) -> None:
    assert _json_lines(block), f"{block.name}: an empty json block"


def _check_result(block: Block, value: dict[str, Any]) -> None:
    keys = set(value) | {"runtime", "policy"}
    assert keys in (RESULT_FIELDS, SESSION_RESULT_FIELDS), (
        f"{block.name}: result fields {sorted(value)} are not those the pool writes")
    if isinstance(value.get("runtime"), dict):
        assert set(value["runtime"]) == _fields(ResultRuntime), f"{block.name}: runtime fields"
    if isinstance(value.get("policy"), dict):
        assert set(value["policy"]) == _fields(ResultPolicy), f"{block.name}: policy fields"
    if value["error"] is not None:
        assert set(value["error"]) == _fields(ErrorInfo), f"{block.name}: error fields"


@pytest.mark.pure
@pytest.mark.parametrize("block", PROTOCOL_JSON)
def test_protocol_lines_are_what_the_code_speaks(block: Block) -> None:
    lines = _json_lines(block)
    for index, (raw, value) in enumerate(lines):
        if "event" in value:
            event = value["event"]
            assert event in EVENT_FIELDS, f"{block.name}: unknown event {event!r}"
            assert set(value) == EVENT_FIELDS[event], f"{block.name}: fields of the {event} event: {sorted(value)}"
        elif "exit" in value:
            _check_result(block, value)
        elif "closed" in value:
            assert set(value) == _fields(Closed), f"{block.name}: fields of a closed answer"
        else:
            try:
                parse_line(raw.encode())
            except LineError as exc:
                # A refused request is shown with its refusal, later in the same block.
                later = [v for _, v in lines[index + 1:] if "exit" in v]
                assert any(v["exit"] == 2 and v["error"]["type"] == "RequestError" and v["id"] == exc.request_id
                           for v in later), f"{block.name}: {raw[:120]} is refused ({exc}) but no refusal is shown"


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
        {"id": 2, "session": "s", "code": "x = 1"},
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
            # A result shown without its runtime and policy objects (the text says so) is otherwise complete.
            shown = set(value) | ({"runtime", "policy"} if shape.startswith("result") else set())
            assert shown == shapes[shape], f"{block.name}: documented {shape} fields differ from a real pool's"
    assert {"ready", "stats", "closed", "result", "result-session"} <= set(shapes)


def _shape(value: dict[str, Any]) -> str:
    if "event" in value:
        return str(value["event"])
    if "closed" in value:
        return "closed"
    if "exit" in value:
        return "result-session" if "session" in value else "result"
    return "request"


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
