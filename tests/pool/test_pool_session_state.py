"""A session's save and restore through the real pool: the state round trip, and the attacks on a state.

A state is bytes a client keeps anywhere (a checkpoint store, a database): the pool signs it with a key of its
own (HMAC-SHA256) and reads it only inside a confined process. Each attack is checked from outside: a forged,
changed, foreign or oversized state is refused before anything runs, and a state whose unpickling runs code
runs it only in the confined process, where the grants of the restoring request decide what it may do. The
controls show the same bytes do what they say where nothing confines them.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness.fixtures import session_key_config

from .pool_driver import PoolProcess, new_id, pool_process, refused

pytestmark = pytest.mark.timeout(120)

# A state's layout (server/session_state.py), as a client would see it: a header, the HMAC, the pickle.
_MAGIC = b"pynox-session-state-1\n"
_HEADER = len(_MAGIC) + 32


def _ok(result: dict[str, Any]) -> dict[str, Any]:
    assert result["exit"] == 0 and result["error"] is None, result
    return result


@pytest.fixture(scope="module")
def key_config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A config with a key file, so that two pools share the key (as a pool restarted with it would)."""
    return session_key_config(tmp_path_factory.mktemp("state-key"), 'max_session_state = "64KiB"\n')


@pytest.fixture(scope="module")
def keyed(workdir: Path, key_config: Path) -> Iterator[PoolProcess]:
    with pool_process("--workers=1", f"--config={key_config}", cwd=workdir) as pool:
        yield pool


def _save(pool: PoolProcess, code: str, **grants: Any) -> dict[str, Any]:
    name = new_id("saved")
    _ok(pool.run(code, session=name, **grants))
    return pool.run(session=name, save=True)


def test_a_saved_session_comes_back_in_a_new_pool_with_the_same_key(keyed: PoolProcess, workdir: Path,
                                                                     key_config: Path) -> None:
    (workdir / "secret.txt").write_text("only with the grant")
    saved = _ok(_save(keyed, "import threading\nrows = [1, 2, 3]\nsame = rows\ndef double(x):\n    return 2 * x\n"
                             "text = open('secret.txt').read()\ngen = (i for i in rows)\n"
                             "lock = threading.Lock()\nsink = open('/dev/null', 'w')", allow_read=["secret.txt"]))
    skipped = {item["name"]: item["reason"] for item in saved["skipped"]}
    assert set(skipped) == {"gen", "lock", "sink"}, skipped
    assert "generator" in skipped["gen"] and "lock" in skipped["lock"] and "reading" in skipped["sink"]
    # A new pool (the same key): the state comes back under the grants the restoring request gives, not
    # the saved session's: this one may not read the file the first one read.
    with pool_process("--workers=1", f"--config={key_config}", cwd=workdir) as fresh:
        name = new_id("restored")
        restored = _ok(fresh.run(session=name, restore=saved["state"]))
        assert restored["session"] == name and restored["session_ended"] is False
        step = _ok(fresh.run("print(rows, same is rows, double(21), text, 'gen' in globals(), threading.Lock)\n"
                             "try:\n    open('secret.txt')\nexcept PermissionError:\n    print('denied')",
                             session=name))
        assert step["stdout"] == ("[1, 2, 3] True 42 only with the grant False <built-in function allocate_lock>\n"
                                  "denied\n")


def test_a_restore_is_refused_on_an_open_session_and_a_save_needs_one(keyed: PoolProcess) -> None:
    name = new_id("open")
    _ok(keyed.run("x = 1", session=name))
    state = _ok(keyed.run(session=name, save=True))["state"]
    refused(keyed.run(session=name, restore=state), "already open")
    keyed.send({"id": "save-none", "session": new_id("none"), "save": True})  # as written: the driver adds no open
    refused(keyed.result("save-none"), "no open session")
    refused(keyed.run(session=name, restore=state, code="x"), "no code")


