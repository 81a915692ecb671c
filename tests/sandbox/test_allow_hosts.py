"""allow_hosts, proven from outside: listeners the test owns on loopback addresses record every connection
they receive, and a refused connection must never reach one. Each rule has its control: the same job with
the network granted (``allow_network=True``) reaches the listener the rule keeps it from.

The pool makes each connection of such a job itself, to the address it read once and checked (see
pynox/server/egress.py); these tests run real jobs in a real pool, under the real kernel policy.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import pytest

import pynox
from tests.harness import procfs
from tests.harness.fixtures import shared_pool

from .harness import Listener

pytestmark = pytest.mark.timeout(180)


pool = shared_pool(workers=1)


def _run(pool: pynox.Pool, code: str, **grants: Any) -> pynox.Result:
    return pool.run(code, **{"timeout": "20s", **grants})


CONNECT = '''
import os
import socket
def attempt(host, port):
    try:
        with socket.create_connection((host, port), timeout=5) as s:
            s.sendall(b"job"); print("reached", host, port, s.recv(2))
    except OSError as exc:
        print("refused", host, port, type(exc).__name__, exc.errno)
'''


def test_only_the_listed_address_and_port_are_reached(pool: pynox.Pool, listeners: dict[str, Listener]) -> None:
    listed, other_address, other_port = listeners["listed"], listeners["other_address"], listeners["other_port"]
    code = CONNECT + (f"attempt('127.0.0.1', {listed.port})\nattempt('127.0.0.2', {listed.port})\n"
                      f"attempt('127.0.0.1', {other_port.port})\n")
    result = _run(pool, code, allow_hosts=[f"127.0.0.1:{listed.port}"])
    assert result.exit == 0, result
    assert f"reached 127.0.0.1 {listed.port} b'hi'" in result.stdout
    assert f"refused 127.0.0.2 {listed.port} PermissionError 1" in result.stdout
    assert f"refused 127.0.0.1 {other_port.port} PermissionError 1" in result.stdout
    assert listed.connections() == 1 and listed.seen == [b"job"]
    assert other_address.connections() == 0 and other_port.connections() == 0
    assert result.policy["network"] == "hosts" and result.policy["hosts"] == [f"127.0.0.1:{listed.port}"]
    # Control: with the network, the same job reaches both.
    control = _run(pool, code, allow_network=True)
    assert "refused" not in control.stdout, control
    assert other_address.connections() == 1 and other_port.connections() == 1


@pytest.mark.parametrize("how", ["blocking", "non-blocking", "timeout", "asyncio", "thread"])
def test_every_way_of_connecting_reaches_a_listed_host(pool: pynox.Pool, listeners: dict[str, Listener],
                                                       how: str) -> None:
    listed = listeners["listed"]
    code = {
        "blocking": f"import socket\ns = socket.socket()\ns.connect(('127.0.0.1', {listed.port}))\n"
                    "s.sendall(b'job'); print(s.recv(2))",
        "non-blocking": "import select, socket\ns = socket.socket()\ns.setblocking(False)\n"
                        f"print(s.connect_ex(('127.0.0.1', {listed.port})))\n"
                        "select.select([], [s], [], 5)\nprint(s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR))\n"
                        "s.setblocking(True); s.sendall(b'job'); print(s.recv(2))",
        "timeout": f"import socket\ns = socket.create_connection(('localhost', {listed.port}), timeout=5)\n"
                   "s.sendall(b'job'); print(s.recv(2))",
        "asyncio": "import asyncio\nasync def main():\n"
                   f"    reader, writer = await asyncio.open_connection('localhost', {listed.port})\n"
                   "    writer.write(b'job'); print(await reader.read(2)); writer.close()\nasyncio.run(main())",
        # Not the main thread: its tid is not the process's pid, so the pool finds the process another way.
        "thread": "import socket, threading\ndef go():\n"
                  f"    s = socket.create_connection(('127.0.0.1', {listed.port}), timeout=5)\n"
                  "    s.sendall(b'job'); print(s.recv(2))\nthreading.Thread(target=go).start()",
    }[how]
    result = _run(pool, code, allow_hosts=[f"127.0.0.1:{listed.port}", f"localhost:{listed.port}"])
    assert result.exit == 0, result
    assert "b'hi'" in result.stdout
    if how == "non-blocking":
        assert result.stdout.splitlines()[:2] == ["115", "0"]  # EINPROGRESS at once, as the kernel's own
    assert listed.connections() == 1


def test_a_refused_connection_says_which_entry_would_allow_it(pool: pynox.Pool,
                                                               listeners: dict[str, Listener]) -> None:
    listed, other = listeners["listed"], listeners["other_address"]
    result = _run(pool, f"import socket\nsocket.create_connection(('127.0.0.2', {other.port}), timeout=5)",
                  allow_hosts=[f"localhost:{listed.port}"])
    assert result.error is not None and result.error["type"] == "PermissionError", result
    assert f'allow_hosts=["127.0.0.2:{other.port}"]' in result.error["hint"]
    assert f"localhost:{listed.port}" in result.error["hint"]
    assert other.connections() == 0


def test_the_metadata_address_is_refused_at_once(pool: pynox.Pool, listeners: dict[str, Listener]) -> None:
    listed = listeners["listed"]
    code = ("import socket, time\nstart = time.monotonic()\ntry:\n"
            "    socket.create_connection(('169.254.169.254', 80), timeout=10)\nexcept OSError as exc:\n"
            "    print(type(exc).__name__, exc.errno, round(time.monotonic() - start, 1))")
    result = _run(pool, code, allow_hosts=[f"127.0.0.1:{listed.port}"])
    assert result.stdout.split()[:2] == ["PermissionError", "1"], result
    assert float(result.stdout.split()[2]) < 1.0  # refused by the pool, not left to time out


def test_names_resolve_to_what_the_pool_resolved_and_no_others(pool: pynox.Pool,
                                                               listeners: dict[str, Listener]) -> None:
    listed = listeners["listed"]
    code = ("import socket, urllib.request\n"
            f"print(sorted({{a[4][0] for a in socket.getaddrinfo('localhost', {listed.port})}}))\n"
            f"print(socket.gethostbyname('localhost'))\n"
            "for name in ('example.com', 'localhost.invalid'):\n"
            "    try:\n        socket.getaddrinfo(name, 80)\n    except socket.gaierror as exc:\n"
            "        print('unknown', name, 'allow_hosts' in str(exc))\n")
    result = _run(pool, code, allow_hosts=[f"localhost:{listed.port}"])
    assert result.exit == 0, result
    lines = result.stdout.splitlines()
    pinned = {info[4][0] for info in socket.getaddrinfo("localhost", listed.port, proto=socket.IPPROTO_TCP)}
    assert lines[0] == str(sorted(pinned))
    assert lines[1] == "127.0.0.1"
    assert lines[2:] == ["unknown example.com True", "unknown localhost.invalid True"]


def test_no_udp_raw_listening_or_fast_open(pool: pynox.Pool, listeners: dict[str, Listener]) -> None:
    """The other ways out of a TCP client: each refused, and the listener that TCP Fast Open would reach
    sees nothing (control: with the network, the same sendto reaches it)."""
    listed, other = listeners["listed"], listeners["other_address"]
    code = f'''
import os
import socket
def attempt(what, make):
    try:
        make(); print(what, "allowed")
    except OSError as exc:
        print(what, type(exc).__name__, exc.errno)
attempt("udp", lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
attempt("udp6", lambda: socket.socket(socket.AF_INET6, socket.SOCK_DGRAM))
attempt("raw", lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP))
attempt("sctp", lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM, 132))
attempt("listen", lambda: socket.create_server(("127.0.0.1", 0)))
def fast_open():
    s = socket.socket()
    s.sendto(b"job", socket.MSG_FASTOPEN, ("127.0.0.2", {other.port}))
attempt("fast open", fast_open)
'''
    result = _run(pool, code, allow_hosts=[f"127.0.0.1:{listed.port}"])
    assert result.exit == 0, result
    for what in ("udp", "udp6", "raw", "sctp", "listen", "fast open"):
        assert f"{what} PermissionError 1" in result.stdout, (what, result.stdout)
    assert other.connections() == 0
    control = _run(pool, code, allow_network=True)
    assert "udp allowed" in control.stdout and "fast open allowed" in control.stdout, control
    assert other.connections() == 1


def test_an_ipv4_mapped_address_is_judged_as_its_ipv4_address(pool: pynox.Pool,
                                                               listeners: dict[str, Listener]) -> None:
    listed, other = listeners["listed"], listeners["other_address"]
    code = CONNECT + f"attempt('::ffff:127.0.0.1', {listed.port})\nattempt('::ffff:127.0.0.2', {other.port})\n"
    result = _run(pool, code, allow_hosts=[f"127.0.0.1:{listed.port}"])
    if "Errno 97" in result.stdout or "EAFNOSUPPORT" in result.stdout:
        pytest.skip("no IPv6 here")
    assert f"reached ::ffff:127.0.0.1 {listed.port}" in result.stdout, result
    assert f"refused ::ffff:127.0.0.2 {other.port} PermissionError 1" in result.stdout
    assert listed.connections() == 1 and other.connections() == 0


RACE = '''
import ctypes, socket, struct, sys, threading, time
libc = ctypes.CDLL(None, use_errno=True)
def sockaddr(address):
    return struct.pack("=H", socket.AF_INET) + struct.pack("!H", {port}) + socket.inet_aton(address) + bytes(8)
listed, other = sockaddr("127.0.0.1"), sockaddr("127.0.0.2")
buffer = ctypes.create_string_buffer(listed, 16)
stop = False
def flip():  # the address is the other host's half of the time
    turn = 0
    while not stop:
        ctypes.memmove(buffer, (listed, other)[turn], 16)
        turn ^= 1
threading.Thread(target=flip, daemon=True).start()
# The flipper runs while the main thread waits for the interpreter's lock: in many short turns, each
# leaving the address at either value, so that the connects below see both.
sys.setswitchinterval(0.0002)
made = reached_other = 0
deadline = time.monotonic() + {seconds}
while time.monotonic() < deadline and reached_other < {enough}:
    s = socket.socket()
    if libc.connect(s.fileno(), buffer, 16) == 0:
        made += 1
        reached_other += s.getpeername()[0] == "127.0.0.2"
    s.close()
stop = True
print("made", made, "other", reached_other)
'''


def test_changing_the_address_after_the_check_redirects_nothing(pool: pynox.Pool,
                                                                listeners: dict[str, Listener]) -> None:
    """The attack on a check-then-use design: a thread rewrites the address between the listed host and
    another while the main thread connects. The pool connects to the copy it checked, so the other host
    is never reached; the control (network granted, the kernel reading the address at the call) reaches
    it, within seconds, however the threads happen to be scheduled."""
    listed, other = listeners["listed"], listeners["other_address"]
    result = _run(pool, RACE.format(port=listed.port, seconds=1.0, enough=1 << 30),
                  allow_hosts=[f"127.0.0.1:{listed.port}"])
    assert result.exit == 0, result
    made, reached_other = int(result.stdout.split()[1]), int(result.stdout.split()[3])
    assert made > 0 and reached_other == 0, result.stdout
    assert other.connections() == 0
    assert listed.connections() == made
    control = _run(pool, RACE.format(port=listed.port, seconds=15.0, enough=1), allow_network=True)
    assert control.exit == 0, control
    assert control.stdout.split()[3] == "1", control.stdout
    assert other.connections() == 1


def test_allow_network_grants_all_of_it(pool: pynox.Pool, listeners: dict[str, Listener]) -> None:
    other = listeners["other_port"]
    result = _run(pool, CONNECT + f"attempt('127.0.0.1', {other.port})",
                  allow_network=True, allow_hosts=["127.0.0.1:1"])
    assert "reached" in result.stdout and result.policy["network"] == "allow" and "hosts" not in result.policy


def test_a_session_keeps_its_hosts_across_steps(pool: pynox.Pool, listeners: dict[str, Listener]) -> None:
    listed, other = listeners["listed"], listeners["other_address"]
    with pool.session(allow_hosts=[f"127.0.0.1:{listed.port}"]) as session:
        first = session.run(CONNECT)
        assert first.exit == 0, first
        second = session.run(f"attempt('127.0.0.1', {listed.port})\nattempt('127.0.0.2', {other.port})")
    assert "reached" in second.stdout and "refused 127.0.0.2" in second.stdout, second
    assert listed.connections() == 1 and other.connections() == 0


def test_a_network_phase_is_two_jobs_sharing_a_write_grant(pool: pynox.Pool, tmp_path: Any) -> None:
    """The pattern the contract gives for "install first, then run without the network": a job with
    allow_hosts for the package index fetches into a write grant; the next job, without the network,
    imports from it and can reach nothing (the index's log shows it made no request)."""
    import http.server

    index, target = tmp_path / "index", tmp_path / "target"
    index.mkdir()
    target.mkdir()
    (index / "phase_pkg.py").write_text("VALUE = 42\n")
    requests: list[str] = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, directory=str(index), **kwargs)

        def log_message(self, format: str, *args: Any) -> None:  # the base class's name
            requests.append(self.path)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    try:
        fetched = str(target / "phase_pkg.py")
        fetch = _run(pool, "import urllib.request\nurllib.request.urlretrieve("
                           f"'http://localhost:{port}/phase_pkg.py', {fetched!r})\nprint('fetched')",
                     allow_hosts=[f"localhost:{port}"], allow_write=[str(target)])
        assert fetch.exit == 0 and "fetched" in fetch.stdout, fetch
        assert requests == ["/phase_pkg.py"]
        use = _run(pool, "import phase_pkg, urllib.request\nprint(phase_pkg.VALUE)\ntry:\n"
                         f"    urllib.request.urlopen('http://127.0.0.1:{port}/phase_pkg.py', timeout=3)\n"
                         "except OSError as exc:\n    print('offline', type(exc).__name__)",
                   package_dirs=[str(target)])
        assert use.exit == 0 and use.stdout.split() == ["42", "offline", "URLError"], use
        assert use.policy["network"] == "deny"
        assert requests == ["/phase_pkg.py"]
    finally:
        server.shutdown()
        server.server_close()


