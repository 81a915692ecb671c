"""Scratch directories through the real pool: files in and out of a session, and the bounds of the pool's file work.

The pool runs as root here, so the policy is the only protection: each attack is a file the job (or the
test, from outside, where a job could not) plants in the scratch directory, and each is checked from outside:
the answer is a refusal that names the rule, and nothing outside the directory was read or changed. The
controls show the pool does read and write a regular file inside.
"""

from __future__ import annotations

import base64
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .pool_driver import PoolProcess, new_id, pool_process, refused

pytestmark = pytest.mark.timeout(120)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _ok(result: dict[str, Any]) -> dict[str, Any]:
    assert result["exit"] == 0 and result["error"] is None, result
    return result


def _open(pool: PoolProcess, code: str = "") -> tuple[str, Path]:
    """A session with a scratch directory, and that directory (as its code sees it: its working directory)."""
    name = new_id("files")
    result = _ok(pool.run(code + "\nimport os\nprint(os.getcwd())", session=name, scratch=True))
    return name, Path(result["stdout"].splitlines()[-1])


def _download(pool: PoolProcess, name: str, path: str) -> dict[str, Any]:
    return pool.run(session=name, download=path)


def _upload(pool: PoolProcess, name: str, path: str, data: bytes, offset: int = 0) -> dict[str, Any]:
    return pool.run(session=name, upload={"path": path, "data": _b64(data), "offset": offset})


@pytest.fixture
def outside(tmp_path: Path) -> Iterator[Path]:
    """A file of the test's own, outside every scratch directory, with a secret the pool must never send."""
    secret = tmp_path / "secret.txt"
    secret.write_text("outside-secret-" + new_id())
    yield secret


def test_a_session_works_in_its_scratch_directory_and_its_files_go_in_and_out(pool: PoolProcess,
                                                                              workdir: Path) -> None:
    name, scratch = _open(pool, "import os\nprint(os.environ['PYNOX_SCRATCH'] == os.getcwd())\n"
                                "open('out.csv', 'w').write('a,b\\n1,2\\n')")
    assert scratch.is_dir() and not scratch.is_relative_to(workdir)
    listed = pool.run(session=name, files=True)
    assert [(f["path"], f["size"], f["mime"]) for f in listed["files"]] == [("out.csv", 8, "text/csv")]
    got = _download(pool, name, "out.csv")["downloaded"]
    assert base64.b64decode(got["data"]) == b"a,b\n1,2\n" and got["eof"] and got["size"] == 8
    # In: a file (in a directory the pool makes) the next step reads by its relative name.
    put = _upload(pool, name, "in/data.txt", b"hello")["uploaded"]
    assert (put["path"], put["size"]) == ("in/data.txt", 5)
    assert _ok(pool.run("print(open('in/data.txt').read())", session=name))["stdout"] == "hello\n"
    # A file bigger than one line, in pieces: each at the file's end.
    big = os.urandom(700_000)
    _upload(pool, name, "big.bin", big[:400_000])
    _upload(pool, name, "big.bin", big[400_000:], offset=400_000)
    assert (scratch / "big.bin").read_bytes() == big
    assert "offset 0" in refused(_upload(pool, name, "big.bin", b"x", offset=5))
    pool.run(session=name, close=True)
    assert not scratch.exists()  # removed when the session ends


def test_relative_grants_and_a_session_without_scratch_keep_the_pools_directory(pool: PoolProcess,
                                                                                workdir: Path) -> None:
    (workdir / "data").mkdir(exist_ok=True)
    (workdir / "data" / "in.txt").write_text("granted")
    name = new_id("files")
    result = _ok(pool.run("import os\nprint(os.getcwd())", session=name, allow_read=["data"]))
    assert result["stdout"] == f"{workdir}\n"  # no scratch asked: the pool's directory, as before
    assert "no scratch directory" in refused(pool.run(session=name, files=True))
    pool.run(session=name, close=True)
    # With scratch, a relative grant still names the pool's data/ (absolute in the policy).
    with_grant = _ok(pool.run(f"print(open({str(workdir / 'data' / 'in.txt')!r}).read())",
                              session=new_id("files"), scratch=True, allow_read=["data"]))
    assert with_grant["stdout"] == "granted\n"
    assert with_grant["policy"]["allow_read"] == [str(workdir / "data")]


