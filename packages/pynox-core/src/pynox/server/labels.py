"""The tenant and profile of each request, from its arrival to its result, and the pool's counts by them.

An operator of a pool that many agents share asks "whose jobs fail, wait or run long?": the labelled
families on the metrics socket answer it (``pynox_tenant_jobs_total{tenant, profile, outcome}`` and the
wait and run histograms by tenant and profile), beside the pool-wide ones, which keep their names and
label sets. A job's log line carries both labels too.

- The tenant is the connection's (see tenants.py), taken when the request arrives (a connection dropped
  before its result is answered still names it); a pool on stdin serves its one client as ``default``, the
  name a listening pool without ``[tenants.NAME]`` gives its own user.
- The profile is the one the request names; a session's later steps carry the profile of the request
  that opened the session. No profile: the empty label value, which Prometheus reads as no label.
- Both come from the operator's config, never from a client's free text (a profile a request names that the
  config does not have is refused before it is labelled), so the label sets are bounded by the config.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from ..protocol import Histogram, RequestId, Result
from .stats import DURATION_BUCKETS, QUEUE_BUCKETS, Buckets

__all__ = ["DEFAULT_TENANT", "Labelled", "Labels"]

DEFAULT_TENANT = "default"


def _key(request_id: RequestId) -> tuple[str, object]:
    return type(request_id).__name__, request_id  # 1, 1.0 and "1" are three ids


@dataclass(frozen=True)
class Labelled:
    """One (tenant, profile)'s counts at one moment."""

    tenant: str
    profile: str
    outcomes: dict[str, int]
    duration_seconds: Histogram
    queue_seconds: Histogram


class Labels:
    def __init__(self, alive: Callable[[str], bool], max_sessions: int) -> None:
        self._lock = threading.Lock()
        self._alive = alive  # whether the pool holds a session under a name (pruning the map below)
        self._max_sessions = max_sessions
        self._by_id: dict[tuple[str, object], list[tuple[str, str]]] = {}
        self._session_profile: dict[str, str] = {}  # the pool's session name -> the profile that opened it
        self._outcomes: Counter[tuple[str, str, str]] = Counter()
        self._durations: dict[tuple[str, str], Buckets] = {}
        self._waits: dict[tuple[str, str], Buckets] = {}

    def arrived(self, request_id: RequestId, tenant: str | None, profile: str | None, session: str | None,
                *, opens: bool) -> None:
        """A request that will be answered by a result: its labels, until :meth:`finished`. A session's step
        takes the profile of the request that opened the session (one that asks to open a live session is
        refused, and changes nothing)."""
        # Asked outside this lock: the session registry calls finish (and so this class) holding its own.
        live = self._alive(session) if session is not None and opens else False
        with self._lock:
            if session is None or len(self._session_profile) <= 4 * self._max_sessions:  # nothing to prune
                self._label(request_id, tenant, profile, session, opens=opens, live=live)
                return
            stale = list(self._session_profile)  # closed for being idle, which says nothing here
        gone = {name for name in stale if not self._alive(name)}
        with self._lock:
            for name in gone:
                self._session_profile.pop(name, None)
            self._label(request_id, tenant, profile, session, opens=opens, live=live)

    def _label(self, request_id: RequestId, tenant: str | None, profile: str | None, session: str | None, *,
               opens: bool, live: bool) -> None:
        """Under the lock: ``request_id``'s labels, a session's step taking its session's profile."""
        if session is not None:
            if session not in self._session_profile or (opens and not live):
                self._session_profile[session] = profile or ""
            profile = self._session_profile[session]
        self._by_id.setdefault(_key(request_id), []).append((tenant or DEFAULT_TENANT, profile or ""))

    def finished(self, result: Result, outcome: str, *, session: str | None, fallback: str | None,
                 ended: bool) -> tuple[str, str]:
        """Count ``result`` under its request's labels as ``outcome`` (its class, as the pool's counts took it:
        :meth:`Stats.record`), and return them. A result of no labelled request (a line the pool could not parse,
        a refused close) is counted under ``fallback``'s tenant and no profile, so that the labelled counts add
        up to the pool's."""
        key = _key(result.id)
        with self._lock:
            waiting = self._by_id.get(key)
            if waiting:
                labels = waiting.pop(0)
                if not waiting:
                    del self._by_id[key]
            else:
                labels = (fallback or DEFAULT_TENANT, "")
            if ended and session is not None:
                self._session_profile.pop(session, None)
            self._outcomes[(*labels, outcome)] += 1
            # Made once per label pair (setdefault would build one on every result, to throw it away).
            if result.refused is not True:
                durations = self._durations.get(labels)
                if durations is None:
                    durations = self._durations[labels] = Buckets(DURATION_BUCKETS)
                durations.observe(result.duration_us)
            if result.refused is not True or result.queue_us:  # as stats.py counts waits
                waits = self._waits.get(labels)
                if waits is None:
                    waits = self._waits[labels] = Buckets(QUEUE_BUCKETS)
                waits.observe(result.queue_us)
            return labels

    def closed(self, session: str) -> None:
        with self._lock:
            self._session_profile.pop(session, None)

    def snapshot(self) -> list[Labelled]:
        with self._lock:
            pairs = sorted({(tenant, profile) for tenant, profile, _ in self._outcomes})
            return [Labelled(tenant=tenant, profile=profile,
                             outcomes={outcome: count for (t, p, outcome), count in self._outcomes.items()
                                       if (t, p) == (tenant, profile)},
                             duration_seconds=self._durations.get((tenant, profile),
                                                                  Buckets(DURATION_BUCKETS)).snapshot(),
                             queue_seconds=self._waits.get((tenant, profile), Buckets(QUEUE_BUCKETS)).snapshot())
                    for tenant, profile in pairs]
