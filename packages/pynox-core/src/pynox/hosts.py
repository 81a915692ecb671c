"""``allow_hosts``: the hosts and ports a job may open TCP connections to, and nothing else.

An entry is ``host:port``, or a bare ``host`` for ports 80 and 443. The host is a name
(``index.example.com``), a literal IPv4 or IPv6 address, or a network in CIDR form (``10.1.0.0/16``); an
IPv6 address or network with a port is bracketed (``[2001:db8::1]:443``). One rule for every way in:
the request line, the config file, a tool made in Python, the command line.

The pool resolves each name once, when the job starts, with its own resolver, and pins the answer
(:func:`resolve`): the job is told those addresses (its ``getaddrinfo`` answers from them, see
:mod:`pynox.job.resolver`), and the pool connects the job's sockets to exactly those, or to a listed
address or network, on a listed port (:class:`AllowList`, used by the steward). A DNS answer that
changes mid-job widens nothing: the job never asks a resolver.

Nothing here runs in the job's trust: the job's own copy of the names is a convenience for its
resolver, and every decision is taken again by the pool on the address the job passed.
"""

from __future__ import annotations

import functools
import ipaddress
import os
import queue
import re
import socket
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

__all__ = ["DEFAULT_PORTS", "HOSTS_RULE", "MAX_HOSTS", "AllowList", "HostEntry", "one_port_each", "parse_entry",
           "parse_hosts", "resolve", "within"]

Network = ipaddress.IPv4Network | ipaddress.IPv6Network

MAX_HOSTS = 256
DEFAULT_PORTS = (80, 443)
HOSTS_RULE = ("entries are host:port, or a bare host for ports 80 and 443; a host is a name, an IPv4 or IPv6 "
              "address, or a CIDR network, bracketed when a port follows an IPv6 one ([2001:db8::1]:443)")
# RFC 1123 labels: letters, digits and hyphens, not at either end, up to 63 characters; 253 in all.
_LABEL = re.compile(r"(?!-)[a-z0-9-]{1,63}(?<!-)")
_PORT = re.compile(r"[0-9]{1,5}")


@dataclass(frozen=True)
class HostEntry:
    """One entry, parsed: a name (lower case, without a trailing dot) or a network, and its ports."""

    name: str | None
    network: Network | None
    ports: tuple[int, ...]

    def __str__(self) -> str:
        """The entry as it is written: a bare host for the default ports, else ``host:port`` (an entry has
        one port or the default two), parsed back to an equal entry."""
        host = self.name if self.name is not None else _show_network(self.network)
        if self.ports == DEFAULT_PORTS:
            return host
        return self.entries()[0]

    def entries(self) -> list[str]:
        """This entry as the one-port entries it stands for (how the result's policy lists them)."""
        host = self.name if self.name is not None else _show_network(self.network)
        if self.network is not None and self.network.version == 6:
            host = f"[{host}]"
        return [f"{host}:{port}" for port in self.ports]


def one_port_each(entries: Iterable[HostEntry]) -> list[str]:
    """The entries as one-port entries, in order: how the result's policy and the tool's description list
    them."""
    return [one for entry in entries for one in entry.entries()]


def _show_network(network: Network | None) -> str:
    assert network is not None
    single = network.prefixlen == network.max_prefixlen
    return str(network.network_address) if single else str(network)


def _name(text: str) -> str | None:
    name = text.lower()
    if name.endswith("."):  # the root's dot: "index.example.com." is "index.example.com"
        name = name[:-1]
    if not name or len(name) > 253:
        return None
    labels = name.split(".")
    if not all(_LABEL.fullmatch(label) for label in labels) or labels[-1].isdigit():
        return None  # a name's last label is never all digits: 1.2.3 is a mistyped address, not a name
    return name


def _network(text: str) -> Network | None:
    try:
        return ipaddress.ip_network(text, strict=True)
    except ValueError:
        return None


