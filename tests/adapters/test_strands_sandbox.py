"""``PynoxSandbox``'s own ``python_repl`` and ``file_editor``: what the model is told is true under Pynox.

Real strands agents with a scripted model, on a real pool. strands' stock tools describe
another sandbox (files in the working directory persist, variables do not) and its
``file_editor`` lists a path's parent before touching it, which a grant of one
directory or one file does not allow; these tests hold the sandbox's replacements to
what Pynox really does. Every confinement check looks from the host's side and has a
control in which the grant is given and the harm happens.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from strands import Agent
from strands.vended_tools import file_editor as stock_file_editor
from strands.vended_tools import python_repl as stock_python_repl

from pynox import Pool
from pynox_strands import PynoxSandbox

from .scripted import ScriptedStrandsModel, Transcript, run_strands

pytestmark = pytest.mark.timeout(60)

STOCK_PROMISES = ("Files written to the working directory persist", "do not persist across calls")


def view(path: Path) -> tuple[str, dict[str, Any]]:
    return "file_editor", {"command": "view", "path": str(path)}


def edit(command: str, path: Path, **args: Any) -> tuple[str, dict[str, Any]]:
    return "file_editor", {"command": command, "path": str(path), **args}


def repl(code: str) -> tuple[str, dict[str, Any]]:
    return "python_repl", {"code": code}


def drive(pool: Pool, calls: list[tuple[str, dict[str, Any]]], **options: Any) -> Transcript:
    return run_strands({"sandbox": PynoxSandbox(pool, vend=["python_repl", "file_editor"], **options)}, calls)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A directory, a file and a secret side by side; the tests grant some of them, never their parent."""
    (tmp_path / "granted" / "sub").mkdir(parents=True)
    (tmp_path / "granted" / "a.txt").write_text("alpha\n")
    (tmp_path / "granted" / "sub" / "b.txt").write_text("beta\n")
    (tmp_path / "granted" / ".hidden").write_text("")
    (tmp_path / "notes.txt").write_text("first line\nsecond line\n")
    (tmp_path / "secret.txt").write_text("top secret\n")
    return tmp_path


def test_the_model_sees_the_vended_tools_and_no_other(pool: Pool) -> None:
    transcript = drive(pool, [])
    assert [seen.name for seen in transcript.tools] == ["python_repl", "file_editor"]
    agent = Agent(model=ScriptedStrandsModel([]), callback_handler=None,
                  sandbox=PynoxSandbox(pool, vend=["python_repl", "file_editor"]))
    # Tools of its own, not strands' module-level instances (whose descriptions it could not change).
    assert agent.tool_registry.registry["python_repl"] is not stock_python_repl
    assert agent.tool_registry.registry["file_editor"] is not stock_file_editor


def test_file_editor_views_a_granted_directory_and_a_file_granted_on_its_own(pool: Pool, tree: Path) -> None:
    granted, notes = tree / "granted", tree / "notes.txt"
    transcript = drive(pool, [view(granted), view(notes), view(tree)], allow_read=[str(granted), str(notes)])
    directory, file, parent = transcript.results
    assert directory == (f"Here's the files and directories up to 2 levels deep in {granted}, excluding hidden "
                         "items:\na.txt\nsub\nsub/b.txt\n")
    assert file == f"Here's the result of running `cat -n` on {notes}:\n     1  first line\n     2  second line\n" \
                   "     3  \n"
    # The parent, which is not granted, shows what the grants make visible in it, and nothing else.
    assert parent.endswith("excluding hidden items:\ngranted\ngranted/a.txt\ngranted/sub\ngranted/sub/b.txt\n"
                           "notes.txt\n")
    assert "secret" not in parent


def test_a_denied_view_names_the_path_the_grant_and_what_would_allow_it(pool: Pool, tree: Path) -> None:
    granted, secret = tree / "granted", tree / "secret.txt"
    # Beside a granted directory (strands' listing of the parent does not show the secret), and alone.
    transcript = drive(pool, [view(secret), view(Path("/etc/shadow"))], allow_read=[str(granted)])
    beside, alone = transcript.results
    assert beside.startswith(f"Error: PermissionError - Cannot read {secret}: permission denied.")
    assert f"(granted: {granted})" in beside and f'allow_read=["{secret}"]' in beside
    assert "Cannot read /etc/shadow" in alone and 'allow_read=["/etc/shadow"]' in alone
    for text in transcript.results:
        assert "agent.py" not in text and "top secret" not in text and "does not exist" not in text
    control = drive(pool, [view(secret)], allow_read=[str(tree)])
    assert "top secret" in control.results[0]


