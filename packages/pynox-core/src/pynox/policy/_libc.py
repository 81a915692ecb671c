"""The few libc entry points the policy needs, through ctypes, with errors as ``OSError``."""

from __future__ import annotations

import ctypes
import os

__all__ = ["libc", "prctl", "syscall"]

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
libc.prctl.restype = ctypes.c_int
libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]  # the runtime's watch
if hasattr(libc, "statx"):  # glibc 2.28 on; without it the runtime's watch counts every change of the mount table
    libc.statx.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_uint, ctypes.c_char_p]


def _check(result: int, what: str) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return result


def syscall(number: int, *args: object, what: str) -> int:
    """Call a raw system call; a negative return raises ``OSError`` naming ``what``."""
    return _check(libc.syscall(ctypes.c_long(number), *args), what)


def prctl(option: int, arg2: int = 0, arg3: int = 0, arg4: int = 0, arg5: int = 0, *, what: str) -> int:
    return _check(libc.prctl(option, arg2, arg3, arg4, arg5), what)