def test_a_symlink_to_a_file_outside_is_never_followed(pool: PoolProcess, outside: Path) -> None:
    name, scratch = _open(pool, f"import os\nos.symlink('/etc/shadow', 'shadow')\nos.symlink({str(outside)!r}, "
                                "'mine')\nopen('real.txt', 'w').write('inside')")
    assert (scratch / "shadow").is_symlink() and (scratch / "mine").is_symlink()  # the attack is in place
    for link in ("shadow", "mine"):
        assert "symlink" in refused(_download(pool, name, link))
    assert "symlink" in refused(_upload(pool, name, "mine", b"overwritten"))
    assert outside.read_text().startswith("outside-secret-")  # not written through the link
    listed = pool.run(session=name, files=True)["files"]
    assert [f["path"] for f in listed] == ["real.txt"]  # links are not listed
    # A link on the way (a directory leading out) is refused too, for reading and for writing.
    _ok(pool.run(f"import os\nos.symlink({str(outside.parent)!r}, 'up')", session=name))
    assert "symlink" in refused(_download(pool, name, "up/secret.txt"))
    assert "symlink" in refused(_upload(pool, name, "up/planted.txt", b"x"))
    assert not (outside.parent / "planted.txt").exists()
    # The control: a regular file inside is read.
    assert base64.b64decode(_download(pool, name, "real.txt")["downloaded"]["data"]) == b"inside"
    pool.run(session=name, close=True)


def test_paths_that_go_up_or_are_absolute_are_refused(pool: PoolProcess, outside: Path) -> None:
    name, scratch = _open(pool)
    assert scratch.is_dir()
    for path in ("../secret.txt", "a/../../x", str(outside), "/etc/shadow", "", ".", "a\0b"):
        assert "download" in refused(_download(pool, name, path)), path
        assert "upload" in refused(_upload(pool, name, path, b"x")), path
    assert outside.read_text().startswith("outside-secret-")
    assert sorted(p.name for p in scratch.parent.iterdir() if p.is_file()) == []  # nothing beside the directory
    pool.run(session=name, close=True)


def test_a_fifo_never_hangs_the_pool(pool: PoolProcess) -> None:
    name, _ = _open(pool, "import os\nos.mkfifo('pipe')")
    started = time.monotonic()
    assert "not a regular file" in refused(_download(pool, name, "pipe"))
    assert "not a regular file" in refused(_upload(pool, name, "pipe", b"x"))
    assert pool.run(session=name, files=True)["files"] == []
    assert time.monotonic() - started < 10
    _ok(pool.run("print('alive')", session=name))
    pool.run(session=name, close=True)


_NOT_UTF8 = ("open('ok.txt', 'w').write('ok')\nimport os\nos.mkdir(b'dir\\xff')\n"
             "open(b'dir\\xff/in.txt', 'w').write('x')\nopen(b'caf\\xe9.txt', 'w').write('x')\n")


def test_a_file_whose_name_is_not_utf8_is_passed_over(pool: PoolProcess) -> None:
    # No protocol line can carry its name: the result could not be written, and its worker thread died with it.
    for _ in range(3):  # more jobs than the pool's two workers
        result = _ok(pool.run(_NOT_UTF8, scratch=True))
        assert [f["path"] for f in result["files"]] == ["ok.txt"], result["files"]
    name, _ = _open(pool, _NOT_UTF8)
    assert [f["path"] for f in pool.run(session=name, files=True)["files"]] == ["ok.txt"]  # it had no answer
    _ok(pool.run("print('alive')", session=name))
    pool.run(session=name, close=True)


def test_a_hard_link_to_a_file_outside_is_neither_read_nor_written(pool: PoolProcess, outside: Path) -> None:
    name, scratch = _open(pool, "open('own.txt', 'w').write('own')")
    os.link(outside, scratch / "linked.txt")  # what a job cannot do, done from outside
    secret = outside.read_text()
    assert "more than one link" in refused(_download(pool, name, "linked.txt"))
    assert "more than one link" in refused(_upload(pool, name, "linked.txt", b"clobbered"))
    assert outside.read_text() == secret  # neither truncated nor written
    assert [f["path"] for f in pool.run(session=name, files=True)["files"]] == ["own.txt"]
    pool.run(session=name, close=True)
    assert outside.read_text() == secret  # removing the directory removed the link, not the file


def test_a_directory_swapped_for_a_symlink_between_list_and_read(pool: PoolProcess, outside: Path) -> None:
    name, _ = _open(pool, "import os\nos.mkdir('sub')\nopen('sub/secret.txt', 'w').write('inside')")
    assert [f["path"] for f in pool.run(session=name, files=True)["files"]] == ["sub/secret.txt"]
    # Between the listing and the read, sub/ becomes a link to a directory outside with a file of that name.
    _ok(pool.run(f"import os, shutil\nshutil.rmtree('sub')\nos.symlink({str(outside.parent)!r}, 'sub')",
                 session=name))
    assert "symlink" in refused(_download(pool, name, "sub/secret.txt"))
    pool.run(session=name, close=True)


def test_a_sessions_files_are_its_own(pool: PoolProcess) -> None:
    name, scratch = _open(pool)
    _upload(pool, name, "mine.txt", b"first session's")
    # Another session (with a scratch directory of its own, or none) cannot read or write it.
    other, other_scratch = _open(pool)
    assert other_scratch != scratch
    probe = (f"for mode in ('r', 'a'):\n    try:\n        open({str(scratch / 'mine.txt')!r}, mode)\n"
             "    except PermissionError:\n        print('denied', mode)")
    assert _ok(pool.run(probe, session=other))["stdout"] == "denied r\ndenied a\n"
    # Nor can any request be granted it, or the root of the scratch directories, or write where it holds them.
    for grant in (str(scratch), str(scratch.parent), str(scratch / "mine.txt")):
        for field in ("allow_read", "allow_write"):
            assert "scratch directories" in refused(pool.run("pass", **{field: [grant]}))
    # Writing where it holds them is refused for the scratch directories; where the interpreter lives below that
    # directory too (a checkout under /tmp), the runtime's rule refuses it first.
    why = refused(pool.run("pass", allow_write=[str(scratch.parent.parent)]))
    interpreter_below = Path(sys.prefix).resolve().is_relative_to(scratch.parent.parent.resolve())
    assert ("overlaps the runtime path" if interpreter_below else "scratch directories") in why, why
    assert (scratch / "mine.txt").read_bytes() == b"first session's"
    for session in (name, other):
        pool.run(session=session, close=True)


def test_a_session_that_ends_loses_its_directory_and_its_files(pool: PoolProcess) -> None:
    name, scratch = _open(pool, "open('kept.txt', 'w').write('x')")
    ended = pool.run("import time\ntime.sleep(60)", session=name, timeout="1s")
    assert ended["session_ended"] is True
    assert not scratch.exists()
    answer = pool.run(session=name, files=True, open=None)  # the driver would add "open" for an ended session
    assert "no open session" in refused(answer) and answer["session_ended"] is True


def test_a_plain_job_gets_its_files_with_its_result_and_its_directory_is_removed(pool: PoolProcess) -> None:
    result = _ok(pool.run("import os\nprint(os.getcwd())\nopen('report.json', 'w').write('{}')\n"
                          "os.mkdir('d')\nopen('d/x.png', 'wb').write(b'\\x89PNG')\nos.symlink('/etc/shadow', 'l')",
                          scratch=True))
    files = {f["path"]: f for f in result["files"]}
    assert sorted(files) == ["d/x.png", "report.json"]
    assert base64.b64decode(files["report.json"]["data"]) == b"{}" and files["d/x.png"]["mime"] == "image/png"
    assert not Path(result["stdout"].strip()).exists()
    assert "files" not in _ok(pool.run("print(1)"))  # a job that asked for none


