"""Memory a job makes the kernel hold beyond its own pages, proven from outside through a real ``pynox pool``.

``RLIMIT_DATA`` counts a job's private writable memory only. Pages written into a tmpfs (a grant on
``/dev/shm`` or on any tmpfs mount), into pipes, and what the kernel allocates for the job, count against
none of its rlimits: with ``memory=128m`` a job kept 400 MiB in a granted tmpfs. Where a memory cgroup can
be had, the template's cgroup counts all of it (policy/cgroups.py), and the pool gives the verdict from the
kernel's own count of its kills, never from the job. Where none can be had, the pool says so at start and
bounds each file a job writes by its memory (a default ``max_file_size``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pynox.policy import cgroups
from tests.harness import procfs
from tests.pool.pool_driver import leftover_guard, pool_process
from tests.setup_facts import OUTER_SECCOMP

pytestmark = pytest.mark.timeout(120)

_subreaper = pytest.fixture(scope="module", autouse=True, name="_subreaper")(leftover_guard)

_MIB = 1 << 20
# What a job's template's cgroup holds besides the job moves during the job by up to about this much, each way:
# the kernel charges pages in per-CPU batches of 64 (usage counts a batch before its pages are used), frees some
# objects of an ended process only after an RCU grace period, and the template's own copy-on-write copies come and
# go with its children. A job's limit is measured from that cgroup's usage, so a job may hold this much beyond its
# memory (docs/sandbox-contract.md); a child prepared for another job was ~2.3 MiB of room before it was awaited.
_KERNELS_MOVES = 1 * _MIB

_FILL = """
import os
chunk = b"x" * (1 << 20)
written = 0
with open(os.path.join(PLACE, "hoard"), "wb", buffering=0) as hoard:
    for _ in range(COUNT):
        hoard.write(chunk)
        written += 1
print("wrote", written, "MiB")
"""


def _fill(place: Path, mib: int) -> str:
    return _FILL.replace("PLACE", repr(str(place))).replace("COUNT", str(mib))


def _counted() -> cgroups.Hierarchy:
    """This setup's memory cgroup; in CI as root, a memory cgroup this machine has must be used."""
    bounds = cgroups.available()
    limit, reason = bounds.memory, bounds.memory_reason
    if limit is None:
        if os.environ.get("CI") and os.geteuid() == 0:
            pytest.fail(f"CI must prove the memory bound: {reason}", pytrace=False)
        pytest.skip(reason)
    return limit


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A tmpfs of 1 GiB, as an operator's grant on /dev/shm or a scratch mount would be; under a container's
    profile, which refuses the test its mount, a directory of the host's /dev/shm."""
    place = tmp_path / "scratch"
    place.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1g,mode=0777", "tmpfs", str(place)],
                      check=False, capture_output=True).returncode == 0:
        try:
            yield place
        finally:
            subprocess.run(["umount", "-l", str(place)], check=False)
        return
    if not OUTER_SECCOMP:
        pytest.fail("cannot mount a tmpfs as root", pytrace=False)
    shared = Path(tempfile.mkdtemp(dir="/dev/shm", prefix="pynox-test-"))
    try:
        yield shared
    finally:
        shutil.rmtree(shared, ignore_errors=True)


def _used(place: Path) -> int:
    """What the tmpfs holds for the job's file, seen from the host."""
    hoard = place / "hoard"
    return hoard.stat().st_blocks * 512 if hoard.exists() else 0


@pytest.mark.needs_root("the tmpfs is mounted by the test; an ordinary user's pool has no memory cgroup")
def test_pages_a_job_writes_into_a_granted_tmpfs_count_against_its_memory(tmp_path: Path, tmpfs: Path) -> None:
    _counted()
    with pool_process("--workers=1", cwd=tmp_path) as pool:
        assert pool.run("print(1)")["exit"] == 0
        templates = pool.templates()
        hoard = pool.run(_fill(tmpfs, 400), memory="128m", timeout="30s", allow_write=[str(tmpfs)], wait=60)
        # The kernel killed the job, not the template that shares its cgroup.
        assert pool.templates() == templates, hoard
        # From the host: the tmpfs holds no more than the job's memory.
        assert _used(tmpfs) <= 128 * _MIB + _KERNELS_MOVES, (_used(tmpfs) / _MIB, hoard)
        # The verdict is the pool's, from the cgroup's own count of the kernel's kills.
        assert hoard["exit"] == 1 and hoard["error"]["type"] == "MemoryError", hoard
        assert "128m" in hoard["error"]["message"], hoard
        (tmpfs / "hoard").unlink()
        # Control: with the memory to hold it, the same job fills the tmpfs, so the limit is what stopped it.
        fine = pool.run(_fill(tmpfs, 400), memory="1g", timeout="30s", allow_write=[str(tmpfs)], wait=60)
        assert fine["exit"] == 0 and fine["stdout"] == "wrote 400 MiB\n", fine
        assert _used(tmpfs) >= 400 * _MIB
        # And what a job counted is reported: the cgroup's peak, its tmpfs pages included.
        assert fine["usage"]["memory_peak_kb"] >= 400 * 1024, fine["usage"]


