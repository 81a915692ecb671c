"""Removing a directory tree that confined code made: as deep and as wide as the code liked, with symlinks in it.

A job's scratch directory: the code chooses what is in it. ``shutil.rmtree`` recursed
once a level (RecursionError past ~1,000 levels: a ``chdir`` into each new directory makes one thousands deep,
and the error ended the pool) and held a descriptor a level. Nothing here follows a symlink, recurses, or raises
OSError.
"""

from __future__ import annotations

import contextlib
import os
import secrets

__all__ = ["remove_path", "remove_tree"]

_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_MOVED = ".pynox-moved-"  # a directory moved up into the top one, to be emptied from there


def remove_tree(parent: int, name: str) -> None:
    """Remove ``name`` in the directory ``parent`` and everything beneath it (a file or a symlink: itself alone).
    What cannot be removed stays."""
    try:
        top = os.open(name, _DIRECTORY, dir_fd=parent)
    except FileNotFoundError:
        return
    except OSError:  # not a directory, or a symlink to one
        with contextlib.suppress(OSError):
            os.unlink(name, dir_fd=parent)
        return
    try:
        _empty(top)
    finally:
        os.close(top)
    with contextlib.suppress(OSError):
        os.rmdir(name, dir_fd=parent)


def _empty(top: int) -> None:
    """Remove everything in the open directory ``top``. Each directory found below one of its own is first moved
    up into ``top`` (a rename within one file system) and emptied from there: two directories open at a time,
    whatever the depth, and nothing leaves ``top`` while it is emptied (a removal cut short leaves it all there)."""
    pending: list[str | None] = [None]  # None: top itself; else a directory's name in top
    while pending:
        current = pending.pop()
        try:
            fd = top if current is None else os.open(current, _DIRECTORY, dir_fd=top)
        except OSError:
            continue
        try:
            with os.scandir(fd) as entries:
                for entry in entries:
                    try:
                        if not entry.is_dir(follow_symlinks=False):
                            os.unlink(entry.name, dir_fd=fd)
                        elif current is None:
                            pending.append(entry.name)
                        else:
                            moved = _MOVED + secrets.token_hex(12)
                            os.rename(entry.name, moved, src_dir_fd=fd, dst_dir_fd=top)
                            pending.append(moved)
                    except OSError:
                        continue
        except OSError:
            pass
        finally:
            if fd != top:
                os.close(fd)
        if current is not None:
            with contextlib.suppress(OSError):
                os.rmdir(current, dir_fd=top)


def remove_path(path: str) -> None:
    """:func:`remove_tree` of an absolute ``path``."""
    head, name = os.path.split(path)
    try:
        parent = os.open(head or "/", _DIRECTORY)
    except OSError:
        return
    try:
        remove_tree(parent, name)
    finally:
        os.close(parent)
