"""``pynox pool --listen``: many clients at once, each connection speaking the same JSON Lines as stdin/stdout.

A layer around the server, which stays a single-client machine: each connection's lines are rewritten on
the way in so that everything a client can name is its own, and every line the server writes is routed back
to the connection it belongs to, with the client's own names restored.

- Request ids, cancel targets and session names get the connection's tag (``~N~``) in front, as the pool
  knows them: a client can neither see nor cancel another's jobs, nor reach its sessions, whatever names
  both choose. Results, call events, stats and cancel answers come back with the tag taken off.
- Host calls: the call ids a connection was sent are the only ones it may reply to.
- A line the server answers with no id (a line that is not JSON) goes to the connection whose line is
  being handled: intake handles one line at a time, on that connection's thread.
- Each connection's results leave through an outbox of its own, written by a thread of its own: a client
  that stops reading holds up nobody else; past ``_OUTBOX_LIMIT`` bytes unread it is dropped, and when the pool
  holds more than ``_UNREAD_LIMIT`` for all connections together (results unread, lines not yet finished), the
  one it holds the most for is dropped: the pool's memory is bounded by that, not by its count of connections
  times what one may hold.
- A dropped connection (EOF, an error, an overfull outbox): its pending host calls fail with HostError,
  its jobs and steps are cancelled and its sessions closed, through the server's own cancel and close.

Who may connect is decided by the peer's credentials (``SO_PEERCRED``), not the socket file's mode: see
:mod:`.tenants`. The socket is ``unix:PATH`` (bound here, mode 0666) or the one systemd's socket
activation hands over (``LISTEN_FDS``/``LISTEN_PID``, descriptor 3).
"""

from __future__ import annotations

import collections
import errno
import itertools
import logging
import os
import resource
import select
import socket
import stat
import threading
import time
from typing import TYPE_CHECKING, Any

import msgspec

from ..errors import ConfigError
from ..protocol import (
    LineError,
    Reply,
    RequestId,
    StartError,
    StartErrorEvent,
    encode,
    parse_line,
    refusal,
    reply_call_id,
    session_refusal,
)
from .io import LineReader, Output, TooLong
from .tenants import Peer, Tenant, Tenants, peer_of

if TYPE_CHECKING:
    from .serve import Server

__all__ = ["Listener", "Router"]

_log = logging.getLogger(__name__)

_BACKLOG = 128
# Descriptors kept for the pool's own work when connections are counted against its open-file limit: each
# worker's job (pipes, memfd, pidfd, the descriptors made ahead) and each session's, with room to spare. A
# connection past the rest is refused with a line saying why, so that agents connecting cannot make every
# tenant's jobs fail for want of a descriptor.
_RESERVED = 64
_RESERVED_PER_WORKER = 32
_RESERVED_PER_SESSION = 8
_REFUSALS_LOGGED_EVERY = 1.0  # seconds: a flood of refused connections is one warning a second, with its count
_OUTBOX_LIMIT = 64 << 20  # bytes of results a client may leave unread before it is dropped
# Bytes the pool may hold for all connections together, results unread and lines not yet finished: past it, the
# connection it holds the most for is dropped. Without it the bound was 65 MiB times max_connections (65 GiB by
# default): ten connections of one tenant, each sending stats requests and reading nothing, took the pool from
# 33 MiB to 725 MiB resident, and 200 that each sent a line of 1 MiB but its newline took 220 MiB more.
_UNREAD_LIMIT = 256 << 20
_SD_LISTEN_FDS_START = 3
# A line with one of these is the one answer to a request counted in flight (see Router._account): a result has
# an exit; the answers to a session's files, upload and download have none.
_FINAL_KEYS = ("exit", "files", "uploaded", "downloaded")
_decoder = msgspec.json.Decoder()


def _tag(number: int) -> str:
    return f"~{number}~"