def parse_entry(value: object) -> HostEntry:
    """One entry; ``ValueError`` saying what is wrong with it (the caller names the field)."""
    if not isinstance(value, str) or not value or len(value) > 300:
        raise ValueError(f"{value!r}: {HOSTS_RULE}")
    text = value.strip()
    ports: tuple[int, ...] = DEFAULT_PORTS
    host = text
    if text.startswith("["):
        close = text.find("]")
        host, rest = (text[1:close], text[close + 1:]) if close > 0 else ("", "")
        bracketed = _network(host)
        if bracketed is None or bracketed.version != 6 or not rest.startswith(":"):
            raise ValueError(f"{value!r}: {HOSTS_RULE}")
        ports = (_port(rest[1:], value),)
    elif text.count(":") == 1:  # host:port (an IPv6 address has more than one colon)
        host, port = text.split(":")
        ports = (_port(port, value),)
    network = _network(host)
    if network is not None:
        return HostEntry(None, network, ports)
    if ":" in host or "/" in host:
        raise ValueError(f"{value!r}: not an address or network (a network's host bits must be zero: "
                         f"10.1.0.0/16, not 10.1.2.3/16); {HOSTS_RULE}")
    name = _name(host)
    if name is None:
        raise ValueError(f"{value!r}: {host!r} is not a host name; {HOSTS_RULE}")
    return HostEntry(name, None, ports)


def _port(text: str, value: str) -> int:
    if not _PORT.fullmatch(text) or not 1 <= int(text) <= 65535:
        raise ValueError(f"{value!r}: the port must be a number from 1 to 65535")
    return int(text)


def parse_hosts(values: Iterable[object]) -> tuple[HostEntry, ...]:
    """Every entry of a list, parsed, duplicates dropped; ``ValueError`` for the first bad one."""
    entries: list[HostEntry] = []
    for value in values:
        entry = parse_entry(value)
        if entry not in entries:
            entries.append(entry)
    if len(entries) > MAX_HOSTS:
        raise ValueError(f"at most {MAX_HOSTS} entries, got {len(entries)}")
    return tuple(entries)


def within(entry: HostEntry, ceiling: Sequence[HostEntry]) -> bool:
    """Whether ``entry`` allows nothing that ``ceiling`` does not: each of its ports is allowed by a ceiling
    entry for the same name, or for a network holding its whole network. A name lies within a name only:
    what it resolves to is known when a job starts, after the ceiling was checked."""
    return all(any(port in allowed.ports and _covers(allowed, entry) for allowed in ceiling)
               for port in entry.ports)


def _covers(allowed: HostEntry, entry: HostEntry) -> bool:
    if entry.name is not None:
        return allowed.name == entry.name
    if allowed.network is None or entry.network is None or allowed.network.version != entry.network.version:
        return False
    return entry.network.subnet_of(allowed.network)  # type: ignore[arg-type]  # same version, checked


def resolve(entries: Sequence[HostEntry], timeout: float) -> dict[str, list[str]]:
    """The addresses each name of ``entries`` has now, by the pool's own resolver, within ``timeout``
    seconds in all; a name that does not resolve in time has none (the job's connections to it fail)."""
    names = sorted({entry.name for entry in entries if entry.name is not None})
    if not names:
        return {}
    batch = _Batch(names)
    _resolver().submit(batch)
    return batch.wait(max(timeout, 0.0))


# One job's lookups in flight at once: its other names wait their turn in its own batch, so that the names of
# a job whose DNS server never answers hold at most this many of the pool's threads.
PER_JOB_LOOKUPS = 2
# The pool's threads looking names up: one more is started whenever a lookup is due and none is idle, so a
# job's lookup never waits behind another job's (up to this many at once: then in turn, job by job).
MAX_LOOKUP_THREADS = 64
# Each query's own bound, as the host's resolver applies it (resolv.conf's options, given to glibc through
# RES_OPTIONS, which it reads after the file and which wins): at most 2 s per server, 2 tries. A lookup has no
# other timeout: its thread is held until then, whoever still waits for it.
QUERY_OPTIONS = "timeout:2 attempts:2"


class _Batch:
    """One job's names: at most :data:`PER_JOB_LOOKUPS` being looked up, the rest waiting here, dropped
    when the job stops waiting (:meth:`wait` returned)."""

    def __init__(self, names: list[str]) -> None:
        self._waiting = list(reversed(names))
        self._found: dict[str, list[str]] = {}
        self.names = names
        self._done = threading.Condition()
        self._abandoned = False

    def take(self) -> str | None:
        """The next name to look up; None once there is none, or no one waits for it any more."""
        with self._done:
            if self._abandoned or not self._waiting:
                return None
            return self._waiting.pop()

    def found(self, name: str, addresses: list[str]) -> None:
        with self._done:
            self._found[name] = addresses
            self._done.notify_all()

    def wait(self, timeout: float) -> dict[str, list[str]]:
        deadline = time.monotonic() + timeout
        with self._done:
            while len(self._found) < len(self.names) and (left := deadline - time.monotonic()) > 0:
                self._done.wait(left)
            self._abandoned = True  # its names not yet taken are dropped
            return {name: list(self._found.get(name, ())) for name in self.names}


