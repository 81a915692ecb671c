"""The metrics socket: the pool's stats and health, readable from outside the request pipe.

``--metrics-socket PATH`` (or ``[pool] metrics_socket``) makes the pool serve
HTTP/1.0 on a unix socket, from a thread of its own: it answers while intake
is blocked behind a full queue, while every worker is busy and while the
pool drains, because it reads the counters and gauges directly and never
goes through the request pipe. Routes:

    GET /metrics   the Prometheus text exposition format (version 0.0.4)
    GET /stats     the protocol's stats event, as JSON (``id`` null)
    GET /livez     200 while the pool process answers at all
    GET /readyz    200 "serving"; 503 "starting" or "draining"

Who may connect: the socket file is created with mode 0600, so only the
pool's own user (and root) may connect; a job never can, since seccomp
refuses it every unix socket (see policy/seccomp.py), and a write grant over
the socket's path is refused (grants.py), so a job cannot remove or replace
it. A socket left behind by a pool that died is replaced; one that another
process still listens on stops the pool at start.
"""

from __future__ import annotations

import logging
import os
import socket
import stat
import threading
from collections.abc import Callable

from ..errors import ConfigError
from ..protocol import Histogram, StatsEvent, encode
from .labels import Labelled
from .process_metrics import process_metrics
from .stats import OUTCOMES

__all__ = ["MetricsSocket", "probe", "render", "render_labelled"]

_log = logging.getLogger(__name__)

_READ_TIMEOUT = 1.0  # seconds a connection may take to send its request; one slow peer delays the next scrape
_MAX_HEAD = 8192  # bytes of request line and headers read; a longer request is refused
_BACKLOG = 16
_TEXT = "text/plain; version=0.0.4; charset=utf-8"


# --- the exposition format -------------------------------------------------------------------------


def _label(value: str) -> str:
    # The text format's escapes in a label value: backslash, double quote and line feed.
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    return repr(float(value)) if isinstance(value, float) else str(value)


class _Text:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def family(self, name: str, kind: str, help_text: str) -> None:
        self.lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]

    def sample(self, name: str, value: float, **labels: str) -> None:
        inner = ",".join(f'{key}="{_label(text)}"' for key, text in labels.items())
        self.lines.append(f"{name}{{{inner}}} {_number(value)}" if labels else f"{name} {_number(value)}")

    def metric(self, name: str, kind: str, help_text: str, value: float) -> None:
        self.family(name, kind, help_text)
        self.sample(name, value)

    def histogram(self, name: str, help_text: str, histogram: Histogram) -> None:
        self.family(name, "histogram", help_text)
        self.histogram_samples(name, histogram)

    def histogram_samples(self, name: str, histogram: Histogram, **labels: str) -> None:
        for bound, count in zip(histogram.le, histogram.counts, strict=True):
            self.sample(f"{name}_bucket", count, **labels, le=_number(bound))
        self.sample(f"{name}_bucket", histogram.count, **labels, le="+Inf")
        self.sample(f"{name}_sum", histogram.sum, **labels)
        self.sample(f"{name}_count", histogram.count, **labels)