def test_the_size_caps(tmp_path: Path) -> None:
    config = tmp_path / "pynox.toml"
    config.write_text('[pool]\nscratch_max_file = "1k"\nscratch_max_total = "2k"\n')
    with pool_process(f"--config={config}", "--workers=1", cwd=tmp_path) as pool:
        name, scratch = _open(pool, "open('huge.bin', 'wb').write(b'x' * 5000)")
        assert "scratch_max_file" in refused(_download(pool, name, "huge.bin"))
        assert "scratch_max_file" in refused(_upload(pool, name, "big.bin", b"y" * 1025))
        _ok(pool.run("import os\nos.remove('huge.bin')", session=name))
        _upload(pool, name, "one.bin", b"1" * 1000)
        _upload(pool, name, "two.bin", b"2" * 1000)
        assert "scratch_max_total" in refused(_upload(pool, name, "three.bin", b"3" * 1024))
        assert not (scratch / "big.bin").exists() and not (scratch / "three.bin").exists()
        root = scratch.parent
        pool.run(session=name, close=True)
    assert not root.exists()  # the pool's root goes with it


# A chdir into each new directory makes a tree as deep as the job likes; shutil.rmtree recursed once a level.
_DEEP = "import os\nscratch = os.getcwd()\nprint(scratch)\n" \
        "for _ in range(1500):\n    os.mkdir('d')\n    os.chdir('d')\n" \
        "os.symlink({outside!r}, 'out')\nopen('leaf.txt', 'w').write('x')\n" \
        "print(len(os.path.relpath(os.getcwd(), scratch).split('/')))"


def test_a_tree_thousands_deep_is_removed_and_the_pool_serves_on(pool: PoolProcess, outside: Path) -> None:
    result = _ok(pool.run(_DEEP.format(outside=str(outside.parent)), scratch=True))
    scratch, depth = result["stdout"].splitlines()
    assert depth == "1500" and result["files"] == []  # deeper than a listing looks
    assert not Path(scratch).exists()
    assert _ok(pool.run("print(2)"))["stdout"] == "2\n"
    assert outside.exists(), "the removal followed the symlink out"


# What a job leaves in its scratch directory is its choice, in number as in depth: the pool's removal of it must
# cost the job's result nothing past its deadline.
_MANY_FILES = """
import os
made = 0
while True:
    for _ in range(1000):
        os.close(os.open(str(made), os.O_CREAT | os.O_WRONLY))
        made += 1
    if made % 50_000 == 0:
        print(made, flush=True)
"""