def test_connects_the_pool_waits_on_are_bounded_and_let_go(pool: pynox.Pool) -> None:
    """A job that starts many blocking connects to a listed host that never answers (a full backlog drops
    their SYNs): past 64 at once the pool answers EAGAIN before it starts one, and once the job ends the
    pool holds none of its sockets (its descriptor count is back where it was)."""
    assert pool._process is not None
    server = pool._process.popen.pid  # the pool's server process, whose descriptors are counted
    with socket.create_server(("127.0.0.1", 0), backlog=0) as deaf:
        port = deaf.getsockname()[1]

        def settled() -> int:
            """The pool's descriptors after a plain job, once the child it prepares for the next one is ready."""
            _run(pool, "print(1)", allow_hosts=[f"127.0.0.1:{port}"])
            time.sleep(0.5)
            return len(procfs.fds(server))

        before = settled()
        code = (f"import errno, socket, threading, time\nresults = []\ndef attempt():\n    s = socket.socket()\n"
                f"    try:\n        s.connect(('127.0.0.1', {port})); results.append('made')\n"
                "    except OSError as exc:\n        results.append(errno.errorcode[exc.errno])\n"
                "for _ in range(80):\n    threading.Thread(target=attempt, daemon=True).start()\n"
                "time.sleep(2)\nprint(results.count('EAGAIN'), len(results))")
        result = _run(pool, code, allow_hosts=[f"127.0.0.1:{port}"], timeout="10s")
        assert result.exit == 0, result
        refused, answered = map(int, result.stdout.split())
        # 80 tried; the backlog took a few; of the rest, 64 wait and the others were told EAGAIN at once.
        assert refused >= 80 - 64 - (answered - refused) and answered - refused <= 4, result.stdout
        assert settled() <= before