def render(stats: StatsEvent) -> bytes:
    """The stats event in the Prometheus text format: the same snapshot, under Prometheus' names."""
    text = _Text()
    text.family("pynox_info", "gauge", "The pool's version and process id (always 1).")
    text.sample("pynox_info", 1, version=stats.version, pid=str(stats.pid))
    text.metric("pynox_uptime_seconds", "gauge", "Seconds since the pool started.", stats.uptime_ms / 1000)
    text.metric("pynox_workers", "gauge", "Workers (concurrent jobs).", stats.workers)
    text.metric("pynox_workers_busy", "gauge", "Workers running a job now.", stats.busy_workers)
    text.metric("pynox_queue_depth", "gauge", "Accepted jobs waiting for a worker.", stats.queued)
    text.metric("pynox_queue_capacity", "gauge", "Jobs that may wait before intake stops reading its input.",
                stats.queue_capacity)
    text.metric("pynox_in_flight", "gauge", "Requests accepted and not yet answered (jobs and session steps).",
                stats.in_flight)
    text.metric("pynox_sessions_active", "gauge", "Sessions open now.", stats.sessions_active)
    text.metric("pynox_sessions_max", "gauge", "The most sessions open at once (max_sessions).", stats.max_sessions)
    text.metric("pynox_draining", "gauge", "1 once input ended or a signal came: accepted work finishes, no more is "
                                           "read.", int(stats.draining))
    text.family("pynox_jobs_total", "counter", "Results written, by outcome (every result is one outcome).")
    for outcome in OUTCOMES:
        text.sample("pynox_jobs_total", getattr(stats, outcome), outcome=outcome)
    text.family("pynox_errors_total", "counter", "Results by error type (at most 64 types by name, the rest as "
                                                 "\"(other)\").")
    for error_type, count in sorted(stats.errors.items()):
        text.sample("pynox_errors_total", count, type=error_type)
    text.metric("pynox_host_calls_total", "counter", "Host-function calls relayed to the client.", stats.host_calls)
    text.metric("pynox_delegated_cpu_seconds_total", "counter", "CPU time the pool spent answering jobs' "
                "delegated calls (metadata, sysinfo, connect).", stats.delegated_cpu_ms_total / 1000)
    text.metric("pynox_template_restarts_total", "counter", "Worker templates started to replace one that died or "
                                                           "broke.", stats.template_restarts)
    text.metric("pynox_sessions_opened_total", "counter", "Sessions started.", stats.sessions_opened)
    text.metric("pynox_sessions_closed_total", "counter", "Sessions ended, for any reason.", stats.sessions_closed)
    text.metric("pynox_sessions_expired_total", "counter", "Sessions closed for being idle past session_idle.",
                stats.sessions_expired)
    if stats.budget_kills:  # a family appears with its first sample (a pool without budgets never shows it)
        text.family("pynox_tenant_budget_kills_total", "counter", "Jobs and session steps killed because their "
                    "tenant's jobs and sessions together reached its memory_budget, by tenant.")
    for tenant, count in sorted(stats.budget_kills.items()):
        text.sample("pynox_tenant_budget_kills_total", count, tenant=tenant)
    text.histogram("pynox_job_duration_seconds", "How long each job ran (refusals excluded).",
                   stats.duration_seconds)
    text.histogram("pynox_queue_wait_seconds", "How long each job waited for a worker (refusals excluded).",
                   stats.queue_seconds)
    return ("\n".join(text.lines) + "\n").encode()


def render_labelled(rows: list[Labelled]) -> bytes:
    """The counts by tenant and profile (see labels.py), as families of their own: the pool-wide ones above keep
    one label set each, so a sum over these equals them."""
    text = _Text()
    text.family("pynox_tenant_jobs_total", "counter", "Results written, by tenant, profile and outcome.")
    for row in rows:
        for outcome in OUTCOMES:
            text.sample("pynox_tenant_jobs_total", row.outcomes.get(outcome, 0), tenant=row.tenant,
                        profile=row.profile, outcome=outcome)
    text.family("pynox_tenant_job_duration_seconds", "histogram", "How long each job ran, by tenant and profile "
                                                                 "(refusals excluded).")
    for row in rows:
        text.histogram_samples("pynox_tenant_job_duration_seconds", row.duration_seconds, tenant=row.tenant,
                               profile=row.profile)
    text.family("pynox_tenant_queue_wait_seconds", "histogram", "How long each job waited for a worker, by tenant "
                                                               "and profile (refusals excluded).")
    for row in rows:
        text.histogram_samples("pynox_tenant_queue_wait_seconds", row.queue_seconds, tenant=row.tenant,
                               profile=row.profile)
    return ("\n".join(text.lines) + "\n").encode()


# --- the socket -------------------------------------------------------------------------------------


def _response(status: str, content_type: str, body: bytes, *, head: bool = False) -> bytes:
    header = (f"HTTP/1.0 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
              "Connection: close\r\n\r\n").encode()
    return header if head else header + body


