"""The client's transport to a listening pool (``pynox pool --listen unix:PATH``): one unix socket connection,
the same JSON Lines as a pool's pipes, behind the interface ``Pool`` uses for a pool process it starts.

The connection is this client's own: the pool scopes its ids, sessions, cancels and host calls to it, and
cancels its jobs and closes its sessions when it closes. Closing it is all ``close`` does: the pool is the
operator's, and goes on serving others.
"""

from __future__ import annotations

import concurrent.futures
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import msgspec

from ..errors import ConfigError, PoolError
from ..protocol import Answer, Reply, Request, decode_answer, encode

__all__ = ["Connection", "connect_address"]


def connect_address(value: str) -> str:
    """The socket path of ``"unix:PATH"``; ConfigError for anything else."""
    if not isinstance(value, str) or not value.startswith("unix:") or not value.removeprefix("unix:"):
        raise ConfigError(f'connect= takes "unix:PATH" (a listening pool\'s socket), got {value!r}')
    return value.removeprefix("unix:")


class Connection:
    """One connection to a listening pool and its reader thread (as ``_Process`` is for a started pool)."""

    def __init__(self, path: str, on_line: Callable[[Answer], None], on_bad_line: Callable[[bytes, str], None],
                 on_exit: Callable[[Any], None]) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            self.sock.connect(path)
        except OSError as exc:
            self.sock.close()
            raise PoolError(f"cannot connect to the pool at unix:{path}: {exc.strerror or exc}") from None
        self.ready: concurrent.futures.Future[bytes] = concurrent.futures.Future()
        self._on_line = on_line
        self._on_bad_line = on_bad_line
        self._on_exit = on_exit
        self._write_lock = threading.Lock()
        self.dead = False
        self.last_heard = time.monotonic()
        self.hung: str | None = None
        self._reader = threading.Thread(target=self._read, name="pynox-client-connection", daemon=True)
        self._reader.start()

    def write(self, message: Request | Reply) -> None:
        self.write_line(encode(message))

    def write_line(self, line: bytes) -> None:
        with self._write_lock:
            try:
                self.sock.sendall(line)
            except OSError as exc:
                raise PoolError(f"the connection to the pool is gone: {self.describe_exit()}") from exc

    def _read(self) -> None:
        stream = self.sock.makefile("rb")
        try:
            for raw in stream:
                self.last_heard = time.monotonic()
                if not self.ready.done():
                    self.ready.set_result(raw)
                    continue
                try:
                    message = decode_answer(raw)
                except (msgspec.DecodeError, msgspec.ValidationError, RecursionError) as exc:
                    self._on_bad_line(raw, str(exc))
                    continue
                self._on_line(message)
        except OSError:
            pass
        finally:
            stream.close()
            self.dead = True
            if not self.ready.done():
                self.ready.set_exception(PoolError(f"the pool at unix:{self.path} closed the connection before it "
                                                   "was ready"))
            self._on_exit(self)

    def stop_hung(self, why: str) -> None:
        self.hung = why
        self.dead = True
        self._shut()

    def forget_after_fork(self) -> None:
        """In a forked child: the connection is the parent's; this process never uses or closes it."""
        self.dead = True
        self.hung = "this connection belongs to the process that forked"

    def describe_exit(self) -> str:
        return self.hung or f"the pool at unix:{self.path} closed the connection"

    def _shut(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def close(self, timeout: float) -> None:
        """Close the connection: the pool cancels what this client still had in flight."""
        self._shut()
        self._reader.join(timeout=max(timeout, 0.5))
        self.sock.close()
