"""The template's runtime rules are reopened when a path names another file: the native identity check (one
call and one comparison before each fork) finds what the per-path stat finds, and never skips a change."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pynox.policy import RuntimeRules, landlock, native
from pynox.policy.runtime import RuntimeWatch
from tests.setup_facts import OUTER_SECCOMP

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
    # file and link, reopened both: one rule (two rules on one inode are one, with the rights of both)
    assert sum((info.st_dev, info.st_ino) == (now.st_dev, now.st_ino) for info in held) == 1
    generation = rules.generation
    rules.refresh()
    assert rules.generation == generation  # once reopened, the next refresh finds nothing
    (tmp_path / "missing").write_text("c")  # a path that was missing exists now: it gets its rule
    rules.refresh()
    assert rules.generation > generation and len(rules.current()) == len(paths) - 1  # file and link: one rule


def test_paths_that_name_one_file_make_one_rule_with_the_rights_of_both(tmp_path: Path) -> None:
    """A link and its target (``/lib`` and ``/usr/lib``) are one inode: one rule, with the rights of both, as
    Landlock joins two rules on one inode; each child adds one rule fewer. Control: two files are two rules."""
    (tmp_path / "file").write_text("a")
    (tmp_path / "other").write_text("b")
    (tmp_path / "link").symlink_to(tmp_path / "file")
    read, write = landlock.READ_FILE, landlock.WRITE_FILE
    rules = RuntimeRules([(str(tmp_path / "file"), read), (str(tmp_path / "link"), write),
                          (str(tmp_path / "other"), read)])
    held = {(os.fstat(fd).st_ino, rights) for fd, rights in rules.current()}
    assert held == {(os.stat(tmp_path / "file").st_ino, read | write), (os.stat(tmp_path / "other").st_ino, read)}


def test_the_watch_counts_a_path_that_names_another_file_and_nothing_else(tmp_path: Path) -> None:
    """What the server asks before it hands a job to a child prepared ahead (RuntimeWatch.changes): a file
    renamed over, a symlink's target renamed over, a directory on the way replaced are each a change; a
    write in place (the same inode, which the rule still holds) and another file of the same directory are
    not. The control of each change: the path's identity did change, as a rule would see it."""
    paths = _paths(tmp_path)
    (tmp_path / "dir" / "target").write_text("t")
    (tmp_path / "dir" / "link").symlink_to(tmp_path / "dir" / "target")
    watched = [*paths, str(tmp_path / "dir" / "link")]
    watch = RuntimeWatch(watched)
    try:
        seen = watch.changes()
        (tmp_path / "file").write_text("in place")
        (tmp_path / "other").write_text("another file")
        os.replace(tmp_path / "other", tmp_path / "another")
        assert watch.changes() == seen  # nothing a rule holds changed
        # A file, the target a watched symlink leads to, a path that was missing.
        for replaced in (tmp_path / "file", tmp_path / "dir" / "target", tmp_path / "missing"):
            before = _identity(replaced)
            _rename_over(replaced)
            assert _identity(replaced) != before  # the control: a rule opened before holds another inode
            assert watch.changes() == seen + 1, replaced
            seen += 1
        moved = tmp_path / "moved"
        os.rename(tmp_path / "dir", moved)  # the directory on the way to the link: another one takes its name
        (tmp_path / "dir").mkdir()
        assert watch.changes() > seen
        seen = watch.changes()
        _rename_over(tmp_path / "dir" / "link")  # watched again in the new directory
        assert watch.changes() == seen + 1
    finally:
        watch.close()


def _mount_tmpfs(place: Path) -> None:
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(place)], check=False,
                          capture_output=True, text=True)
    if done.returncode != 0:
        if OUTER_SECCOMP:
            pytest.skip("a container's profile refuses the test its mount")
        pytest.fail(f"cannot mount a tmpfs as root: {done.stderr}", pytrace=False)


@pytest.mark.needs_root("mounting a tmpfs takes root")
def test_the_watch_counts_a_mount_on_the_way_and_not_one_elsewhere(tmp_path: Path) -> None:
    """Each change of the mount table discarded every child prepared ahead, whatever was mounted: on a host
    that starts containers, or beside another test's tmpfs, no job was handed one. A mount elsewhere is no
    change; the control, a mount over a directory on the way to a watched path, is one, and so is its end."""
    watched = tmp_path / "watched"
    watched.mkdir()
    paths = _paths(watched)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    watch = RuntimeWatch(paths)
    try:
        seen = watch.changes()
        _mount_tmpfs(elsewhere)
        try:
            assert watch.changes() == seen
        finally:
            subprocess.run(["umount", str(elsewhere)], check=True)
        assert watch.changes() == seen
        before = _identity(watched / "dir")
        _mount_tmpfs(watched / "dir")  # on the way to nothing but itself: a path of the rules
        try:
            assert _identity(watched / "dir") != before  # the control: the path names another directory
            assert watch.changes() > seen
            seen = watch.changes()
        finally:
            subprocess.run(["umount", str(watched / "dir")], check=True)
        assert watch.changes() > seen
    finally:
        watch.close()


