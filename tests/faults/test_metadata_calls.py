"""The job's delegated calls (chmod, chown, utimensat, sysinfo) cannot stall the pool that answers them.

The pool performs those calls for the job (pynox/server/steward.py, own_view.py). Whatever
the job names, answering must not block the worker thread that also enforces
the job's deadline: the job is killed at its timeout and the next job runs.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.pool.pool_driver import jobs_of, pool_process

pytestmark = pytest.mark.timeout(120)

# A descriptor of the job's, swapped for socket after socket with unsent data and a long SO_LINGER while
# threads fchmod it: if the pool held a copy of the job's open file and its close were the last, the
# close would wait out the linger in the pool's worker thread.
_LINGERING = """
import os, socket, struct, threading
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
server.bind(("127.0.0.1", 0))
server.listen(4000)
def lingering():
    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    client.connect(server.getsockname())
    client.setblocking(False)
    try:
        while True:
            client.send(b"x" * 65536)
    except BlockingIOError:
        pass
    client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 100000))
    return client.detach()
fd = lingering()
def chmod_forever():
    while True:
        try:
            os.fchmod(fd, 0o600)
        except OSError:
            pass
for _ in range(8):
    threading.Thread(target=chmod_forever, daemon=True).start()
for _ in range(300):
    new = lingering()
    os.dup2(new, fd)
    os.close(new)
print("swapped", flush=True)
threading.Event().wait()
"""


def test_a_lingering_socket_behind_a_delegated_call_does_not_stall_the_pool(tmp_path: Path) -> None:
    with pool_process("--workers=1", cwd=tmp_path) as pool:
        start = time.monotonic()
        result = pool.run(_LINGERING, allow_network=True, timeout="3s", wait=60)
        elapsed = time.monotonic() - start
        assert result["exit"] == 124, result
        assert elapsed < 3 + 5, f"the job's 3 s timeout was answered after {elapsed:.1f} s"
        assert not jobs_of(pool.pid), "the job outlived its timeout"
        start = time.monotonic()
        assert pool.run("print('next')")["stdout"] == "next\n"
        assert time.monotonic() - start < 5


# Threads calling sysinfo without pause, into a buffer another thread keeps unmapping and mapping again
# (read-only every other time), until the job's deadline kills it mid-call.
_SYSINFO_STORM = """
import ctypes, mmap, threading
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
page = libc.mmap(None, mmap.PAGESIZE, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
def remap():
    flip = 0
    while True:
        libc.munmap(page, mmap.PAGESIZE)
        flip ^= 1
        libc.mmap(page, mmap.PAGESIZE, mmap.PROT_READ | (mmap.PROT_WRITE * flip),
                  mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | 0x10, -1, 0)  # MAP_FIXED
def call():
    while True:
        libc.sysinfo(ctypes.c_void_p(page))
threading.Thread(target=remap, daemon=True).start()
for _ in range(6):
    threading.Thread(target=call, daemon=True).start()
print("storm", flush=True)
threading.Event().wait()
"""

_OWN_SYSINFO = """
import os
print(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
"""


def test_sysinfo_calls_to_the_end_of_a_job_do_not_stall_the_pool(tmp_path: Path) -> None:
    with pool_process("--workers=1", cwd=tmp_path) as pool:
        start = time.monotonic()
        result = pool.run(_SYSINFO_STORM, timeout="2s", wait=60)
        elapsed = time.monotonic() - start
        assert result["exit"] == 124 and result["stdout"] == "storm\n", result
        assert elapsed < 2 + 5, f"the job's 2 s timeout was answered after {elapsed:.1f} s"
        assert not jobs_of(pool.pid), "the job outlived its timeout"
        # The next job gets its own view, answered at once.
        start = time.monotonic()
        assert pool.run(_OWN_SYSINFO, memory="192m")["stdout"] == f"{192 << 20}\n"
        assert time.monotonic() - start < 5


# A job whose maps file is ~250 MB of text (one file with a ~3,900-character path, mapped 64,000 times)
# calls sysinfo just before its deadline, while a thread writes how long it has run into a file of its grant.
# The steward's cost for that call must not depend on what the job mapped, and the deadline is the pool's:
# the last time the file shows is the job's timeout, not the time the pool took to answer it.
_HUGE_MAPS = """
import ctypes, mmap, os, sys, threading, time
start = time.monotonic()
grant = os.environ["GRANT"]
clock = os.open(os.path.join(grant, "clock"), os.O_WRONLY | os.O_CREAT)
def tick():
    while True:
        os.pwrite(clock, f"{time.monotonic() - start:12.3f}".encode(), 0)
        time.sleep(0.01)
threading.Thread(target=tick, daemon=True).start()
deep = grant
while len(deep) < 3800:
    deep = os.path.join(deep, "d" * 200)
    os.makedirs(deep, exist_ok=True)
path = os.path.join(deep, "f" * (3900 - len(deep) - 1))
with open(path, "wb") as file:
    file.write(b"x" * mmap.PAGESIZE)
fd = os.open(path, os.O_RDONLY)
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
mapped = 0
failed = (None, 2**64 - 1)
while mapped < 64000 and libc.mmap(None, mmap.PAGESIZE, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0) not in failed:
    mapped += 1
print(mapped, len(path), flush=True)
while time.monotonic() - start < 2.5:
    time.sleep(0.01)
buffer = ctypes.create_string_buffer(256)
ctypes.CDLL(None).sysinfo(buffer)
threading.Event().wait()
"""


def test_a_delegated_call_of_job_chosen_size_does_not_outlast_the_deadline(tmp_path: Path) -> None:
    grant = tmp_path / "grant"
    grant.mkdir()
    with pool_process("--workers=1", cwd=tmp_path) as pool:
        result = pool.run(_HUGE_MAPS, allow_write=[str(grant)], env={"GRANT": str(grant)}, timeout="3s",
                          memory="1g", wait=60)
        assert result["exit"] == 124, result
        count, length = map(int, result["stdout"].split())
        assert count > 60000 and length >= 3900, result["stdout"]  # the attack took place
        ran = float((grant / "clock").read_text())
        # The job's own clock, as its grant shows it: it stopped at its deadline (3 s), give or take a loaded
        # machine's kill and scheduling, not when the pool got round to answering its call.
        assert ran < 3 + 1.0, f"the job kept running {ran:.2f} s with a 3 s timeout"
        assert result["duration_ms"] < 3000 + 1500, result["duration_ms"]
        assert not jobs_of(pool.pid), "the job outlived its timeout"