def test_a_forged_a_changed_and_a_foreign_state_are_refused_before_anything_runs(keyed: PoolProcess,
                                                                                  workdir: Path) -> None:
    marker = workdir / f"forged-{new_id()}"
    saved = _ok(_save(keyed, f"class Payload:\n    def __reduce__(self):\n"
                             f"        return (exec, (\"open({str(marker)!r}, 'w').write('ran')\",))\n"
                             "p = Payload()"))
    signed = base64.b64decode(saved["state"])
    pickled = signed[_HEADER:]
    forged = _MAGIC + os.urandom(32) + pickled  # the right layout, an HMAC made without the key
    changed = bytearray(signed)
    changed[-2] ^= 0x01
    # Each with the grant that lets the payload write the marker: only the HMAC stands between it and a run.
    grant = {"allow_write": [str(workdir)]}
    for state, words in ((forged, "HMAC"), (bytes(changed), "HMAC"), (b"not a state", "not a Pynox session state"),
                         (pickled, "not a Pynox session state")):
        refused(keyed.run(session=new_id("forged"), restore=base64.b64encode(state).decode(), **grant), words)
    refused(keyed.run(session=new_id("forged"), restore="***"), "base64")
    # Another pool, with a key of its own (made at random as it started): the same state is foreign there.
    with pool_process("--workers=1", cwd=workdir) as other:
        refused(other.run(session=new_id("foreign"), restore=saved["state"], **grant), "another key")
    assert not marker.exists()
    # Control: the genuine state, with the grant, does run its payload (in the confined process).
    _ok(keyed.run(session=new_id("genuine"), restore=saved["state"], **grant))
    assert marker.read_text() == "ran"


def test_a_state_whose_unpickling_runs_code_runs_it_only_confined(keyed: PoolProcess, tmp_path: Path) -> None:
    marker = tmp_path / "unpickled"
    saved = _ok(_save(keyed, f"class Payload:\n    def __reduce__(self):\n"
                             f"        return (exec, (\"open({str(marker)!r}, 'w').write('ran')\",))\n"
                             "p = Payload()"))
    # Restored without a write grant: the payload runs in the new session's process, and its policy stops it.
    result = keyed.run(session=new_id("restored"), restore=saved["state"])
    assert result["error"]["type"] == "PermissionError", result
    assert not marker.exists()
    # Control: the same pickle, loaded where nothing confines it (a plain interpreter), writes the marker.
    pickled = tmp_path / "state.pickle"
    pickled.write_bytes(base64.b64decode(saved["state"])[_HEADER:])
    subprocess.run([sys.executable, "-c", f"import pickle; pickle.loads(open({str(pickled)!r}, 'rb').read())"],
                   check=True, timeout=60)
    assert marker.read_text() == "ran"


def test_a_state_over_the_cap_is_neither_saved_nor_taken(keyed: PoolProcess) -> None:
    name = new_id("big")
    _ok(keyed.run("import os\nsmall = 1\nbig = os.urandom(100_000)", session=name))
    result = keyed.run(session=name, save=True)
    assert result["error"]["type"] == "SessionStateError" and "max_session_state" in result["error"]["message"]
    assert "state" not in result and result["session_ended"] is False
    _ok(keyed.run("del big", session=name))  # the session lives on; without the big value it saves
    assert _ok(keyed.run(session=name, save=True))["state"]
    oversized = base64.b64encode(_MAGIC + os.urandom(32) + os.urandom(100_000)).decode()
    refused(keyed.run(session=new_id("big"), restore=oversized), "larger than this pool takes")


