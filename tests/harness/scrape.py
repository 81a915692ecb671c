"""Metrics read as Prometheus reads them: one HTTP GET, over the unix socket of a pool's ``--metrics`` or to a
TCP target (a Ray node's metrics agent).

It imports nothing of Pynox: what the pool serves is judged as any scraper would see it.
"""

from __future__ import annotations

import socket
import urllib.request
from pathlib import Path


def metrics_text(path: Path, timeout: float) -> str:
    """The body of ``GET /metrics`` on the socket at ``path`` (the exposition text, headers dropped)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as peer:
        peer.settimeout(timeout)
        peer.connect(str(path))
        peer.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
        answer = b""
        while chunk := peer.recv(65536):
            answer += chunk
    return answer.partition(b"\r\n\r\n")[2].decode()


def metrics_over_http(host: str, port: int, timeout: float) -> str:
    """The body of ``GET /metrics`` at ``host:port`` (a Prometheus target, such as a Ray node's metrics agent)."""
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=timeout) as answer:
        return str(answer.read().decode())
