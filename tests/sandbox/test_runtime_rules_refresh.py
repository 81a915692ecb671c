"""The template's runtime rules are reopened when a path names another file: the native identity check (one
call and one comparison before each fork) finds what the per-path stat finds, and never skips a change."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pynox.policy import RuntimeRules, landlock, native

pytestmark = pytest.mark.pure


def _paths(tmp_path: Path) -> list[str]:
    (tmp_path / "file").write_text("a")
    (tmp_path / "dir").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "file")
    return [str(tmp_path / name) for name in ("file", "dir", "link", "missing")]


@pytest.mark.skipif(native.load_error() is not None, reason="the native extension did not load")
def test_native_identities_are_those_os_stat_gives(tmp_path: Path) -> None:
    paths = _paths(tmp_path)
    packed = native.path_identities(tuple(os.fsencode(path) for path in paths))
    assert packed is not None
    got = [tuple(memoryview(packed)[16 * i:16 * i + 16].cast("Q")) for i in range(len(paths))]
    expected = []
    for path in paths:
        try:
            info = os.stat(path)  # follows the link, as a rule's open does
            expected.append((info.st_dev, info.st_ino))
        except FileNotFoundError:
            expected.append((0, 0))
    assert got == expected


@pytest.mark.parametrize("check", ["native", "python"])
def test_a_file_replaced_on_the_host_is_reopened_and_nothing_else(tmp_path: Path, check: str,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    if check == "native" and native.load_error() is not None:
        pytest.skip("the native extension did not load")
    if check == "python":
        monkeypatch.setattr("pynox.policy.path_identities", lambda paths: None)
    paths = _paths(tmp_path)
    rules = RuntimeRules([(path, landlock.ACCESS_FS_READ) for path in paths])
    before = rules.current()
    rules.refresh()
    assert rules.generation == 0 and rules.current() is before  # nothing changed: nothing reopened
    (tmp_path / "new").write_text("b")
    os.replace(tmp_path / "new", tmp_path / "file")  # as a DHCP client replaces /etc/resolv.conf
    rules.refresh()
    assert rules.generation > 0
    now = os.stat(tmp_path / "file")
    held = [os.fstat(fd) for fd, _ in rules.current()]
    assert sum((info.st_dev, info.st_ino) == (now.st_dev, now.st_ino) for info in held) == 2  # file and link
    generation = rules.generation
    rules.refresh()
    assert rules.generation == generation  # once reopened, the next refresh finds nothing
    (tmp_path / "missing").write_text("c")  # a path that was missing exists now: it gets its rule
    rules.refresh()
    assert rules.generation > generation and len(rules.current()) == len(paths)