class Connection:
    def __init__(self, number: int, sock: socket.socket, peer: Peer, tenant: Tenant, router: Router) -> None:
        self.number = number
        self.tag = _tag(number)
        self.sock = sock
        self.peer = peer
        self.tenant = tenant
        self._router = router
        self.calls: set[int] = set()  # call ids sent to this connection and not yet answered
        self.sessions: set[str] = set()  # the pool's names of the sessions it used
        self.in_flight = 0  # its requests that will still be answered (results come back through the router)
        self.counted: collections.Counter[str] = collections.Counter()  # those requests, by the pool's id
        self.alive = True
        self.unfinished = 0  # bytes of a line its client has not finished, held by its reader
        self._out: collections.deque[bytes] = collections.deque()
        self._out_bytes = 0
        self._cond = threading.Condition()
        self._writer = threading.Thread(target=self._write_loop, name=f"pynox-conn-{number}-out", daemon=True)
        self._writer.start()

    def inside(self, request_id: RequestId) -> str:
        """The pool's id for this connection's ``request_id``: its tag, then the id as JSON (1, 1.0, "1" stay apart)."""
        return self.tag + msgspec.json.encode(request_id).decode()

    @property
    def held(self) -> int:
        """Bytes the pool holds for it: results written to its outbox and not yet to its socket, and the line
        its client has not finished."""
        return self._out_bytes + self.unfinished

    def holding(self, unfinished: int) -> None:
        """Its reader holds ``unfinished`` bytes of a line not yet finished."""
        total = self._router.unread(unfinished - self.unfinished)
        self.unfinished = unfinished
        if total > _UNREAD_LIMIT:
            self._router.drop_most_unread()

    def send(self, line: bytes) -> None:
        with self._cond:
            if not self.alive:
                return
            self._out.append(line)
            self._out_bytes += len(line)
            over = self._out_bytes > _OUTBOX_LIMIT
            self._cond.notify()
        total = self._router.unread(len(line))
        if over:
            self._router.drop(self, f"it left more than {_OUTBOX_LIMIT >> 20} MiB of results unread", warn=True)
        elif total > _UNREAD_LIMIT:
            self._router.drop_most_unread()

    def _write_loop(self) -> None:
        while True:
            with self._cond:
                while not self._out and self.alive:
                    self._cond.wait()
                if not self._out:
                    return
                line = self._out.popleft()
                self._out_bytes -= len(line)
            self._router.unread(-len(line))
            try:
                self.sock.sendall(line)
            except OSError:
                self._router.drop(self, "its socket failed")
                return

    def stop_writing(self) -> None:
        with self._cond:
            self.alive = False
            self._out.clear()
            cleared, self._out_bytes = self._out_bytes, 0
            self._cond.notify()
        self._router.unread(-cleared)

    def flush(self, timeout: float) -> None:
        """Let the outbox drain (at the pool's end), for at most ``timeout`` seconds."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            with self._cond:
                if not self._out:
                    return
            time.sleep(0.01)


class Router(Output):
    """The server's output: each line to the connection it belongs to; lines of no connection (the ready
    event) to the pool's stdout, and each new connection gets the ready event as its first line."""

    def __init__(self, fallback: Output) -> None:
        self._fallback = fallback
        self._lock = threading.Lock()
        self._connections: dict[int, Connection] = {}
        self._local = threading.local()  # .connection: whose line this thread is handling
        self.ready_line: bytes | None = None
        self.server: Server | None = None
        self._unread_lock = threading.Lock()
        self._unread = 0  # bytes in every connection's outbox

    def unread(self, change: int) -> int:
        """Add ``change`` to the bytes all outboxes hold; what they now hold."""
        with self._unread_lock:
            self._unread += change
            return self._unread

    def drop_most_unread(self) -> None:
        """The pool holds more than it keeps for all clients together: the one it holds the most for is dropped."""
        with self._lock:
            live = [connection for connection in self._connections.values() if connection.alive]
        if live:
            worst = max(live, key=lambda connection: connection.held)
            self.drop(worst, f"the pool holds more than {_UNREAD_LIMIT >> 20} MiB for its clients together (results "
                             f"unread, lines unfinished), and for this one the most ({worst.held >> 20} MiB)",
                      warn=True)

    def add(self, connection: Connection) -> None:
        with self._lock:
            self._connections[connection.number] = connection

    def handling(self, connection: Connection | None) -> None:
        self._local.connection = connection

    def uncounted(self, on: bool) -> None:
        """Whether the lines this thread writes now answer a request that was never counted (a tenant's refusal)."""
        self._local.uncounted = on

    def write(self, line: bytes) -> None:
        try:
            message = _decoder.decode(line)
        except msgspec.DecodeError:  # pragma: no cover - the server writes JSON lines only
            message = None
        if not isinstance(message, dict):  # pragma: no cover - see above
            self._fallback.write(line)
            return
        if message.get("event") == "ready" and self.ready_line is None:
            self.ready_line = line
            self._fallback.write(line)
            return
        pool_id = message.get("id")
        # On a connection's own thread, while its line is handled, every line written is that connection's: an
        # id the server recovered from a line it could not parse is the client's own, never looked up (a client
        # could write another connection's tag into it).
        current: Connection | None = getattr(self._local, "connection", None)
        connection: Connection | None
        if current is not None:
            connection, original = current, pool_id
            if isinstance(pool_id, str) and pool_id.startswith(current.tag):
                try:
                    original = _decoder.decode(pool_id.removeprefix(current.tag))
                except msgspec.DecodeError:  # pragma: no cover - every tagged id is JSON after its tag
                    original = None
            else:
                pool_id = None
        else:
            connection, original = self._owner(pool_id)
        if connection is None:
            if message.get("event") in ("error", "ready"):
                self._fallback.write(line)
            return  # the answer to a connection that is gone
        message["id"] = original
        for key in ("session", "cancelled", "forked"):
            value = message.get(key)
            if isinstance(value, str) and value.startswith(connection.tag):
                inner = value.removeprefix(connection.tag)
                message[key] = _decoder.decode(inner) if key == "cancelled" else inner
        error = message.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):  # the pool's words name its own ids
            error["message"] = error["message"].replace(connection.tag, "")
        if message.get("event") == "call" and isinstance(message.get("call_id"), int):
            connection.calls.add(message["call_id"])
        if not getattr(self._local, "uncounted", False):
            self._account(connection, pool_id, message)
        connection.send(msgspec.json.encode(message) + b"\n")

    def _owner(self, pool_id: Any) -> tuple[Connection | None, Any]:
        if not isinstance(pool_id, str) or not pool_id.startswith("~"):
            return None, None
        number, sep, rest = pool_id[1:].partition("~")
        if not sep or not number.isdigit():
            return None, None
        with self._lock:
            connection = self._connections.get(int(number))
        if connection is None:
            return None, None
        try:
            return connection, _decoder.decode(rest)
        except msgspec.DecodeError:
            return None, None

    def _account(self, connection: Connection, pool_id: str | None, message: dict[str, Any]) -> None:
        """A request's one answer ends what it held (a job's or step's result; a session's files, upload or
        download, answered without an exit); a closed answer or an ended session frees a session."""
        session = message.get("session")
        pool_session = connection.tag + session if isinstance(session, str) else None
        ended = bool(message.get("closed") or message.get("session_ended"))
        final = any(key in message for key in _FINAL_KEYS)
        if not final or pool_id is None or not connection.counted.get(pool_id):
            if ended and pool_session is not None:
                connection.tenant.session_closed(pool_session)
            return
        connection.tenant.answered(session=pool_session, ended=ended)
        with self._lock:
            connection.counted[pool_id] -= 1
            if not connection.counted[pool_id]:
                del connection.counted[pool_id]
            connection.in_flight -= 1
            if not connection.alive and connection.in_flight <= 0:
                self._connections.pop(connection.number, None)

    def drop(self, connection: Connection, why: str, *, warn: bool = False) -> None:
        """The connection is gone: read no more of it, fail its host calls, cancel its jobs, close its sessions
        (once). ``warn``: a client cut off (for what the pool held for it) is the operator's business, a warning; one
        that closed or failed is not."""
        with self._lock:
            if not connection.alive:
                return
            connection.stop_writing()
            if connection.in_flight <= 0:
                self._connections.pop(connection.number, None)
        # Its reader ends now (its poll sees the end): a client whose results can no longer be written (it stopped
        # reading, or shut its reading side) must not go on starting work that nobody will be answered for, and
        # whose tenant's count would never come down (no connection is left to route the result to).
        try:
            connection.sock.shutdown(socket.SHUT_RDWR)
        except OSError:  # already closed by its reader
            pass
        _log.log(logging.WARNING if warn else logging.INFO, "connection %d (%s, tenant %s) dropped: %s",
                 connection.number, connection.peer, connection.tenant.name, why)
        server = self.server
        if server is None:  # pragma: no cover - connections are served only once the server is
            return
        for call_id in list(connection.calls):
            server.calls.fail(call_id, f"the client's connection to the pool closed ({why}); nobody can answer "
                                       "this call")
        ids = {flight.id for flight in server.flights.all()
               if isinstance(flight.id, str) and flight.id.startswith(connection.tag)}
        # Ended quietly: no answer to a client that is gone, and no refusal counted for a job that finished in
        # the meantime (its result was on its way as the connection closed).
        for pool_id in ids:
            server.flights.cancel_quietly(pool_id)
        for session in connection.sessions:
            server.sessions.close(session, connection.inside("pynox-dropped"))

    def tenant_of(self, pool_id: RequestId | None) -> str | None:
        """The tenant of the connection a pool id belongs to (for its log line and labels); on a connection's
        own thread, while its line is handled, that connection's (a line the pool could not parse has an id of
        the client's own, never looked up)."""
        current: Connection | None = getattr(self._local, "connection", None)
        if current is not None:
            return current.tenant.name
        connection, _ = self._owner(pool_id)
        return connection.tenant.name if connection is not None else None

    def own_names(self, pool_id: RequestId | None) -> tuple[RequestId | None, str]:
        """The id a pool id stands for, as its client gave it, and its connection's tag (for its log line; the
        connection may be gone); an id that is not the pool's (a line the pool could not parse, on its
        connection's thread) is the client's own, and has no tag."""
        current: Connection | None = getattr(self._local, "connection", None)
        if not isinstance(pool_id, str) or (current is not None and not pool_id.startswith(current.tag)):
            return pool_id, ""
        number, sep, rest = pool_id.removeprefix("~").partition("~")
        if not pool_id.startswith("~") or not sep or not number.isdigit():
            return pool_id, ""
        try:
            return _decoder.decode(rest), _tag(int(number))
        except msgspec.DecodeError:
            return pool_id, ""

    def run_as_of(self, pool_id: RequestId | None) -> tuple[int, int] | None:
        """The user the jobs of the connection a pool id belongs to run as, when its tenant names one."""
        connection, _ = self._owner(pool_id)
        return connection.tenant.settings.run_as if connection is not None else None

    def count(self, connection: Connection, pool_id: str) -> bool:
        """A request of ``connection`` that will be answered with a result; False (nothing counted) when the
        connection was dropped meanwhile: the request must not run."""
        with self._lock:
            if not connection.alive:
                return False
            connection.in_flight += 1
            connection.counted[pool_id] += 1
            return True

    def connections(self) -> list[Connection]:
        with self._lock:
            return list(self._connections.values())


