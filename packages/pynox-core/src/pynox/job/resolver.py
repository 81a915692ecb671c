"""The job's name resolution under ``allow_hosts``: the names the pool resolved, and no others.

A job with ``allow_hosts`` has no UDP and asks no DNS server: the pool resolved each listed name when
the job started (:func:`pynox.hosts.resolve`). Here ``socket.getaddrinfo`` (and ``gethostbyname``,
``gethostbyname_ex``) answer from those addresses, so ``requests``, ``httpx``, ``urllib``, ``asyncio``
and pip reach a listed name as they would anywhere, and TLS checks the certificate against the name
the code used. An unlisted name fails as an unknown one does (``socket.gaierror``), saying why.

This is a convenience, not a rule: the job may replace these functions, and gains nothing by it. Where
it connects is decided by the pool, on the address it passes (:mod:`pynox.server.egress`). A library
resolving names in C, without Python's ``socket`` module, finds no DNS server and fails.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["install_pinned_names"]


def install_pinned_names(pinned: Mapping[str, Sequence[str]], hosts: Sequence[str]) -> None:
    """Answer names from ``pinned`` (each listed name and its addresses); ``hosts`` is what the error says
    may be reached."""
    original: Callable[..., Any] = socket.getaddrinfo
    table = {name: list(addresses) for name, addresses in pinned.items()}
    listed = ", ".join(hosts)

    def addresses_of(host: str) -> list[str]:
        name = host.lower().rstrip(".")
        if name not in table:
            raise socket.gaierror(socket.EAI_NONAME, f"{host} is not a host this sandbox may reach "
                                  f"(allow_hosts: {listed}); ask the host to add it")
        if not table[name]:
            raise socket.gaierror(socket.EAI_NONAME, f"{host} did not resolve when the job started")
        return table[name]

    def getaddrinfo(host: Any, port: Any, family: int = 0, type: int = 0, proto: int = 0,
                    flags: int = 0) -> list[Any]:
        if isinstance(host, bytes):
            host = host.decode("idna")
        if host is None or _is_address(host):
            return list(original(host, port, family, type, proto, flags | socket.AI_NUMERICHOST))
        results: list[Any] = []
        for address in addresses_of(host):
            wanted = socket.AF_INET6 if ":" in address else socket.AF_INET
            if family in (0, socket.AF_UNSPEC, wanted):
                results += original(address, port, family, type, proto, flags | socket.AI_NUMERICHOST)
        if not results:
            raise socket.gaierror(socket.EAI_ADDRFAMILY, f"{host} has no address of that family")
        if flags & socket.AI_CANONNAME:
            first = results[0]
            results[0] = (first[0], first[1], first[2], host, first[4])
        return results

    def gethostbyname(host: str) -> str:
        if _is_address(host):
            return str(original(host, None, socket.AF_INET, 0, 0, socket.AI_NUMERICHOST)[0][4][0])
        for address in addresses_of(host):
            if ":" not in address:
                return address
        raise socket.gaierror(socket.EAI_ADDRFAMILY, f"{host} has no IPv4 address")

    def gethostbyname_ex(host: str) -> tuple[str, list[str], list[str]]:
        if _is_address(host):
            return host, [], [gethostbyname(host)]
        return host, [], [address for address in addresses_of(host) if ":" not in address]

    socket.getaddrinfo = getaddrinfo
    socket.gethostbyname = gethostbyname
    socket.gethostbyname_ex = gethostbyname_ex


def _is_address(host: str) -> bool:
    """Whether ``host`` is an IPv4 or IPv6 address (an IPv6 one may carry a ``%zone``), as
    ``ipaddress.ip_address`` decides (the same strings pass): by the C library's parser, because ipaddress
    would be imported by every template for this function alone (60 pages of private memory that every
    job's fork copies, docs/performance.md, "The template, smaller")."""
    literal = host.split("%")[0]
    for family in (socket.AF_INET, socket.AF_INET6):
        try:
            socket.inet_pton(family, literal)
        except (OSError, ValueError):  # ValueError: a NUL or a character the C parser cannot be given
            continue
        return True
    return False