@pytest.mark.parametrize("client", ["requests", "httpx"])
def test_http_clients_reach_a_listed_name(pool: pynox.Pool, client: str) -> None:
    import http.server

    pytest.importorskip(client)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # the base class's name
            body = b"from the index"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    try:
        code = (f"import {client}\nprint({client}.get('http://localhost:{port}/simple/').text)\n"
                f"try:\n    {client}.get('http://127.0.0.2:{port}/', timeout=3)\n"
                "except Exception as exc:\n    print('refused', type(exc).__name__)")
        result = _run(pool, code, allow_hosts=[f"localhost:{port}"])
        assert result.exit == 0, result
        assert result.stdout.splitlines()[0] == "from the index"
        assert result.stdout.splitlines()[1].startswith("refused"), result.stdout
    finally:
        server.shutdown()
        server.server_close()


ROUTING = '''
import socket, struct
def attempt(what, family, level, option, value):
    s = socket.socket(family)
    try:
        s.setsockopt(level, option, value); print(what, "set")
    except OSError as exc:
        print(what, type(exc).__name__, exc.errno)
listed, other = socket.inet_pton(socket.AF_INET6, "fd00::1"), socket.inet_pton(socket.AF_INET6, "fd00::2")
# A segment routing header (type 4): the packets' real destination is the last segment, the job's choice.
srh = struct.pack("!BBBBBBH", 0, 4, 4, 1, 1, 0, 0) + listed + other
attempt("segment routing", socket.AF_INET6, socket.IPPROTO_IPV6, 57, srh)
attempt("rfc 2292 routing", socket.AF_INET6, socket.IPPROTO_IPV6, 5, srh)
attempt("bind to device", socket.AF_INET, socket.SOL_SOCKET, socket.SO_BINDTODEVICE, b"lo")
attempt("unicast interface", socket.AF_INET, socket.IPPROTO_IP, 50, struct.pack("!I", 1))
attempt("ipv4 options", socket.AF_INET, socket.IPPROTO_IP, 4, bytes([1, 1, 1, 0]))
'''


