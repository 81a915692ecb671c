"""The pool's counters, its latency histograms and its per-job log line.

Outcome counters are disjoint and add up to ``jobs``: every finished request
(a refused one included) is exactly one of ok, failed, timeouts, signals,
setup_errors, request_errors or worker_errors. ``errors`` counts by error type:
a bounded set of names (a job names its own exception classes, as many and as
long as it likes), the rest counted together under ``OTHER_ERRORS``.

Latency is counted in fixed buckets, as a Prometheus histogram is, so that
p50 and p99 can be read from one snapshot or from the rate of two: a
result's run (``duration_us``) and its wait for a worker (``queue_us``). A
refused result ran nothing and waited for nothing, so it is in neither; one
refused for its queue deadline waited, and that wait is in the second.
The gauges (busy workers, queue depth, in flight) belong to the server,
which reads them at the moment of the snapshot and hands them in.
"""

from __future__ import annotations

import bisect
import os
import threading
import time
from collections import Counter
from dataclasses import dataclass

from ..protocol import Histogram, JobLogLine, RequestId, Result, StatsEvent
from ..wire.exits import CANCELLED_EXIT, REFUSED_EXIT, SETUP_FAILED_EXIT, TIMEOUT_EXIT, WORKER_ERROR_EXIT

__all__ = ["DURATION_BUCKETS", "MAX_ERROR_TYPES", "OTHER_ERRORS", "OUTCOMES", "QUEUE_BUCKETS", "Buckets", "Gauges",
           "Stats", "classify", "log_line"]

# Distinct error types counted by name, first come first counted, besides the pool's own (always by name);
# each name is at most wire.report_bounds.MAX_ERROR_TYPE characters, so a stats event stays a few kilobytes.
MAX_ERROR_TYPES = 64
# Not a Python class name (the parentheses), so no exception of a job's code is counted under it by mistake.
OTHER_ERRORS = "(other)"

# Upper bounds in seconds, fixed for the pool's life (a histogram's buckets never change under a scraper).
# A job's run: from a print (a few ms) to the longest timeouts; its wait: from an idle worker (µs) to a backlog.
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
QUEUE_BUCKETS = (0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 60.0)

OUTCOMES = ("ok", "failed", "timeouts", "signals", "setup_errors", "request_errors", "worker_errors", "cancelled")
# The pool's own verdicts: an error type together with the exit status only the pool gives it. The job's
# code can raise an exception of any name (its own TimeoutError, a class called RequestError), and write
# any report, but an error from the job always comes with exit 1 (see report.py), so it counts as failed,
# as the protocol says.
_POOL_VERDICTS = {
    ("TimeoutError", TIMEOUT_EXIT): "timeouts",
    ("SandboxSetupError", SETUP_FAILED_EXIT): "setup_errors",
    ("RequestError", REFUSED_EXIT): "request_errors",
    ("PoolWorkerError", WORKER_ERROR_EXIT): "worker_errors",
    ("CancelledError", CANCELLED_EXIT): "cancelled",
}
_POOL_TYPES = frozenset({*(error_type for error_type, _ in _POOL_VERDICTS), "SignalError"})


def classify(result: Result) -> str:
    error_type = result.error.type if result.error is not None else None
    verdict = _POOL_VERDICTS.get((error_type, result.exit))  # type: ignore[arg-type]
    if verdict is not None:
        return verdict
    if error_type == "SignalError" and result.exit > 128:
        return "signals"
    return "ok" if result.exit == 0 and error_type is None else "failed"


class Buckets:
    """One histogram's counts, by bucket (not cumulative: a bucket's own count), with their sum."""

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self._counts = [0] * (len(bounds) + 1)  # the last one is above every bound (+Inf)
        self._sum_us = 0

    def observe(self, us: int) -> None:
        # bisect_left: a value equal to a bound is in that bound's bucket (Prometheus' "le", less or equal).
        self._counts[bisect.bisect_left(self.bounds, us / 1e6)] += 1
        self._sum_us += us

    def snapshot(self) -> Histogram:
        cumulative, total = [], 0
        for count in self._counts[:-1]:
            total += count
            cumulative.append(total)
        return Histogram(le=list(self.bounds), counts=cumulative, count=total + self._counts[-1],
                         sum=self._sum_us / 1e6)


@dataclass(frozen=True)
class Gauges:
    """The pool's load at one moment, as the server sees it."""

    busy_workers: int
    queued: int
    queue_capacity: int
    in_flight: int
    sessions_active: int
    max_sessions: int
    draining: bool