def _bind(source: Path, place: Path) -> None:
    done = subprocess.run(["mount", "--bind", str(source), str(place)], check=False, capture_output=True, text=True)
    if done.returncode != 0:
        if OUTER_SECCOMP:
            pytest.skip("a container's profile refuses the test its mount")
        pytest.fail(f"cannot bind mount as root: {done.stderr}", pytrace=False)


@pytest.mark.needs_root("a bind mount takes root")
@pytest.mark.parametrize("renamed", ["source", "its parent"])
def test_the_watch_counts_a_bind_mount_made_again_over_another_directory(tmp_path: Path, renamed: str) -> None:
    """Review of the mount filter: a mount's id is the lowest free one, so a bind mount made again at the same
    place, of the directory that took the old source's name, is the very line mountinfo showed before (id,
    device, root, place): compared by those alone it was no change, and a child prepared ahead kept the old
    directory's rule (the new one denied to its job, the old one still readable where it was moved to). The
    watched path is the mount itself (no directory of it watched) and the rename is off the way (the source's
    side). The control: the path names another directory."""
    source = tmp_path / "source" / "runtime"
    source.mkdir(parents=True)
    place = tmp_path / "place"
    place.mkdir()
    _bind(source, place)
    watch = RuntimeWatch([str(place)])
    try:
        seen = watch.changes()
        before = _identity(place)
        subprocess.run(["umount", str(place)], check=True)
        if renamed == "source":
            os.rename(source, source.with_name("old"))
        else:
            os.rename(source.parent, tmp_path / "old")
        source.mkdir(parents=True)
        _bind(source, place)
        try:
            assert _identity(place) != before  # the control: a rule opened before holds another directory
            assert watch.changes() > seen
        finally:
            subprocess.run(["umount", str(place)], check=True)
    finally:
        watch.close()


def _rename_over(path: Path) -> None:
    new = path.with_name(path.name + ".new")
    new.write_text("new")
    os.replace(new, path)


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return None
    return info.st_dev, info.st_ino


# Run in a user namespace of its own, whose inotify watches the test bounds (/proc/sys/user/max_inotify_watches
# is its own there): the watch of the runtime's paths when the user's watches are used up.
_BOUNDED_WATCH = """
import os, sys, types
from pynox.policy.runtime import RuntimeWatch, runtime_watch
base, limit = sys.argv[1], sys.argv[2]
paths = [f"{base}/a/b/c/file", f"{base}/x/file"]
if limit == "exact":  # as many as the watch needs: it is made, and cannot watch a directory that replaces one
    limit = str(len(RuntimeWatch._entries(types.SimpleNamespace(_paths=paths))))
if limit != "none":
    with open("/proc/sys/user/max_inotify_watches", "w") as bound:
        bound.write(limit)
watch = runtime_watch(paths)
seen = watch.changes()
if sys.argv[2] == "exact":
    assert type(watch).__name__ == "RuntimeWatch", watch
    os.rename(f"{base}/x", f"{base}/x.old")  # a directory on the way replaced: the new one needs a watch more
    os.mkdir(f"{base}/x")
    open(f"{base}/x/file", "w").close()
    assert watch.changes() != seen
    seen = watch.changes()
open(f"{base}/x/new", "w").close()
os.replace(f"{base}/x/new", f"{base}/x/file")
print(type(watch).__name__, watch.changes() != seen)
"""


@pytest.mark.parametrize("limit", ["none", "3", "exact"])
def test_a_directory_the_watch_cannot_watch_is_no_path_left_unseen(tmp_path: Path, limit: str) -> None:
    """The review's finding on the runtime's watch: a directory on the way that inotify refuses to watch (ENOSPC,
    the user's watches used up by anything else the user runs; EACCES) was skipped as if it were missing, so a
    file renamed over in it was no change, and a child prepared before kept serving with the old file's rule.
    Where the watch cannot cover every path, no prepared child is handed a job: each call is a change (limit 3:
    from the start; exact: once a directory on the way is replaced and the new one cannot be watched).
    Control (limit none): with watches to spare, the same rename is seen by a real watch."""
    unshare = shutil.which("unshare")
    if unshare is None or subprocess.run([unshare, "--user", "--map-root-user", "true"],
                                         capture_output=True).returncode != 0:
        pytest.skip("no user namespace here (unshare --user fails)")
    (tmp_path / "a" / "b" / "c").mkdir(parents=True)
    (tmp_path / "x").mkdir()
    (tmp_path / "a" / "b" / "c" / "file").write_text("a")
    (tmp_path / "x" / "file").write_text("x")
    run = subprocess.run([unshare, "--user", "--map-root-user", sys.executable, "-c", _BOUNDED_WATCH,
                          str(tmp_path), limit], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    kind, seen = run.stdout.split()
    assert seen == "True", (kind, run.stderr)
    if limit == "none":
        assert kind == "RuntimeWatch"  # the control: a real watch saw it