def test_no_socket_option_routes_a_connection_elsewhere(pool: pynox.Pool, listeners: dict[str, Listener]) -> None:
    """An IPv6 routing header sends a connection made to a listed address on to any other (the pool checks
    the address, the kernel routes by the header), and an interface option picks another network: each is
    refused with allow_hosts. The control, with the network, sets the routing header and the device (no
    privilege needed), so the refusal is the policy's."""
    result = _run(pool, ROUTING, allow_hosts=[f"127.0.0.1:{listeners['listed'].port}"])
    assert result.exit == 0, result
    for what in ("segment routing", "rfc 2292 routing", "bind to device", "unicast interface", "ipv4 options"):
        assert f"{what} PermissionError 1" in result.stdout, (what, result.stdout)
    control = _run(pool, ROUTING, allow_network=True)
    assert "segment routing set" in control.stdout and "bind to device set" in control.stdout, control.stdout


def test_this_hosts_unspecified_address_is_never_reached(pool: pynox.Pool, listeners: dict[str, Listener]) -> None:
    """0.0.0.0 is this host: an entry (or a name a resolver sinkholes to 0.0.0.0) that seems to cover it reaches
    nothing, and the host's own listener on 127.0.0.1 sees no connection."""
    listed = listeners["listed"]
    result = _run(pool, CONNECT + f"attempt('0.0.0.0', {listed.port})\nattempt('::', {listed.port})",
                  allow_hosts=[f"0.0.0.0/0:{listed.port}", f"[::/0]:{listed.port}"])
    assert f"refused 0.0.0.0 {listed.port} PermissionError 1" in result.stdout, result
    assert f"refused :: {listed.port} PermissionError 1" in result.stdout, result
    assert listed.connections() == 0
    control = _run(pool, CONNECT + f"attempt('0.0.0.0', {listed.port})", allow_network=True)
    assert "reached 0.0.0.0" in control.stdout and listed.connections() == 1, control