class Stats:
    def __init__(self, workers: int, version: str = "") -> None:
        self._lock = threading.Lock()
        self._started = time.monotonic()
        self.workers = workers
        self.version = version
        self._template_restarts = 0
        self._durations = Buckets(DURATION_BUCKETS)
        self._waits = Buckets(QUEUE_BUCKETS)
        self._outcomes: Counter[str] = Counter()
        self._errors: Counter[str] = Counter()
        self._named: set[str] = set()  # the error types of jobs counted by name (at most MAX_ERROR_TYPES)
        self._duration_ms_total = 0
        self._queue_us_total = 0
        self._host_calls = 0
        self._delegated_cpu_ms = 0.0
        self._sessions: Counter[str] = Counter()  # opened, closed, expired
        self._budget_kills: Counter[str] = Counter()  # by tenant: killed by its memory_budget (the pool's verdict)

    def record(self, result: Result) -> str:
        """Count ``result``; its outcome (see :func:`classify`), which its labels are counted under too."""
        outcome = classify(result)
        with self._lock:
            self._outcomes[outcome] += 1
            if result.error is not None:
                self._errors[self._error_key(result.error.type)] += 1
            self._duration_ms_total += result.duration_ms
            self._queue_us_total += result.queue_us
            if result.usage is not None and isinstance(result.usage.delegated_cpu_ms, float):
                self._delegated_cpu_ms += result.usage.delegated_cpu_ms
            if result.refused is not True:
                self._durations.observe(result.duration_us)
                self._waits.observe(result.queue_us)
            elif result.queue_us:  # refused for its queue deadline: it waited, and the wait is the news
                self._waits.observe(result.queue_us)
        return outcome

    def _error_key(self, error_type: str) -> str:
        if error_type in self._errors or error_type in _POOL_TYPES or len(self._named) < MAX_ERROR_TYPES:
            if error_type not in self._errors and error_type not in _POOL_TYPES:
                self._named.add(error_type)
            return error_type
        return OTHER_ERRORS

    def record_host_call(self) -> None:
        with self._lock:
            self._host_calls += 1

    def record_session(self, what: str) -> None:
        with self._lock:
            self._sessions[what] += 1

    def record_budget_kill(self, tenant: str) -> None:
        with self._lock:
            self._budget_kills[tenant] += 1

    def record_template_restart(self) -> None:
        with self._lock:
            self._template_restarts += 1

    def snapshot(self, request_id: RequestId, gauges: Gauges) -> StatsEvent:
        with self._lock:
            return StatsEvent(
                id=request_id,
                uptime_ms=int((time.monotonic() - self._started) * 1000),
                workers=self.workers,
                sessions_active=gauges.sessions_active,
                jobs=sum(self._outcomes.values()),
                ok=self._outcomes["ok"],
                failed=self._outcomes["failed"],
                timeouts=self._outcomes["timeouts"],
                signals=self._outcomes["signals"],
                setup_errors=self._outcomes["setup_errors"],
                request_errors=self._outcomes["request_errors"],
                worker_errors=self._outcomes["worker_errors"],
                cancelled=self._outcomes["cancelled"],
                host_calls=self._host_calls,
                duration_ms_total=self._duration_ms_total,
                queue_us_total=self._queue_us_total,
                errors=dict(self._errors),
                delegated_cpu_ms_total=round(self._delegated_cpu_ms, 3),
                pid=os.getpid(),
                version=self.version,
                busy_workers=gauges.busy_workers,
                queued=gauges.queued,
                queue_capacity=gauges.queue_capacity,
                in_flight=gauges.in_flight,
                max_sessions=gauges.max_sessions,
                draining=gauges.draining,
                template_restarts=self._template_restarts,
                sessions_opened=self._sessions["opened"],
                sessions_closed=self._sessions["closed"],
                sessions_expired=self._sessions["expired"],
                duration_seconds=self._durations.snapshot(),
                queue_seconds=self._waits.snapshot(),
                budget_kills=dict(self._budget_kills),
            )


def log_line(result: Result, *, session: str | None = None, step: int | None = None) -> JobLogLine:
    """One line per finished job: identifiers, outcome and timing; never output or code."""
    error = result.error
    return JobLogLine(
        ts_ms=int(time.time() * 1000),
        id=result.id,
        session=session,
        step=step,
        exit=result.exit,
        error=error.type if error else None,
        message=error.message if error else None,
        duration_ms=result.duration_ms,
        queue_us=result.queue_us,
        network=result.policy.network if result.policy else None,
        truncated=result.stdout_truncated or result.stderr_truncated,
        usage=result.usage,
    )
