"""A descriptor audit for the pool process (test-only): put this directory on the pool's PYTHONPATH and name a
directory in PYNOX_FD_AUDIT; a ``pynox pool`` process then records, per descriptor number, who opened it and who
closed it (``<dir>/<pid>.on`` says it is on), and writes to ``<dir>/<pid>.txt`` every close of a number it does
not own:

- ``closed twice``: a close of a number whose last recorded event was a close, with no open since (EBADF if nothing
  reopened it; otherwise another owner's descriptor was closed, the worse case);
- ``raw close of a socket's number``: ``os.close`` of a number a live ``socket.socket`` still wraps (the socket's
  own close or finalizer then closes it a second time);
- ``socket finalized open``: a socket object collected without close or detach, whose finalizer closes its number
  at a time nobody chose (the number may be another's by then).

Each report carries the stacks of the events before it. Other processes (pytest, the templates, started with -I
and a clean environment) are left alone. The openers followed are os's, socket's, open() and the descriptor
calls the pool makes through ctypes (pynox.policy._libc: openat2, pidfd_getfd, inotify_init1); a number another
C library opened unseen and then closed through a followed path would be a false report: none is known in the
pool (a run of the session, fault, allow_hosts, listen, scratch and shutdown suites reported none).
"""

from __future__ import annotations

import _socket
import _thread
import builtins
import fcntl
import io
import os
import socket
import sys
import traceback
from collections.abc import Callable
from typing import Any

_DIR = os.environ.get("PYNOX_FD_AUDIT")


def _audited() -> bool:
    argv = sys.orig_argv
    return bool(_DIR) and "pynox" in argv and "pool" in argv


def _install(directory: str) -> None:
    lock = _thread.allocate_lock()
    # fd -> (state, what, stack): state "open" or "closed"; the last event of the number.
    table: dict[int, tuple[str, str, str]] = {}
    history: dict[int, list[tuple[str, str, str]]] = {}  # fd -> its last events, oldest first
    wrapped: dict[int, int] = {}  # fd -> id() of the live socket object that wraps it
    out_path = os.path.join(directory, f"{os.getpid()}.txt")
    real_close, real_open = os.close, os.open
    real_close(real_open(os.path.join(directory, f"{os.getpid()}.on"), os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600))

    def stack() -> str:
        return "".join(traceback.format_stack(sys._getframe(2), limit=14))

    def report(kind: str, fd: int, now: str) -> None:
        text = [f"=== {kind}: fd {fd} (thread {_thread.get_ident()})", "--- now:", now]
        for state, what, where in reversed(history.get(fd, [])):
            text += [f"--- before that: {state} by {what}:", where]
        fd_out = real_open(out_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd_out, ("\n".join(text) + "\n").encode())
        finally:
            real_close(fd_out)

    def record(fd: int, event: tuple[str, str, str]) -> None:
        table[fd] = event
        events = history.setdefault(fd, [])
        events.append(event)
        del events[:-5]

    def is_open(fd: int) -> bool:
        try:
            fcntl.fcntl(fd, fcntl.F_GETFD)
        except OSError:
            return False
        return True

    def opened(fd: int, what: str) -> None:
        if fd < 0:
            return
        with lock:
            record(fd, ("open", what, stack()))
            wrapped.pop(fd, None)

    def closing(fd: int, what: str, raw: bool) -> None:
        """Before ``fd`` is closed by ``what``."""
        if fd < 0:
            return
        with lock:
            now = stack()
            before = table.get(fd)
            if before is not None and before[0] == "closed":
                report("closed twice" + ("" if is_open(fd) else " (EBADF: not open)"), fd, now)
            elif raw and fd in wrapped:
                report("raw close of a socket's number", fd, now)
            record(fd, ("closed", what, now))
            wrapped.pop(fd, None)

    def returning_fd(real: Callable[..., int], what: str) -> Callable[..., int]:
        def wrapper(*args: Any, **kwargs: Any) -> int:
            fd = real(*args, **kwargs)
            opened(fd, what)
            return fd
        return wrapper

    def returning_pair(real: Callable[..., tuple[int, int]], what: str) -> Callable[..., tuple[int, int]]:
        def wrapper(*args: Any, **kwargs: Any) -> tuple[int, int]:
            pair = real(*args, **kwargs)
            for fd in pair:
                opened(fd, what)
            return pair
        return wrapper

    def replace(name: str, wrapper: Callable[..., Any]) -> None:
        """os.NAME replaced by ``wrapper``, which keeps its place in os.supports_dir_fd and the like (shutil.rmtree
        asks them whether it may work from a directory's descriptor)."""
        real = getattr(os, name)
        for supports in (os.supports_dir_fd, os.supports_fd, os.supports_follow_symlinks, os.supports_effective_ids):
            if real in supports:
                supports.add(wrapper)
        setattr(os, name, wrapper)

    for name in ("open", "dup", "pidfd_open", "eventfd", "memfd_create"):
        if hasattr(os, name):
            replace(name, returning_fd(getattr(os, name), f"os.{name}"))
    for name in ("pipe", "pipe2", "openpty"):
        replace(name, returning_pair(getattr(os, name), f"os.{name}"))
    real_dup2 = os.dup2

    def dup2(fd: int, fd2: int, inheritable: bool = True) -> int:
        closing_it = is_open(fd2)
        if closing_it:
            closing(fd2, "os.dup2 (its target)", raw=True)
        result = real_dup2(fd, fd2, inheritable)
        opened(fd2, "os.dup2")
        return result
    replace("dup2", dup2)

    def close(fd: int) -> None:
        closing(fd, "os.close", raw=True)
        real_close(fd)
    replace("close", close)

    def closerange(low: int, high: int) -> None:
        for fd in range(low, high):
            if is_open(fd):
                close(fd)
    replace("closerange", closerange)

    real_file_open = io.open

    def file_open(file: Any, *args: Any, **kwargs: Any) -> Any:
        handle = real_file_open(file, *args, **kwargs)
        if not isinstance(file, int):  # open(fd) wraps a number another owner opened: not a new open
            try:
                opened(handle.fileno(), "open()")
            except (OSError, ValueError):
                pass
        return handle
    builtins.open = io.open = file_open

    sock_init = socket.socket.__init__

    def init(self: socket.socket, *args: Any, **kwargs: Any) -> None:
        fileno = kwargs.get("fileno", args[3] if len(args) > 3 else None)
        sock_init(self, *args, **kwargs)
        fd = self.fileno()
        with lock:
            if fileno is None or table.get(fd, ("closed",))[0] == "closed":
                record(fd, ("open", "socket.socket()", stack()))
            wrapped[fd] = id(self)
    socket.socket.__init__ = init  # type: ignore[method-assign]

    real_real_close = socket.socket._real_close  # type: ignore[attr-defined]

    def sock_close(self: socket.socket, _ss: Any = _socket.socket) -> None:
        fd = self.fileno()
        if fd >= 0:
            closing(fd, "socket.close", raw=False)
        real_real_close(self, _ss)
    socket.socket._real_close = sock_close  # type: ignore[attr-defined]

    real_detach = socket.socket.detach

    def detach(self: socket.socket) -> int:
        fd = real_detach(self)
        with lock:
            if wrapped.get(fd) == id(self):
                del wrapped[fd]
        return fd
    socket.socket.detach = detach  # type: ignore[method-assign,assignment]

    real_del = _socket.socket.__del__  # type: ignore[attr-defined]

    def finalize(self: socket.socket) -> None:
        fd = self.fileno()
        if fd >= 0:
            with lock:
                report("socket finalized open", fd, f"created at (last event of {fd}) above; {self!r}\n")
            closing(fd, "socket finalizer", raw=False)
        real_del(self)
    socket.socket.__del__ = finalize  # type: ignore[attr-defined]

    real_recvmsg = socket.socket.recvmsg

    def recvmsg(self: socket.socket, *args: Any) -> Any:
        result = real_recvmsg(self, *args)
        for level, kind, data in result[1]:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                usable = len(data) - len(data) % 4
                for i in range(0, usable, 4):
                    opened(int.from_bytes(data[i:i + 4], sys.byteorder, signed=True), "SCM_RIGHTS")
        return result
    socket.socket.recvmsg = recvmsg  # type: ignore[method-assign,assignment]

    real_accept = socket.socket._accept  # type: ignore[attr-defined]

    def accept(self: socket.socket) -> Any:
        fd, address = real_accept(self)
        opened(fd, "accept")
        return fd, address
    socket.socket._accept = accept  # type: ignore[attr-defined]

    def follow_libc(module: Any) -> None:
        """The pool's ctypes libc, which every module imports from pynox.policy._libc: the system calls that
        return a descriptor (openat2 of grants and scratch, pidfd_getfd of allow_hosts, an inotify instance)."""
        module.libc = _Libc(module.libc, opened)

    sys.meta_path.insert(0, _AfterImport({"pynox.policy._libc": follow_libc}))