def test_connecting_a_descriptor_that_is_no_tcp_socket_leaves_the_pool_nothing(pool: pynox.Pool,
                                                                               listeners: dict[str, Listener]) -> None:
    """connect() on /dev/null, on the job's own stdout pipe, thousands of times: each refused, the pool keeps
    no descriptor of the job's (the job's output still ends, and the pool's count comes back)."""
    listed = listeners["listed"]
    assert pool._process is not None
    server = pool._process.popen.pid
    code = ("import ctypes, os, socket, struct, sys\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            f"address = struct.pack('=H', socket.AF_INET) + struct.pack('!H', {listed.port}) + "
            "socket.inet_aton('127.0.0.1') + bytes(8)\nnull = os.open('/dev/null', os.O_RDONLY)\n"
            "errors = set()\nfor fd in [null] * 2000 + [1, 2]:\n"
            "    if libc.connect(fd, address, 16) != 0:\n        errors.add(ctypes.get_errno())\n"
            "print(sorted(errors)); sys.stdout.flush()")
    _run(pool, "print(1)", allow_hosts=[f"127.0.0.1:{listed.port}"])
    time.sleep(0.5)
    before = len(procfs.fds(server))
    result = _run(pool, code, allow_hosts=[f"127.0.0.1:{listed.port}"])
    assert result.exit == 0 and result.stdout == "[88]\n", result  # ENOTSOCK, as the kernel says it
    _run(pool, "print(1)", allow_hosts=[f"127.0.0.1:{listed.port}"])
    time.sleep(0.5)
    assert len(procfs.fds(server)) <= before
    assert listed.connections() == 0


def test_a_later_error_is_not_explained_by_an_earlier_refused_connect(pool: pynox.Pool,
                                                                      listeners: dict[str, Listener]) -> None:
    """The pool's network hint is for a socket's error: a job that was refused a connect, caught it, then
    failed on something else (a chmod outside its grants, also EPERM) gets that error's own hint."""
    listed, other = listeners["listed"], listeners["other_port"]
    code = (CONNECT + f"attempt('127.0.0.1', {other.port})\nimport os\nos.chmod('/etc/hostname', 0o777)")
    result = _run(pool, code, allow_hosts=[f"127.0.0.1:{listed.port}"])
    assert result.error is not None and result.error["type"] == "PermissionError", result
    assert "allow_hosts" not in (result.error["hint"] or ""), result.error
    assert "refused 127.0.0.1" in result.stdout