def test_what_a_variable_prints_as_it_is_pickled_does_not_cost_the_state(pool: PoolProcess) -> None:
    """A ``__reduce__`` that printed past the save step's output cap (the state's base64 and 64 KiB) cut the state's
    line off: the save failed, saying the state was larger than the pool takes. What it prints is dropped, as the
    save's other output is."""
    name = new_id("loud")
    _ok(pool.run("import os\nclass Loud:\n    def __reduce__(self):\n        print('x' * 3_000_000)\n"
                 "        os.write(1, b'y' * 3_000_000)\n        return (Loud, ())\nloud = Loud()\nsmall = 42",
                 session=name))
    saved = _ok(pool.run(session=name, save=True))
    assert saved["skipped"] == [], saved["skipped"]
    restored = new_id("loud")
    _ok(pool.run(session=restored, restore=saved["state"]))
    step = _ok(pool.run("print(small, type(loud).__name__)", session=restored))
    assert step["stdout"] == "42 Loud\n", step
    # Control: what the session prints in a step of its own is its output as ever.
    assert _ok(pool.run("print('x' * 10)", session=name))["stdout"] == "x" * 10 + "\n"


def test_a_variable_named_or_failing_in_text_that_is_not_utf8_is_skipped_not_the_whole_save(
        pool: PoolProcess) -> None:
    # globals() takes any string as a name, and a pickler's message may quote the value: a lone surrogate in a
    # skipped one's name or reason could not be encoded, and the whole save failed (UnicodeEncodeError).
    name = new_id("odd")
    _ok(pool.run("class Odd:\n    def __reduce__(self):\n        raise TypeError('no ' + chr(0xdc80))\n"
                 "globals()['gen' + chr(0xd800)] = (n for n in range(3))\nodd = Odd()\nkept = 7", session=name))
    saved = _ok(pool.run(session=name, save=True))
    skipped = {item["name"]: item["reason"] for item in saved["skipped"]}
    assert set(skipped) == {"gen\\ud800", "odd"} and "no \\udc80" in skipped["odd"], skipped
    restored = new_id("odd")
    _ok(pool.run(session=restored, restore=saved["state"]))
    assert _ok(pool.run("print(kept)", session=restored))["stdout"] == "7\n"


def test_the_largest_state_and_its_skipped_names_fit_one_protocol_line(pool: PoolProcess) -> None:
    # The default cap (720 KiB), nearly filled, and more unpicklable variables with long names than the
    # answer lists: the save's answer and the restore's request each stay within the 1 MiB line.
    name = new_id("large")
    _ok(pool.run("import os\nblob = os.urandom(730_000)\n"
                 "for i in range(80):\n    globals()['generator_with_a_long_name_' + 'x' * 150 + str(i)] = "
                 "(n for n in range(1))", session=name))
    saved = _ok(pool.run(session=name, save=True))
    assert len(json.dumps(saved).encode()) < 1 << 20
    assert len(saved["skipped"]) == 51 and saved["skipped"][-1] == {"name": "*", "reason": "and 30 more left out"}
    assert all(len(item["name"]) <= 100 for item in saved["skipped"])
    restored = _ok(pool.run(session=new_id("large"), restore=saved["state"]))
    assert restored["step"] == 1


def test_no_grant_may_hold_the_session_key_file(keyed: PoolProcess, pool: PoolProcess, key_config: Path) -> None:
    """A job that read the key could sign a state that another client's session then restores, with that
    client's grants: no grant of any kind may hold it."""
    key = key_config.parent / "state.key"
    read_key = f"print(len(open({str(key)!r}, 'rb').read()))"
    for field, path in (("allow_read", key.parent), ("allow_read", key), ("allow_write", key.parent),
                        ("package_dirs", key.parent)):
        why = refused(keyed.run(read_key, **{field: [str(path)]}))
        assert "session_key_file" in why and "may never read it" in why, why
        why = refused(keyed.run(read_key, session=new_id("key"), **{field: [str(path)]}))
        assert "session_key_file" in why, why
    # Control: a pool that keeps no key there grants the directory, and the job reads the file.
    assert _ok(pool.run(read_key, allow_read=[str(key.parent)]))["stdout"] == "32\n"