class Listener:
    """The listening socket and the thread of each connection."""

    def __init__(self, address: str, tenants: Tenants) -> None:
        self.address = address
        self.tenants = tenants
        self.path: str | None = None
        self._inode = 0
        if address == "systemd":
            self.sock = _from_systemd()
        else:
            self.path = address.removeprefix("unix:")
            self.sock = _bind(self.path)
            self._inode = os.stat(self.path).st_ino
        self._numbers = itertools.count(1)
        self._refusal_logged = -_REFUSALS_LOGGED_EVERY
        self._refused_since = 0
        self._never = os.pipe2(os.O_CLOEXEC)  # the connections' readers end on their socket's shutdown instead

    def serve(self, server: Server, router: Router) -> None:
        """Accept connections until the server's drain is over (checked twice a second: the server's own wake-up
        descriptor is its stdin reader's)."""
        router.server = server
        server.tenant_of = router.tenant_of
        server.own_names = router.own_names
        server.run_as_of = router.run_as_of
        limit = _raise_open_files()
        reserved = (_RESERVED + _RESERVED_PER_WORKER * server.options.workers
                    + _RESERVED_PER_SESSION * server.options.max_sessions)
        # [pool] max_connections bounds the threads connections take (two each): a raised open-file limit (often
        # 524288) would otherwise let clients take every task the pool's unit may have, which templates need.
        room = max(limit - len(os.listdir("/proc/self/fd")) - reserved, 1)
        most = min(room, server.options.max_connections)
        if most < server.options.max_connections:
            _log.warning("[pool] max_connections is %d, but the open-file limit %d leaves room for %d beside the "
                         "pool's own work: serving at most %d", server.options.max_connections, limit, room, most)
        server.log_event("listening", f"listening on {self.address}: at most {most} connections at once (open-file "
                                      f"limit {limit})")
        live = threading.BoundedSemaphore(most)
        spare: int | None = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        while not server.drained.is_set():
            ready, _, _ = select.select([self.sock], [], [], 0.5)
            if not ready:
                continue
            try:
                sock, _ = self.sock.accept()
            except OSError as exc:
                if exc.errno not in (errno.EMFILE, errno.ENFILE):
                    continue
                # Every descriptor is taken: the spare one, freed, takes the connection to say so. Without it
                # the client would wait in the backlog for good, and this loop would spin on its readiness.
                if spare is not None:
                    os.close(spare)
                    spare = None
                    self._refuse(f"the pool has no descriptor to spare for another connection ({exc.strerror})")
                try:
                    spare = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
                except OSError:
                    time.sleep(0.1)  # none freed yet: the next turn tries again
                continue
            if not live.acquire(blocking=False):
                self._refuse_on(sock, f"the pool is serving as many connections as it serves at once ({most}, "
                                      f"under its open-file limit {limit}); try again when one has closed")
                continue
            try:
                threading.Thread(target=self._serve_counted, args=(server, router, sock, live), daemon=True,
                                 name="pynox-conn").start()
            except RuntimeError:  # no thread can be started now (the threads' limit, or memory)
                live.release()
                self._refuse_on(sock, "the pool cannot start a thread for another connection now; try again later")
        if spare is not None:
            os.close(spare)
        for connection in router.connections():
            connection.flush(5.0)
            try:
                connection.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _refuse(self, why: str) -> None:
        try:
            sock, _ = self.sock.accept()
        except OSError:
            return
        self._refuse_on(sock, why)

    def _refuse_on(self, sock: socket.socket, why: str) -> None:
        """A connection refused (from the accepting thread): its line, and a warning at most once a second."""
        now = time.monotonic()
        if now - self._refusal_logged >= _REFUSALS_LOGGED_EVERY:
            more = f" ({self._refused_since} more refused since the last warning)" if self._refused_since else ""
            _log.warning("refused a connection: %s%s", why, more)
            self._refusal_logged, self._refused_since = now, 0
        else:
            self._refused_since += 1
        _answer_and_close(sock, why)

    def _serve_counted(self, server: Server, router: Router, sock: socket.socket,
                       live: threading.BoundedSemaphore) -> None:
        try:
            self._serve_one(server, router, sock)
        finally:
            live.release()

    def _serve_one(self, server: Server, router: Router, sock: socket.socket) -> None:
        with sock:
            peer = peer_of(sock)
            tenant = self.tenants.of(peer)
            if tenant is None:
                who = "no [tenants.NAME] of the pool's config names it" if self.tenants.configured else \
                    "only the pool's own user may connect to a pool without [tenants.NAME]"
                _log.warning("refused a connection from %s: %s", peer, who)
                _answer_and_close(sock, f"this pool refuses your connection ({peer}): {who}")
                return
            problem = tenant.connect()
            if problem is not None:
                _log.warning("refused a connection from %s: %s", peer, problem)
                _answer_and_close(sock, problem)
                return
            try:
                self._serve_tenant(server, router, sock, peer, tenant)
            finally:
                tenant.disconnected()

    def _serve_tenant(self, server: Server, router: Router, sock: socket.socket, peer: Peer,
                      tenant: Tenant) -> None:
        connection = Connection(next(self._numbers), sock, peer, tenant, router)
        router.add(connection)
        if router.ready_line is not None:
            connection.send(router.ready_line)
        _log.info("connection %d from %s: tenant %s", connection.number, peer, tenant.name)
        reader = LineReader(sock.fileno(), self._never[0], server.drained.is_set, connection.holding)
        why = "the client closed it"
        try:
            for line in reader:
                if not connection.alive:  # dropped: the lines it wrote after are not read (see Router.drop)
                    break
                router.handling(connection)
                try:
                    self._handle(server, router, connection, line, reader.read_ns)
                finally:
                    router.handling(None)
        except OSError as exc:
            why = f"reading it failed ({exc.strerror or exc})"
        router.drop(connection, why if not server.drained.is_set() else "the pool stopped")
        connection.holding(0)  # its reader ends: what it held is freed

    def _handle(self, server: Server, router: Router, connection: Connection, line: bytes | TooLong,
                arrived_ns: int) -> None:
        if isinstance(line, TooLong):
            call_id = reply_call_id(line.head)
            if call_id is not None and call_id not in connection.calls:
                line = TooLong(line.size)  # another connection's call: this line cannot fail it
            server.handle_line(line, arrived_ns)
            return
        try:
            message = parse_line(line)
        except LineError:
            server.handle_line(line, arrived_ns)  # refused in the server's own words, to this connection
            return
        if isinstance(message, Reply):
            call_id = message.reply.call_id
            if call_id not in connection.calls:
                connection.send(encode(refusal(None, f"reply to call {call_id}: no such call is pending on this "
                                                     "connection (unknown, already answered, or its job ended)")))
                return
            connection.calls.discard(call_id)
            server.handle_line(line, arrived_ns)
            return
        pool_session = connection.tag + message.session if message.session is not None else None
        inside_id = connection.inside(message.id)
        if not message.stats and message.cancel is None and not message.close:
            def alive(name: str) -> bool:
                existing = server.sessions.get(name)
                return existing is not None and not existing.closing

            pool_copy = connection.tag + message.fork if message.fork is not None else None
            problem = connection.tenant.admit_copy(pool_copy, alive) if pool_copy is not None else None
            if problem is None:
                problem = connection.tenant.admit(message, pool_session, alive)
                if problem is not None and pool_copy is not None:
                    connection.tenant.session_closed(pool_copy)
            if problem is not None:
                answer = refusal(inside_id, problem) if message.session is None else session_refusal(
                    inside_id, problem, session=connection.tag + message.session,
                    session_ended=pool_session is None or not alive(pool_session))
                # Through the server's end of a request, as every refusal: in its stats, metrics and log. It was
                # never counted, so it ends nothing (its id may be another request's of this connection in flight).
                router.uncounted(True)
                try:
                    server.finish(answer, session=pool_session, step=None)
                finally:
                    router.uncounted(False)
                return
            if not router.count(connection, inside_id):  # dropped since its line was read: undone, not run
                connection.tenant.answered()
                return
        if pool_session is not None:
            connection.sessions.add(pool_session)
        if message.fork is not None:  # the copy is this connection's session, closed with it
            connection.sessions.add(connection.tag + message.fork)
        if (connection.tenant.settings.profiles is not None and pool_session is not None and message.open is None
                and message.code is not None and message.restore is None and not message.grant_fields()):
            # Admitted as a later step (its session was open): it must not open one with the pool's defaults if
            # the session ends (idle) before the pool takes it; the tenant's first requests name a profile.
            message = msgspec.structs.replace(message, open=False)
        inside = msgspec.structs.replace(
            message, id=inside_id, session=pool_session,
            fork=connection.tag + message.fork if message.fork is not None else None,
            cancel=connection.inside(message.cancel) if message.cancel is not None else None)
        server.handle_request(inside, arrived_ns)  # not as a line: the tags make it longer than the client's

    def close(self) -> None:
        if self.path is not None:
            try:
                if os.stat(self.path).st_ino == self._inode:
                    os.unlink(self.path)
            except OSError:
                pass
        try:
            self.sock.close()
        except OSError:
            pass