class MetricsSocket:
    """The listening socket at ``path`` and the thread that answers it, until :meth:`close`."""

    def __init__(self, path: str, snapshot: Callable[[], StatsEvent], state: Callable[[], str],
                 labelled: Callable[[], list[Labelled]] = list) -> None:
        self.path = path
        self._snapshot = snapshot
        self._labelled = labelled
        self._state = state
        self._listener = self._bind(path)
        self._inode = os.stat(path).st_ino
        self._thread = threading.Thread(target=self._serve, name="pynox-metrics", daemon=True)
        self._thread.start()

    @staticmethod
    def _bind(path: str) -> socket.socket:
        where = f"metrics socket {path}"
        if os.path.lexists(path):
            if not stat.S_ISSOCK(os.lstat(path).st_mode):
                raise ConfigError(f"{where}: something that is not a socket is there; remove it or choose another "
                                  "path")
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC) as peer:
                try:
                    peer.connect(path)
                except ConnectionRefusedError:
                    os.unlink(path)  # nobody listens: a pool that died left it
                except OSError as exc:
                    raise ConfigError(f"{where}: {exc.strerror}") from None
                else:
                    raise ConfigError(f"{where}: another process is listening on it (another pool?)")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        # The file is born 0600 (no window in which another user could connect). The umask is the process's:
        # this runs before the pool starts any thread that creates files.
        umask = os.umask(0o177)
        try:
            listener.bind(path)
            listener.listen(_BACKLOG)
        except OSError as exc:
            listener.close()
            raise ConfigError(f"{where}: {exc.strerror}") from None
        finally:
            os.umask(umask)
        return listener

    def close(self) -> None:
        """Stop answering and remove the socket file, if it is still the one this pool made."""
        try:
            if os.stat(self.path).st_ino == self._inode:
                os.unlink(self.path)
        except OSError:
            pass
        try:
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._listener.close()

    def _serve(self) -> None:
        while True:
            try:
                connection, _ = self._listener.accept()
            except OSError:
                return  # closed
            with connection:
                try:
                    connection.settimeout(_READ_TIMEOUT)
                    connection.sendall(self._answer(connection))
                except OSError:
                    pass  # the peer went away or was too slow: nothing to answer
                except Exception:
                    _log.exception("the metrics socket failed to answer a request")

    def _answer(self, connection: socket.socket) -> bytes:
        request = bytearray()
        while b"\r\n\r\n" not in request and b"\n\n" not in request:
            chunk = connection.recv(_MAX_HEAD)
            if not chunk:
                break
            request += chunk
            if len(request) > _MAX_HEAD:
                return _response("431 Request Header Fields Too Large", _TEXT, b"request too large\n")
        method, _, rest = request.partition(b"\n")[0].decode("latin-1").strip().partition(" ")
        target = rest.split(" ")[0]
        if method not in ("GET", "HEAD"):
            return _response("405 Method Not Allowed", _TEXT, b"only GET and HEAD\n")
        head = method == "HEAD"
        if target == "/metrics":
            return _response("200 OK", _TEXT, render(self._snapshot()) + render_labelled(self._labelled())
                             + process_metrics(), head=head)
        if target == "/stats":
            return _response("200 OK", "application/json", encode(self._snapshot()), head=head)
        if target == "/livez":
            return _response("200 OK", _TEXT, b"ok\n", head=head)
        if target == "/readyz":
            state = self._state()
            return _response("200 OK" if state == "serving" else "503 Service Unavailable", _TEXT,
                             f"{state}\n".encode(), head=head)
        return _response("404 Not Found", _TEXT, b"routes: /metrics /stats /livez /readyz\n", head=head)


def probe(path: str, route: str, timeout: float) -> tuple[int, str]:
    """GET ``route`` from the metrics socket at ``path``: (HTTP status, body). OSError if it cannot connect."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC) as peer:
        peer.settimeout(timeout)
        peer.connect(path)
        peer.sendall(f"GET {route} HTTP/1.0\r\n\r\n".encode())
        answer = bytearray()
        while chunk := peer.recv(1 << 16):
            answer += chunk
    head, _, body = bytes(answer).partition(b"\r\n\r\n")
    status_line = head.split(b"\r\n")[0].split(b" ")
    status = int(status_line[1]) if len(status_line) > 1 and status_line[1].isdigit() else 0
    return status, body.decode(errors="replace")
