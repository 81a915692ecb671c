"""Files in and out of a session through the Python API: ``Session.upload/download/files`` and their async twins,
and a plain run's ``Result.files``, against the real pool."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from pynox import FileInfo, Pool, RequestError
from tests.harness.fixtures import shared_pool

pytestmark = pytest.mark.timeout(120)


pool = shared_pool(workers=2)


def test_a_file_goes_in_the_code_writes_one_and_it_comes_out(pool: Pool) -> None:
    with pool.session(scratch=True) as session:
        # Before any run: the upload opens the session (with its grants) and does not count as a step.
        uploaded = session.upload("data/orders.csv", b"product,amount\npen,3\nink,4\n")
        assert (uploaded.path, uploaded.size, uploaded.mime) == ("data/orders.csv", 27, "text/csv")
        result = session.run("import csv, os\nrows = list(csv.DictReader(open('data/orders.csv')))\n"
                             "open('total.txt', 'w').write(str(sum(int(r['amount']) for r in rows)))\n"
                             "print(os.getcwd() == os.environ['PYNOX_SCRATCH'])")
        assert result.stdout == "True\n" and result.step == 2 and session.steps == 1
        assert session.download("total.txt") == b"7"
        found = {f.path: f for f in session.files()}
        assert sorted(found) == ["data/orders.csv", "total.txt"]
        assert isinstance(found["total.txt"], FileInfo) and found["total.txt"].size == 1
        assert found["total.txt"].mime == "text/plain" and found["total.txt"].mtime > 0


def test_a_file_larger_than_a_protocol_line_goes_both_ways(pool: Pool) -> None:
    payload = os.urandom(3 << 20)  # three 1 MiB lines' worth, in pieces
    with pool.session(scratch=True) as session:
        assert session.upload("blob.bin", payload).size == len(payload)
        result = session.run("import hashlib\nopen('copy.bin', 'wb').write(open('blob.bin', 'rb').read()[::-1])\n"
                             "print(hashlib.sha256(open('blob.bin', 'rb').read()).hexdigest())")
        import hashlib

        assert result.stdout.strip() == hashlib.sha256(payload).hexdigest()
        assert session.download("copy.bin") == payload[::-1]


def test_the_async_twins(pool: Pool) -> None:
    async def main() -> tuple[bytes, list[str]]:
        session = pool.session(scratch=True)
        try:
            await session.aupload("in.txt", b"async")
            await session.arun("open('out.txt', 'w').write(open('in.txt').read().upper())")
            return await session.adownload("out.txt"), [f.path for f in await session.afiles()]
        finally:
            await session.aclose()

    data, paths = asyncio.run(main())
    assert data == b"ASYNC" and sorted(paths) == ["in.txt", "out.txt"]


def test_refusals_are_request_errors(pool: Pool, tmp_path: Path) -> None:
    with pool.session() as plain, pytest.raises(RequestError, match="scratch=True"):
        plain.files()
    with pool.session(scratch=True) as session:
        session.run("import os\nos.symlink('/etc/shadow', 'shadow')")
        with pytest.raises(RequestError, match="symlink"):
            session.download("shadow")
        with pytest.raises(RequestError, match="goes up"):
            session.upload("../escape.txt", b"x")
        with pytest.raises(RequestError, match="does not exist"):
            session.download("missing.txt")
        assert session.run("print('still here')").stdout == "still here\n"


def test_a_session_that_ends_takes_its_files_with_it(pool: Pool) -> None:
    with pool.session(scratch=True, timeout="1s") as session:
        session.upload("kept.txt", b"x")
        assert session.run("import time\ntime.sleep(30)").timed_out
        assert session.files() == []  # a new session: the earlier files went with the earlier process
        assert session.run("import os\nprint(os.path.exists('kept.txt'))").stdout == "False\n"


def test_a_file_request_that_opens_a_new_process_leaves_its_note_to_the_next_run(pool: Pool) -> None:
    # After a timeout, files() opens a new process with an empty step whose result the caller never sees: its
    # session_reopened went with it, and the next run said nothing of the variables that were gone.
    with pool.session(scratch=True, timeout="1s") as session:
        session.run("x = 1").raise_for_error()
        assert session.run("import time\ntime.sleep(30)").timed_out
        assert session.files() == []
        fresh = session.run("print('x' in globals())")
        assert fresh.stdout == "False\n" and fresh.session_reopened is not None, fresh
        assert "timed out" in fresh.session_reopened and "gone" in fresh.text, fresh.text
        assert session.run("print(1)").session_reopened is None  # said once


def test_a_file_request_to_a_session_the_pool_closed_when_idle_says_so_and_so_does_the_next_run(
        tmp_path: Path) -> None:
    config = tmp_path / "pynox.toml"
    config.write_text('[pool]\nsession_idle = "1s"\n')
    with Pool(workers=1, config=config) as idle, idle.session(scratch=True) as session:
        session.run("x = 1\nopen('kept.txt', 'w').write('x')").raise_for_error()
        time.sleep(2.5)  # the pool closes it after 1s without a step (its sweep may take a while more)
        with pytest.raises(RequestError, match="session_idle"):
            session.download("kept.txt")
        assert session.files() == []  # a new process, its directory empty
        fresh = session.run("print('x' in globals())")
        assert fresh.stdout == "False\n" and "session_idle" in (fresh.session_reopened or ""), fresh


def test_a_plain_run_gets_its_files_in_its_result(pool: Pool) -> None:
    result = pool.run("import os\nopen('chart.svg', 'w').write('<svg/>')\nprint(os.getcwd())", scratch=True)
    assert [(f.path, f.mime, f.data) for f in result.files] == [("chart.svg", "image/svg+xml", b"<svg/>")]
    assert not Path(result.stdout.strip()).exists()  # removed once the result was made
    assert pool.run("print(1)").files == ()