def _answer_and_close(sock: socket.socket, why: str) -> None:
    """Answer a connection the pool will not serve with the line that says why, then close it."""
    with sock:
        try:
            sock.settimeout(1.0)  # a client that does not read holds up no accept
            sock.sendall(encode(StartErrorEvent(error=StartError(type="PoolError", message=why))))
        except OSError:
            pass


def _raise_open_files() -> int:
    """The pool's soft limit of open files raised to its hard one, and what it now is: a listening pool's
    connections are descriptors, and a shell's soft 1024 (against a hard limit often 500 times that) would
    refuse agents for nothing."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    for wanted in (hard, 1 << 20):
        if soft < wanted and (hard == resource.RLIM_INFINITY or wanted <= hard):
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            except (OSError, ValueError):  # above the kernel's nr_open: the next, smaller
                continue
            return wanted
    return soft


def _bind(path: str) -> socket.socket:
    where = f"--listen unix:{path}"
    if os.path.lexists(path):
        if not stat.S_ISSOCK(os.lstat(path).st_mode):
            raise ConfigError(f"{where}: something that is not a socket is there; remove it or choose another path")
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC) as probe:
            try:
                probe.connect(path)
            except ConnectionRefusedError:
                os.unlink(path)  # nobody listens: a pool that died left it
            except OSError as exc:
                raise ConfigError(f"{where}: {exc.strerror}") from None
            else:
                raise ConfigError(f"{where}: another process is listening on it (another pool?)")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    # Anyone who can reach the directory may connect; who is served is decided by the peer's credentials.
    umask = os.umask(0o111)
    try:
        sock.bind(path)
        sock.listen(_BACKLOG)
    except OSError as exc:
        sock.close()
        raise ConfigError(f"{where}: {exc.strerror}") from None
    finally:
        os.umask(umask)
    return sock


def _from_systemd() -> socket.socket:
    """The first socket systemd handed over (sd_listen_fds(3)); the variables are then unset, as
    sd_listen_fds(unset_environment=1) does, so that no process the pool starts believes they are its own."""
    fds, pid = os.environ.get("LISTEN_FDS", ""), os.environ.get("LISTEN_PID", "")
    for name in ("LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES"):
        os.environ.pop(name, None)
    if not fds.isdigit() or int(fds) < 1 or pid != str(os.getpid()):
        raise ConfigError("--listen systemd: no socket was handed over (LISTEN_FDS and LISTEN_PID must name this "
                          "process; start the pool from a systemd .socket unit)")
    fd = _SD_LISTEN_FDS_START
    os.set_inheritable(fd, False)
    sock = socket.socket(fileno=fd)
    if sock.family != socket.AF_UNIX or sock.type != socket.SOCK_STREAM:
        raise ConfigError("--listen systemd: the socket handed over is not a unix stream socket "
                          "(ListenStream=/path in the .socket unit)")
    return sock
