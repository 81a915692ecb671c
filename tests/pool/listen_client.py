"""A listening pool's client for tests, also run as a script under another uid.

As a script: ``python listen_client.py SOCKET SECONDS`` connects, sends each line of stdin, and prints
every line the pool writes (the ready event first) until every request id sent has an answer that is not a
call event, or SECONDS pass; a first line of ``{"event": "error"}`` ends it at once. Only the standard
library: it runs from a test's interpreter as an unprivileged user.
"""

from __future__ import annotations

import json
import socket
import sys
import threading
import time
from typing import Any


class ListenClient:
    """One connection: lines sent, every line received kept in order."""

    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self.messages: list[dict[str, Any]] = []
        self._cond = threading.Condition()
        self._eof = False
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        with self.sock.makefile("rb") as stream:
            try:
                for raw in stream:
                    with self._cond:
                        self.messages.append(json.loads(raw))
                        self._cond.notify_all()
            except OSError:
                pass
        with self._cond:
            self._eof = True
            self._cond.notify_all()

    def send(self, **fields: Any) -> Any:
        self.sock.sendall(json.dumps(fields).encode() + b"\n")
        return fields.get("id")

    def wait_for(self, predicate: Any, timeout: float = 20.0) -> dict[str, Any]:
        end = time.monotonic() + timeout
        with self._cond:
            while True:
                for message in self.messages:
                    if predicate(message):
                        return message
                left = end - time.monotonic()
                if left <= 0 or self._eof:
                    raise AssertionError(f"no such line within {timeout}s (eof {self._eof}): {self.messages[-5:]}")
                self._cond.wait(left)

    def result(self, request_id: Any, timeout: float = 20.0) -> dict[str, Any]:
        return self.wait_for(lambda m: m.get("id") == request_id and type(m.get("id")) is type(request_id)
                             and m.get("event") != "call", timeout)

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


def _main() -> int:
    path, seconds = sys.argv[1], float(sys.argv[2])
    client = ListenClient(path)
    first = client.wait_for(lambda m: True, seconds)
    print(json.dumps(first), flush=True)
    if first.get("event") == "error":
        return 0
    ids = []
    for line in sys.stdin:
        if line.strip():
            fields = json.loads(line)
            ids.append(client.send(**fields))
    end = time.monotonic() + seconds
    for request_id in ids:
        try:
            client.result(request_id, max(end - time.monotonic(), 0.01))
        except AssertionError:
            break
    for message in client.messages[1:]:
        print(json.dumps(message), flush=True)
    client.close()
    return 0


if __name__ == "__main__":
    sys.exit(_main())