@pytest.fixture
def own_scratch_dir(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """A config whose scratch_dir is the test's own (no other pool of this machine sweeps there), and that dir;
    removed by rm, whatever a failure left there (pytest's own removal of tmp_path recurses, as rmtree did)."""
    place = tmp_path / "scratch"
    place.mkdir()
    config = tmp_path / "pynox.toml"
    config.write_text(f"[pool]\nscratch_dir = {str(place)!r}\n")
    try:
        yield config, place
    finally:
        subprocess.run(["rm", "-rf", "--", str(place)], check=True, timeout=60)


def test_a_jobs_many_files_cost_its_result_nothing_past_its_deadline(tmp_path: Path,
                                                                    own_scratch_dir: tuple[Path, Path]) -> None:
    """A job that makes empty files in its scratch directory until its deadline: its result comes at that deadline,
    and the worker serves the next job at once. The pool removed them before the result (a 4 s job answered
    after 7-8 s with ~300,000 files), while its worker served no one. The control, a tmpfs, in
    test_memory_counted.py."""
    config, place = own_scratch_dir
    with pool_process(f"--config={config}", "--workers=1", cwd=tmp_path) as pool:
        started = time.monotonic()
        result = pool.run(_MANY_FILES, scratch=True, timeout="4s", wait=120)
        took = time.monotonic() - started
        assert result["exit"] == 124, result
        made = int(result["stdout"].split()[-1])
        assert made >= 50_000, result["stdout"]  # the attack took place
        assert len(result["files"]) <= 10_000  # a bounded look: at most 10,000 entries
        assert took < 4 + 1.5, f"a job with a 4 s deadline and {made} files was answered after {took:.1f} s"
        begun = time.monotonic()
        assert _ok(pool.run("print('next')", wait=60))["stdout"] == "next\n"
        # On a tmpfs the files are pages of the template's memory cgroup: its worker removes them before its next
        # job, whose memory limit is set from what that cgroup holds (test_memory_counted.py). Elsewhere, at once.
        if not _on_a_tmpfs(place):
            assert time.monotonic() - begun < 2, "the worker was held after the result"
    assert list(place.iterdir()) == []  # the files went with the pool, all of them


def _on_a_tmpfs(place: Path) -> bool:
    found = subprocess.run(["stat", "-f", "-c", "%T", str(place)], check=True, capture_output=True, text=True)
    return found.stdout.strip() in ("tmpfs", "ramfs")


_LONG_NAMES = """
import os
for _ in range(4):
    os.mkdir("d" * 240)
    os.chdir("d" * 240)
for i in range(9_990):
    os.close(os.open(f"{i:05d}" + "f" * 25, os.O_CREAT | os.O_WRONLY))
for _ in range(3):
    os.mkdir("e" * 240)
    os.chdir("e" * 240)
os.close(os.open("beyond", os.O_CREAT | os.O_WRONLY))
os.chdir(os.environ["PYNOX_SCRATCH"])
print("made")
"""


def test_the_names_of_a_jobs_files_are_bounded_as_their_contents_are(pool: PoolProcess) -> None:
    """10,000 files whose paths are 1,000 characters each (the job's to choose): a job's result names them within its
    max_output, a session's listing within 4 MiB, and a path no request could name (over 1,024 characters) is
    passed over. The result of a job with max_output 64k named 10 MB of paths, a listing as much."""
    result = _ok(pool.run(_LONG_NAMES, scratch=True, max_output="64k", wait=60))
    named = sum(len(file["path"]) for file in result["files"])
    assert 0 < named <= 64 << 10, f"a job with max_output 64k had {named} bytes of paths in its result"
    assert all(len(file["path"]) <= 1024 for file in result["files"])
    session, _ = _open(pool, _LONG_NAMES)
    listed = pool.run(session=session, files=True)["files"]
    named = sum(len(file["path"]) for file in listed)
    assert 64 << 10 < named <= 4 << 20, f"a listing named {named} bytes of paths"
    assert all(len(file["path"]) <= 1024 for file in listed)
    pool.run(session=session, close=True)


_NEST = ("import os\nfor _ in range(3000):\n    os.mkdir('d')\n    os.chdir('d')\nopen('leaf.txt', 'w').write('x')\n"
         "os.chdir(os.environ['PYNOX_SCRATCH'])\n")


def _nested(top: Path, depth: int) -> None:
    """``depth`` directories one in another beneath ``top``, made as a job makes them (by descending)."""
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(depth):
            os.mkdir("d", dir_fd=fd)
            inner = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = inner
    finally:
        os.close(fd)


@pytest.fixture
def deep_parent(tmp_path: Path) -> Iterator[Path]:
    """A scratch_dir whose trees go away whatever the test's outcome: pytest's own cleanup (shutil.rmtree, recursive
    on 3.11) raises RecursionError on a tree as deep, and every later pytest run of this user with it."""
    parent = tmp_path / "scratch"
    parent.mkdir()
    yield parent
    subprocess.run(["rm", "-rf", "--", str(parent)], check=True, timeout=60)


def test_directories_nested_deeper_than_pythons_recursion_limit_are_removed(tmp_path: Path, deep_parent: Path) -> None:
    # A job chooses how deep its directories go. Removed with shutil.rmtree (recursive on 3.11), 3,000 levels raised
    # RecursionError in the pool: a job's result was PoolWorkerError, a session's close got no answer (its thread
    # died), the pool exited 1 leaving its root, and every later pool with the same scratch_dir failed to start.
    parent = deep_parent
    left = parent / "pynox-scratch-4194305-left"  # a root a pool that died left (a pid above any pid_max), as deep
    left.mkdir()
    _nested(left, 3000)
    config = tmp_path / "pynox.toml"
    config.write_text(f'[pool]\nscratch_dir = "{parent}"\n')
    with pool_process(f"--config={config}", "--workers=1", cwd=tmp_path) as pool:
        assert not left.exists()  # swept as the pool started
        job = _ok(pool.run(_NEST + "print(os.getcwd())", scratch=True))
        assert not Path(job["stdout"].strip()).exists()
        name, scratch = _open(pool, _NEST)
        assert pool.run(session=name, close=True)["closed"] is True
        assert not scratch.exists()
        name, scratch = _open(pool, _NEST)  # left open: removed as the pool exits
        root = scratch.parent
    assert not root.exists()
    assert os.listdir(parent) == []
