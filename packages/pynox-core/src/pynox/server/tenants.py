"""Tenants of a listening pool: who a connection's peer is, and what that tenant may have in flight.

A peer is known from its socket's ``SO_PEERCRED`` (uid, gid, pid: the kernel's word, not the client's).
``[tenants.NAME]`` tables map peers to tenants, first match wins; a pool with no tenant table serves only
its own user (tenant ``"default"``). A peer that matches no tenant is refused before it sends anything.

Per tenant, over all its connections: the profiles its requests may name (every job and every session's
first request must name one of them), the most jobs and session steps in flight (queued or running), and the
most sessions open. A request beyond a bound is refused at once, with the bound named, never queued: one
tenant filling the pool cannot push another's wait past its own ``max_jobs`` share.

A tenant with ``memory_budget`` or ``cpu_weight`` has cgroups of its own (:func:`budget_group`), beneath which
the templates serving its jobs and sessions run: the kernel holds them together to the budget and shares the
CPU among tenants by weight; where such cgroups cannot be made, the pool does not start.
"""

from __future__ import annotations

import os
import socket
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass

from ..config import TenantSettings
from ..errors import KernelSupportError, quoted
from ..policy import cgroups
from ..protocol import Request

__all__ = ["Peer", "Tenant", "Tenants", "budget_group", "peer_of"]

_CRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


@dataclass(frozen=True)
class Peer:
    pid: int
    uid: int
    gid: int

    def __str__(self) -> str:
        return f"pid {self.pid}, uid {self.uid}, gid {self.gid}"


def peer_of(connection: socket.socket) -> Peer:
    pid, uid, gid = _CRED.unpack(connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CRED.size))
    return Peer(pid, uid, gid)


class Tenant:
    """One tenant's bounds and what it holds now, shared by its connections."""

    def __init__(self, settings: TenantSettings) -> None:
        self.settings = settings
        self.name = settings.name
        self._lock = threading.Lock()
        self.in_flight = 0  # its jobs and session steps accepted and not yet answered
        self._sessions: set[str] = set()  # the pool's names of its open sessions
        self.connections = 0  # its connections open to a listening pool

    def connect(self) -> str | None:
        """Count a new connection in; the refusal's reason if it is one more than its max_connections (then
        nothing is counted)."""
        most = self.settings.max_connections
        with self._lock:
            if most is not None and self.connections >= most:
                return (f"tenant {quoted(self.name)} has {self.connections} connections open to this pool, its "
                        "max_connections; close one first")
            self.connections += 1
        return None

    def disconnected(self) -> None:
        with self._lock:
            self.connections = max(self.connections - 1, 0)

    def admit(self, request: Request, pool_name: str | None, alive: Callable[[str], bool]) -> str | None:
        """Count ``request`` in; the refusal's reason if it is beyond a bound (then nothing is counted).
        ``pool_name``: the session's name as the pool knows it, for a session request; ``alive``: whether the
        pool still holds a session (one closed for being idle says nothing on the wire)."""
        limits = self.settings
        # A request opens a session when it says so (open, grants, a restore), and also when it carries code to
        # a name the pool holds no session under: the protocol opens one then, with the pool's defaults.
        opens = request.session is None or bool(request.open or request.grant_fields()) or \
            request.restore is not None or (request.open is None and request.code is not None and
                                            pool_name is not None and not alive(pool_name))
        if limits.profiles is not None and opens and request.profile not in limits.profiles:
            return (f"tenant {quoted(self.name)} may run only under its profiles ({', '.join(limits.profiles)}); "
                    f"this request names {quoted(request.profile) if request.profile else 'none'}")
        with self._lock:
            if pool_name is not None and request.close:
                return None
            if limits.max_jobs is not None and self.in_flight >= limits.max_jobs:
                return (f"tenant {quoted(self.name)} has {self.in_flight} jobs in flight, its max_jobs; refused at "
                        "once and nothing ran: wait for one to finish")
            if pool_name is not None and pool_name not in self._sessions:
                if limits.max_sessions is not None and len(self._sessions) >= limits.max_sessions:
                    self._sessions = {name for name in self._sessions if alive(name)}
                if limits.max_sessions is not None and len(self._sessions) >= limits.max_sessions:
                    return (f"tenant {quoted(self.name)} has {len(self._sessions)} sessions open, its max_sessions; "
                            "close one first")
                self._sessions.add(pool_name)
            self.in_flight += 1
        return None

    def admit_copy(self, pool_name: str, alive: Callable[[str], bool]) -> str | None:
        """Count a session fork's copy (``pool_name``) among the tenant's sessions; the refusal's reason if it
        is one more than its max_sessions (then nothing is counted)."""
        limits = self.settings
        with self._lock:
            if pool_name in self._sessions:
                return None
            if limits.max_sessions is not None and len(self._sessions) >= limits.max_sessions:
                self._sessions = {name for name in self._sessions if alive(name)}
            if limits.max_sessions is not None and len(self._sessions) >= limits.max_sessions:
                return (f"tenant {quoted(self.name)} has {len(self._sessions)} sessions open, its max_sessions, and "
                        "a fork's copy would be one more; close one first")
            self._sessions.add(pool_name)
        return None

    def answered(self, *, session: str | None = None, ended: bool = False) -> None:
        """A job or step of this tenant was answered; ``ended``: its session is over."""
        with self._lock:
            self.in_flight = max(self.in_flight - 1, 0)
            if ended and session is not None:
                self._sessions.discard(session)

    def session_closed(self, session: str) -> None:
        with self._lock:
            self._sessions.discard(session)


class Tenants:
    """The configured tenants, or the one implicit tenant of the pool's own user."""

    def __init__(self, settings: tuple[TenantSettings, ...]) -> None:
        own = os.geteuid()
        self._tenants = [Tenant(entry) for entry in settings] or [
            Tenant(TenantSettings(name="default", uids=frozenset({own})))]
        self.configured = bool(settings)

    def of(self, peer: Peer) -> Tenant | None:
        return next((tenant for tenant in self._tenants if tenant.settings.matches(peer.uid, peer.gid)), None)

    def all(self) -> list[Tenant]:
        return list(self._tenants)


def budget_group(index: int, tenant: TenantSettings) -> cgroups.TenantGroup:
    """The cgroups of a tenant with a budget (``index``: its place in the config, which names them);
    KernelSupportError, naming the tenant and the reason, where they cannot be made: the pool and
    ``pynox check --config`` refuse such a config rather than run the tenant's jobs without its budget."""
    keys = " and ".join(key for key, value in (("memory_budget", tenant.memory_budget),
                                                ("cpu_weight", tenant.cpu_weight)) if value is not None)
    try:
        return cgroups.TenantGroup(cgroups.available(), index, tenant.name, tenant.memory_budget, tenant.cpu_weight)
    except OSError as exc:
        raise KernelSupportError(f"[tenants.{tenant.name}] {keys}: the tenant's cgroup cannot be made on this host "
                                 f"({exc.strerror or exc}); the pool does not run its jobs without it (remove the "
                                 "key, or run the pool where it may make cgroups: as root, or in a delegated "
                                 "cgroup)") from None