def test_file_editor_edits_only_where_writing_is_granted(pool: Pool, tree: Path) -> None:
    out, notes, outside = tree / "granted" / "out", tree / "notes.txt", tree / "outside.txt"
    elsewhere = tree / "elsewhere" / "new.txt"  # in a directory with nothing granted inside it
    out.mkdir()
    elsewhere.parent.mkdir()
    transcript = drive(pool, [edit("create", out / "new.txt", file_text="one\ntwo"),
                              edit("str_replace", out / "new.txt", old_str="two", new_str="2"),
                              edit("insert", out / "new.txt", insert_line=0, new_str="zero"),
                              edit("create", outside, file_text="escaped"),
                              edit("str_replace", notes, old_str="first", new_str="changed"),
                              edit("create", elsewhere, file_text="escaped")],
                       allow_write=[str(out)], allow_read=[str(notes)])
    created, replaced, inserted, escaped, read_only, unlisted = transcript.results
    assert created == f"File created successfully at: {out / 'new.txt'}"
    assert replaced.startswith(f"The file {out / 'new.txt'} has been edited.") and inserted.startswith(
        f"The file {out / 'new.txt'} has been edited.")
    assert (out / "new.txt").read_text() == "zero\none\n2"
    # The file does not exist yet, so it cannot be granted: the hint names its directory, which can.
    assert escaped.startswith(f"Error: PermissionError - Cannot write {outside}: permission denied.")
    assert f"{outside} does not exist yet" in escaped
    assert f"granted: {out}, {notes}" in escaped and f'allow_write=["{tree}"]' in escaped
    assert read_only.startswith(f"Error: PermissionError - Cannot write {notes}: permission denied.")
    assert f'allow_write=["{notes}"]' in read_only and "readable but not writable" in read_only
    # strands lists the directory first; its refusal is told about the path the model gave.
    assert unlisted.startswith(f"Error: PermissionError - Cannot create {elsewhere}: its directory "
                               f"{elsewhere.parent} may not be listed. Hint: {elsewhere.parent} is outside")
    assert f'allow_write=["{elsewhere.parent}"]' in unlisted
    for text in transcript.results:
        assert "agent.py" not in text
    assert not outside.exists() and not elsewhere.exists() and notes.read_text() == "first line\nsecond line\n"
    control = drive(pool, [edit("create", outside, file_text="escaped"),
                           edit("str_replace", notes, old_str="first", new_str="changed"),
                           edit("create", elsewhere, file_text="escaped")],
                    allow_write=[str(tree)])
    assert control.results[0] == f"File created successfully at: {outside}"
    assert outside.read_text() == "escaped" and notes.read_text() == "changed line\nsecond line\n"
    assert elsewhere.read_text() == "escaped"


def test_a_file_granted_alone_can_be_edited(pool: Pool, tree: Path) -> None:
    notes = tree / "notes.txt"
    transcript = drive(pool, [edit("str_replace", notes, old_str="second", new_str="2nd")],
                       allow_write=[str(notes)])
    assert transcript.results[0].startswith(f"The file {notes} has been edited.")
    assert notes.read_text() == "first line\n2nd line\n"


def test_python_repl_with_a_session_says_variables_persist_and_where_files_may_be_written(
        pool: Pool, tmp_path: Path) -> None:
    out, escaped = tmp_path / "out", tmp_path / "escaped.txt"
    out.mkdir()
    transcript = drive(pool, [repl("x = 41"), repl("print(x + 1)"),
                              repl(f"open({str(out / 'kept.txt')!r}, 'w').write('kept')"),
                              repl(f"open({str(escaped)!r}, 'w').write('escaped')")],
                       session=True, allow_write=[str(out)])
    description = transcript.tool("python_repl").description
    assert "variables, imports and definitions persist across calls" in description
    assert f"Files can be written only under {out}" in description
    for promise in STOCK_PROMISES:
        assert promise not in description
    assert json.loads(transcript.results[1])["output"] == "42\n"  # as described: the variable persisted
    denied = json.loads(transcript.results[3])
    # (escaped.txt is not there yet: the grant that allows it names its directory)
    assert denied["exit_code"] == 1 and f'allow_write=["{escaped.parent}"]' in denied["error"]
    assert (out / "kept.txt").read_text() == "kept"  # the control: the granted write lands on the host
    assert not escaped.exists()


def test_python_repl_without_a_session_or_a_write_grant_says_nothing_persists(pool: Pool, tmp_path: Path) -> None:
    target = tmp_path / "saved.txt"
    transcript = drive(pool, [repl("x = 41"), repl("print(x + 1)"), repl(f"open({str(target)!r}, 'w').write('1')")],
                       allow_read=[str(tmp_path)])
    description = transcript.tool("python_repl").description
    assert "variables, imports, and definitions do not persist across calls" in description
    assert "Writing files is denied everywhere" in description and "Files written to" not in description
    assert f"Read files: {tmp_path}" in description
    assert "NameError" in json.loads(transcript.results[1])["error"]
    assert "readable but not writable" in json.loads(transcript.results[2])["error"]
    assert not target.exists()


def test_file_editors_description_says_what_it_may_view_and_change(pool: Pool, tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    (tmp_path / "out").mkdir()
    read_only = drive(pool, [], allow_read=[str(tmp_path / "in")]).tool("file_editor").description
    assert f"It can view {tmp_path / 'in'}" in read_only
    assert "It can create or edit nothing: every file is read-only here." in read_only
    writable = drive(pool, [], allow_write=[str(tmp_path / "out")]).tool("file_editor").description
    assert f"It can create or edit files only under {tmp_path / 'out'}." in writable


def test_vend_names_the_tools_and_refuses_anything_else(pool: Pool) -> None:
    with pytest.raises(TypeError, match=r"vend=\['python_repl'\]"):
        PynoxSandbox(pool, vend="python_repl")
    with pytest.raises(ValueError, match=r"cannot vend shell: it vends run_python, python_repl, file_editor"):
        PynoxSandbox(pool, vend=["shell"])
    with pytest.raises(TypeError, match="vend_tool=False"):
        PynoxSandbox(pool, vend=["python_repl"], vend_tool=False)
    assert [tool.tool_name for tool in PynoxSandbox(pool, vend=["file_editor", "run_python"]).get_tools()] == [
        "file_editor", "run_python"]