class _Resolver:
    """The pool's lookups. A batch is a queue entry per free slot of its job; a thread takes an entry, looks
    one name of it up, and queues the entry again (behind every other job's): jobs take turns."""

    def __init__(self) -> None:
        self._due: queue.SimpleQueue[_Batch] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads = 0
        self._spare = 0  # idle threads minus the entries queued for them: below 0, a lookup waits for a thread

    def submit(self, batch: _Batch) -> None:
        for _ in range(min(PER_JOB_LOOKUPS, len(batch.names))):
            self._queue(batch)

    def _queue(self, batch: _Batch) -> None:
        with self._lock:
            self._spare -= 1
            start = self._spare < 0 and self._threads < MAX_LOOKUP_THREADS
            if start:
                self._threads += 1
                self._spare += 1
        if start:
            threading.Thread(target=self._serve, name=f"pynox-resolve-{self._threads}", daemon=True).start()
        self._due.put(batch)

    def _serve(self) -> None:
        while True:
            batch = self._due.get()
            name = batch.take()
            if name is not None:
                batch.found(name, _addresses(name))
            with self._lock:
                self._spare += 1
            if name is not None:
                self._queue(batch)  # its next name, in turn


@functools.cache
def _resolver() -> _Resolver:
    """The pool's resolver, made at its first lookup (daemon threads: a hung lookup never holds up the pool's
    exit). Its queries' timeout is set before glibc first reads its resolver configuration."""
    options = os.environ.get("RES_OPTIONS", "")
    os.environ["RES_OPTIONS"] = f"{options} {QUERY_OPTIONS}".strip()
    return _Resolver()


def _addresses(name: str) -> list[str]:
    try:
        answers = socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        return []
    found: list[str] = []
    for family, _, _, _, sockaddr in answers:
        if family in (socket.AF_INET, socket.AF_INET6):
            address = str(sockaddr[0]).split("%")[0]
            if address not in found:
                found.append(address)
    return found


_Address = ipaddress.IPv4Address | ipaddress.IPv6Address


class AllowList:
    """What a job with ``allow_hosts`` may connect to: the listed networks, and the addresses its names had
    when it started, each on its listed ports. Decided on the address the job passed, as the kernel would
    read it: an IPv4-mapped IPv6 address is its IPv4 address."""

    def __init__(self, entries: Sequence[HostEntry], pinned: Mapping[str, Sequence[str]]) -> None:
        self._rules: list[tuple[Network, tuple[int, ...], HostEntry]] = []
        for entry in entries:
            if entry.network is not None:
                self._rules.append((entry.network, entry.ports, entry))
                continue
            for address in pinned.get(entry.name or "", ()):
                network = ipaddress.ip_network(address)
                self._rules.append((network, entry.ports, entry))
        self.refused: list[tuple[str, int]] = []  # the latest refusals, for the hint (bounded)

    def allows(self, address: str, port: int) -> bool:
        ip = _plain(ipaddress.ip_address(address))
        if ip.is_unspecified:  # 0.0.0.0 and :: are this host, whatever entry or name seemed to cover them
            return False
        return any(port in ports and ip in network for network, ports, _ in self._rules)

    def refuse(self, address: str, port: int) -> None:
        """Remember a refusal (the latest last, eight at most)."""
        kept = [seen for seen in self.refused if seen != (address, port)]
        self.refused = [*kept[-7:], (address, port)]

    def entry_for(self, address: str, port: int) -> str:
        """The entry the host could add to allow ``address:port``: the listed name that has this address, on
        that port, if there is one; else the address itself."""
        ip = _plain(ipaddress.ip_address(address))
        for network, _, entry in self._rules:
            if entry.name is not None and ip in network:
                return f"{entry.name}:{port}"
        return f"[{ip}]:{port}" if ip.version == 6 else f"{ip}:{port}"


def _plain(ip: _Address) -> _Address:
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip
