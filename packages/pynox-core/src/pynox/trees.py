"""Removing a directory tree that confined code made: as deep and as wide as the code liked, with symlinks in it.

A job's scratch directory, a Jupyter kernel's home: the code chooses what is in them. ``shutil.rmtree`` recursed
once a level (RecursionError past ~1,000 levels: a ``chdir`` into each new directory makes one thousands deep,
and the error ended the pool) and held a descriptor a level. Nothing here follows a symlink, recurses, or raises
OSError.
"""

from __future__ import annotations

import contextlib
import os

__all__ = ["remove_path", "remove_tree"]

# Directories remove_tree holds open at once, however deep the tree.
_MAX_OPEN = 32


def remove_tree(parent: int, name: str) -> None:
    """Remove ``name`` in the directory ``parent`` and everything beneath it, following no symlink, without
    recursion and never raising OSError (what cannot be removed stays). At most _MAX_OPEN directories are open at
    once: a directory deeper than that is first moved up into ``parent``, beside ``name`` (as ``name-deep-N``, which
    a sweep by ``name``'s prefix finds too if this is cut short), and removed in its turn."""
    pending = [name]
    moved = 0
    while pending:
        top = pending.pop()
        try:
            fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
        except FileNotFoundError:
            continue
        except OSError:  # not a directory (or a symlink): a file's name
            with contextlib.suppress(OSError):
                os.unlink(top, dir_fd=parent)
            continue
        # Each open directory, its name in the one above it, and its subdirectories not yet removed.
        chain: list[tuple[int, str, list[str]]] = [(fd, top, _empty_but_directories(fd))]
        while chain:
            fd, here, below = chain[-1]
            if below:
                child = below.pop()
                if len(chain) >= _MAX_OPEN:
                    moved += 1
                    with contextlib.suppress(OSError):
                        os.rename(child, f"{name}-deep-{moved}", src_dir_fd=fd, dst_dir_fd=parent)
                        pending.append(f"{name}-deep-{moved}")
                    continue
                try:
                    opened = os.open(child, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
                except OSError:
                    continue
                chain.append((opened, child, _empty_but_directories(opened)))
                continue
            chain.pop()
            os.close(fd)
            with contextlib.suppress(OSError):
                os.rmdir(here, dir_fd=chain[-1][0] if chain else parent)


def _empty_but_directories(fd: int) -> list[str]:
    """Unlink everything in the open directory ``fd`` that is not a directory; the names of its directories."""
    directories: list[str] = []
    try:
        with os.scandir(fd) as entries:
            for entry in entries:
                try:
                    if entry.is_dir(follow_symlinks=False):
                        directories.append(entry.name)
                    else:
                        os.unlink(entry.name, dir_fd=fd)
                except OSError:
                    continue
    except OSError:
        pass
    return directories


def remove_path(path: str) -> None:
    """remove_tree of an absolute ``path``."""
    head, name = os.path.split(path)
    try:
        parent = os.open(head or "/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        remove_tree(parent, name)
    finally:
        os.close(parent)