_FD_SYSCALLS = {434: "pidfd_open", 437: "openat2", 438: "pidfd_getfd"}  # x86-64 and aarch64 alike


class _Libc:
    """A ctypes library whose descriptor-returning calls are followed; every other name is the library's own."""

    def __init__(self, real: Any, opened: Callable[[int, str], None]) -> None:
        self._real, self._opened = real, opened
        self.syscall = _Call(real.syscall, lambda args, fd: self._syscall(args, fd))
        self.inotify_init1 = _Call(real.inotify_init1, lambda args, fd: opened(fd, "inotify_init1"))

    def _syscall(self, args: tuple[Any, ...], fd: int) -> None:
        number = getattr(args[0], "value", args[0])
        if number in _FD_SYSCALLS:
            self._opened(fd, _FD_SYSCALLS[number])

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


class _Call:
    """One function of the library, called through (its restype and argtypes are the function's own)."""

    def __init__(self, real: Any, after: Callable[[tuple[Any, ...], int], None]) -> None:
        object.__setattr__(self, "_real", real)
        object.__setattr__(self, "_after", after)

    def __call__(self, *args: Any) -> Any:
        result = self._real(*args)
        if isinstance(result, int) and result >= 0:
            self._after(args, result)
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._real, name, value)


class _AfterImport:
    """Patches a module once it is imported (its functions call through ctypes, which no wrapper of os sees)."""

    def __init__(self, patches: dict[str, Callable[[Any], None]]) -> None:
        self.patches = patches

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        patch = self.patches.pop(name, None)
        if patch is None:
            return None
        import importlib.util
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        loader, exec_module = spec.loader, spec.loader.exec_module

        def exec_then_patch(module: Any) -> None:
            exec_module(module)
            patch(module)
        loader.exec_module = exec_then_patch  # type: ignore[method-assign]
        return spec


if _DIR and _audited():
    _install(_DIR)