_PREPARED = 8  # [pool] prepared_children's most


@pytest.mark.needs_root("the tmpfs is mounted by the test; an ordinary user's pool has no memory cgroup")
def test_children_prepared_for_another_job_leave_no_room_beyond_the_next_jobs_limit(tmp_path: Path,
                                                                                 tmpfs: Path) -> None:
    """A job's limit is what its template's cgroup holds unreclaimably, plus its memory. Children prepared ahead
    for another confinement are given up before it (they cannot take it): their pages, held when the base was
    measured and freed before the job ran, must not be room for it. The page cache its template's cgroup holds
    (a file an earlier job read) is what the kernel gives a job at its limit once those pages are gone."""
    _counted()
    read = tmp_path / "read"
    with open(read, "wb") as made:  # out of the page cache once written, so that the job's read charges it
        made.write(b"x" * (64 * _MIB))
        made.flush()
        os.fsync(made.fileno())
        os.posix_fadvise(made.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    config = tmp_path / "pynox.toml"
    config.write_text(f"[pool]\nprepared_children = {_PREPARED}\n")  # ~18 MiB of room, unawaited
    with pool_process("--workers=1", f"--config={config}", cwd=tmp_path) as pool:
        # Page cache charged to the template's cgroup, reclaimable, so no part of the base: what a job may be
        # given at its limit. (Read, not written: a written file's pages carry kernel objects of their own, the
        # file system's, which the kernel frees with them, and no count tells those apart from the job's.)
        cached = pool.run(f"print(len(open({str(read)!r}, 'rb').read()))", allow_read=[str(read)], timeout="30s")
        assert cached["exit"] == 0 and cached["stdout"] == f"{64 * _MIB}\n", cached
        pool.await_prepared_children(_PREPARED)
        # One of them takes a job like it; the others wait through it, so the base measured after it holds
        # their pages (and those of the one prepared to replace the first, if it came by then).
        assert pool.run("print(1)", allow_read=[str(read)], timeout="30s")["exit"] == 0
        pool.await_prepared_children(_PREPARED)
        hoard = pool.run(_fill(tmpfs, 200), memory="64m", timeout="30s", allow_write=[str(tmpfs)], wait=60)
        assert hoard["error"] is not None and hoard["error"]["type"] == "MemoryError", hoard
        assert _used(tmpfs) <= 64 * _MIB + _KERNELS_MOVES, (_used(tmpfs) / _MIB, hoard)
        # Control: the same job with the memory to hold it writes it all, so the limit is what stopped it.
        (tmpfs / "hoard").unlink()
        fine = pool.run(_fill(tmpfs, 200), memory="1g", timeout="30s", allow_write=[str(tmpfs)], wait=60)
        assert fine["exit"] == 0 and _used(tmpfs) >= 200 * _MIB, fine


def test_a_job_that_kills_itself_is_no_memory_verdict(tmp_path: Path) -> None:
    # A SIGKILL the job sends itself is not the kernel's kill for its memory: the pool reads which it was.
    with pool_process("--workers=1", cwd=tmp_path) as pool:
        done = pool.run("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)", memory="128m")
    assert done["exit"] == 137 and done["error"]["type"] == "SignalError", done


@pytest.mark.needs_root("the tmpfs is mounted by the test; an ordinary user's pool has no memory cgroup")
def test_a_session_counts_what_all_its_steps_hold(tmp_path: Path, tmpfs: Path) -> None:
    _counted()
    with pool_process("--workers=1", cwd=tmp_path) as pool:
        grant = {"allow_write": [str(tmpfs)], "memory": "128m", "timeout": "30s"}
        first = pool.run(_fill(tmpfs, 60).replace('"hoard"', '"first"'), session="hoard", **grant)
        assert first["exit"] == 0 and first["usage"]["memory_peak_kb"] >= 60 * 1024, first
        second = pool.run(_fill(tmpfs, 100).replace('"hoard"', '"second"'), session="hoard", wait=60)
        # The second step's pages add to the first's: together over the session's memory, it is killed.
        assert second["error"]["type"] == "MemoryError" and second["session_ended"] is True, second
        held = sum((tmpfs / name).stat().st_blocks * 512 for name in ("first", "second"))
        assert held <= 128 * _MIB, held >> 20


_PIPES = """
import fcntl, os
held, pipes = 0, []
try:
    while True:
        r, w = os.pipe()
        pipes.append((r, w))
        try:
            fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, 1 << 20)
        except OSError:
            pass
        os.set_blocking(w, False)
        try:
            while True:
                held += os.write(w, bytes(65536))
        except BlockingIOError:
            pass
except OSError as exc:
    print("stopped by", type(exc).__name__)
print("held", held >> 20, "MiB")
"""


@pytest.mark.needs_root("an ordinary user's pool has no memory cgroup")
def test_pipe_buffers_of_a_job_count_against_its_memory(tmp_path: Path) -> None:
    _counted()
    with pool_process("--workers=1", cwd=tmp_path) as pool:
        # Uncounted, a job with memory=48m kept 62 MiB in pipe buffers (stopped by the per-uid pipe budget).
        hoard = pool.run(_PIPES, memory="48m", timeout="30s", wait=60)
        assert hoard["exit"] == 1 and hoard["error"]["type"] == "MemoryError", hoard
        assert hoard["usage"]["memory_peak_kb"] <= 48 * 1024, hoard["usage"]
        # Control: with the memory to hold them, the pipes fill, and the kernel's count shows their pages.
        fine = pool.run(_PIPES, memory="1g", timeout="30s", wait=60)
        held = int(fine["stdout"].split()[-2])
        assert fine["exit"] == 0 and held >= 48, fine
        assert fine["usage"]["memory_peak_kb"] >= held * 1024, fine["usage"]


@pytest.mark.needs_root("an ordinary user's pool has no memory cgroup")
def test_a_job_after_a_job_with_another_memory_runs_under_its_own(tmp_path: Path) -> None:
    # The pool keeps a cgroup's limit between jobs that ask for the same memory, and writes it again for one
    # that asks for other: each of these runs under its own, whichever way the limit moves, and repeated.
    _counted()
    with pool_process("--workers=1", cwd=tmp_path) as pool:
        for memory, fits in (("1g", True), ("48m", False), ("48m", False), ("1g", True), ("1g", True),
                             ("48m", False)):
            done = pool.run(_PIPES, memory=memory, timeout="30s", wait=60)
            if fits:  # the control: with the memory to hold them, the pipes fill past 48 MiB
                assert done["exit"] == 0 and int(done["stdout"].split()[-2]) >= 48, (memory, done)
            else:
                assert done["exit"] == 1 and done["error"]["type"] == "MemoryError", (memory, done)
                assert done["usage"]["memory_peak_kb"] <= 48 * 1024, (memory, done["usage"])


_STALE = ("pynox-2", "template-6")  # what a pool that was PID 2 of its namespace left: host pid 2 exists


def _holding(base: str, pids: list[int]) -> list[str]:
    """The pool directories under ``base`` with a cgroup that holds one of ``pids``."""
    found = []
    for pool in Path(base).glob("pynox-*"):
        held = {int(pid) for procs in pool.glob("*/cgroup.procs") for pid in procs.read_text().split()}
        if held & set(pids):
            found.append(pool.name)
    return found


@pytest.mark.needs_root("an ordinary user cannot make cgroups without delegation")
def test_cgroups_of_a_dead_pool_are_swept_whatever_its_pid_and_a_pool_leaves_none(tmp_path: Path) -> None:
    bases = [hierarchy.base for hierarchy in cgroups.available(fresh=True).hierarchies()]
    if not bases:
        pytest.skip("no cgroup can be made here")
    for base in bases:
        os.makedirs(os.path.join(base, *_STALE), exist_ok=True)
        for stale in (os.path.join(base, *_STALE), os.path.join(base, _STALE[0])):  # as if made long ago
            os.utime(stale, (0, 0))
    with pool_process("--workers=2", cwd=tmp_path) as pool:
        assert pool.run("print(1)")["exit"] == 0
        templates = pool.templates()
        mine = {}
        for base in bases:
            # The stale one is gone although a process numbered 2 lives on the host.
            assert not os.path.exists(os.path.join(base, _STALE[0])), base
            # Both templates are in cgroups of one directory, named for this pool alone (not by its pid only).
            (name,) = _holding(base, templates)
            assert name.startswith(f"pynox-{pool.pid}-") and len(name) > len(f"pynox-{pool.pid}-"), name
            mine[base] = name
    for base, name in mine.items():
        assert not os.path.exists(os.path.join(base, name)), (base, name)


_BIG_FILE = """
import os
try:
    with open(os.path.join(PLACE, "big"), "wb", buffering=0) as big:
        for _ in range(96):
            big.write(bytes(1 << 20))
    print("wrote 96 MiB")
except OSError as exc:
    print("stopped:", exc.errno)
"""


def test_a_pool_says_at_start_which_bound_is_not_in_force_and_bounds_files_where_memory_is_not_counted(
        tmp_path: Path) -> None:
    counted = cgroups.available(fresh=True).memory is not None
    if os.environ.get("CI") and os.geteuid() == 0:
        assert counted, "CI as root must count memory in a cgroup"
    grant = tmp_path / "out"
    grant.mkdir(mode=0o777)
    with pool_process("--workers=1", cwd=tmp_path) as pool:
        missing = pool.ready["bounds_not_in_force"]
        done = pool.run(_BIG_FILE.replace("PLACE", repr(str(grant))), memory="64m", allow_write=[str(grant)])
        said = bytes(pool.stderr).decode()  # written as the ready event left, read once a job was answered
    written = (grant / "big").stat().st_size
    if counted:
        assert not any("memory" in line for line in missing), missing
        assert done["policy"]["max_file_size"] is None and done["stdout"] == "wrote 96 MiB\n", done
        assert written == 96 * _MIB
    else:
        # Never loosened silently: the ready event and stderr say it, and each file is bounded by memory.
        assert any(line.startswith("memory counts the job's own pages only") for line in missing), missing
        assert "per-job bound not in force: memory counts" in said, said
        assert done["policy"]["max_file_size"] == 64 * _MIB and done["stdout"] == "stopped: 27\n", done
        assert written == 64 * _MIB  # seen from the host: the file stopped at the job's memory


# 60 connections to a peer that never reads, each sent into until its send buffer is full, held a moment.
_SEND_BUFFERS = """
import socket, time
held = []
for _ in range(60):
    sock = socket.create_connection(("127.0.0.1", PORT), timeout=5)
    sock.setblocking(False)
    try:
        while True:
            sock.send(b"x" * 65536)
    except OSError:
        pass
    held.append(sock)
print("held", len(held))
time.sleep(1.5)
"""


def _tcp_pages() -> int:
    """The machine's TCP memory, in pages, as /proc/net/sockstat shows it ("TCP: ... mem N")."""
    for line in procfs.machine("net/sockstat").splitlines():
        if line.startswith("TCP:"):
            fields = line.split()
            return int(fields[fields.index("mem") + 1])
    return 0


@pytest.mark.needs_root("an ordinary user's pool has no memory cgroup")
def test_tcp_send_buffers_of_a_job_count_against_its_memory(tmp_path: Path) -> None:
    """A job with memory=64m fills the send buffers of 60 connections to a peer that never reads. The
    machine's TCP memory (sockstat, sampled while the job holds them) grows by no more than its memory
    allows; the peer's receive buffers, the host's, are kept small."""
    _counted()
    if OUTER_SECCOMP:
        # Under a container's profile the pool cannot take the job's socket (pidfd_getfd needs CAP_SYS_PTRACE):
        # it connects a socket of its own and installs it in the job, so the buffers are charged to the pool's
        # cgroup, not the job's. A known gap, in the contract; counted there is the next step.
        pytest.skip("in a container the pool makes an allow_hosts job's sockets: their buffers are the pool's")
    peer = socket.socket()
    peer.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # inherited by what it accepts: the host's share
    peer.bind(("127.0.0.1", 0))
    peer.listen(128)
    accepted: list[socket.socket] = []
    stop = threading.Event()
    peaks = [0]

    def accept() -> None:
        peer.settimeout(0.2)
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                accepted.append(peer.accept()[0])  # and never read

    def sample() -> None:
        while not stop.is_set():
            peaks[0] = max(peaks[0], _tcp_pages())
            time.sleep(0.02)

    threads = [threading.Thread(target=accept), threading.Thread(target=sample)]
    for thread in threads:
        thread.start()
    page = os.sysconf("SC_PAGE_SIZE")
    try:
        with pool_process("--workers=1", cwd=tmp_path) as pool:
            before = _tcp_pages()
            code = _SEND_BUFFERS.replace("PORT", str(peer.getsockname()[1]))
            result = pool.run(code, memory="64m", allow_hosts=[f"127.0.0.1:{peer.getsockname()[1]}"], timeout="30s",
                              wait=60)
            grown = (peaks[0] - before) * page
    finally:
        stop.set()
        for thread in threads:
            thread.join()
        for sock in accepted:
            sock.close()
        peer.close()
    assert result["stdout"] == "held 60\n", result  # the attack took place
    # Its memory, plus the peer's small receive buffers and what the rest of the machine did meanwhile.
    assert grown < (64 + 24) * _MIB, f"the machine's TCP memory grew {grown / _MIB:.0f} MiB for a 64 MiB job"


@pytest.mark.needs_root("the tmpfs is mounted by the test; an ordinary user's pool has no memory cgroup")
def test_usage_says_what_a_job_left_in_shared_memory(tmp_path: Path, tmpfs: Path) -> None:
    """A job leaves 32 MiB in a granted tmpfs: its result's usage.shmem_kb says so, as the host sees the file."""
    _counted()
    with pool_process("--workers=1", cwd=tmp_path) as pool:
        result = pool.run(_fill(tmpfs, 32), memory="256m", timeout="30s", allow_write=[str(tmpfs)], wait=60)
        assert result["exit"] == 0, result
        assert _used(tmpfs) >= 32 * _MIB
        assert result["usage"].get("shmem_kb", 0) >= 32 * 1024, result["usage"]
        plain = pool.run("print(1)")  # control: a job that leaves nothing there has nothing said
        assert plain["usage"].get("shmem_kb", 0) < 32 * 1024, plain["usage"]


_MANY_PAGES = """
page = b"x" * 4096
for name in range(25_000):
    with open(str(name), "wb", buffering=0) as file:
        file.write(page)
print("left", 25_000 * 4096 >> 20, "MiB")
"""

_GROW = """
import mmap
held = []
try:
    for _ in range(200):
        chunk = mmap.mmap(-1, 1 << 20)
        chunk.write(b"y" * (1 << 20))
        held.append(chunk)
except MemoryError:
    print("MemoryError at", len(held), "MiB")
else:
    print("held", len(held), "MiB")
"""


@pytest.mark.needs_root("the tmpfs is mounted by the test; an ordinary user's pool has no memory cgroup")
def test_what_a_job_left_in_a_scratch_directory_on_a_tmpfs_is_gone_before_the_next_job_starts(
        tmp_path: Path, tmpfs: Path) -> None:
    """The pool's scratch directories on a tmpfs (often the temporary directory): a job leaves 97 MiB there in 25,000
    files, and the next job, on the same template with memory=128m, tries to hold 200 MiB. Its limit is set from
    what the template's cgroup holds as it starts: had the pool still been removing the files then (it removes them
    after the result), their pages, freed meanwhile, would be room beyond its memory (held 200 MiB, 1 run in 3)."""
    _counted()
    config = tmp_path / "pynox.toml"
    config.write_text(f"[pool]\nscratch_dir = {str(tmpfs)!r}\n")
    with pool_process(f"--config={config}", "--workers=1", cwd=tmp_path) as pool:
        for _ in range(4):
            left = pool.submit(code=_MANY_PAGES, scratch=True, memory="160m", timeout="30s")
            grows = pool.submit(code=_GROW, memory="128m", timeout="30s")
            assert pool.result(left, timeout=60)["stdout"] == "left 97 MiB\n"
            result = pool.result(grows, timeout=60)
            assert "held" not in result["stdout"], result  # MemoryError in the job, or the kernel's kill
            assert result["exit"] == 1, result
        # The control: with its memory, the same job holds what it asks for.
        assert pool.run(_GROW, memory="400m", timeout="30s", wait=60)["stdout"] == "held 200 MiB\n"
