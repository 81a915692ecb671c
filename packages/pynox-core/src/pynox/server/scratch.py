"""Scratch directories: files in and out of a session (or a job) without the application managing directories.

The pool makes one private root when it starts (``pynox-scratch-<pid>-…`` in ``[pool] scratch_dir``, else
its temporary directory; mode 0700, or 0711 with ``run_as`` so that the jobs' user can pass through it to
its own directory but list nothing) and removes it when it exits; roots left by pools that died are swept
at start. A request with ``"scratch": true`` gets a directory of its own in it, made before its
confinement is built: a write grant added to the request's own, its working directory, and
``$PYNOX_SCRATCH``. No request may be granted anything that overlaps the root, so no other job can read
or write a session's files.

The job may plant anything there at any time: a symlink to ``/etc/shadow``, a FIFO, a directory swapped
for a symlink. So every file the pool touches for a client is opened with ``openat2`` beneath the
directory's own descriptor (``RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS |
RESOLVE_NO_XDEV``, with ``O_NOFOLLOW | O_NONBLOCK``) and only then judged by what it is: a regular file
with one link, on the directory's device. A path is never checked as a string and then opened. A
session's file requests are served on the session's thread between its steps, while its process is
stopped (see :mod:`.sessions`).
"""

from __future__ import annotations

import base64
import binascii
import ctypes
import errno
import logging
import mimetypes
import os
import secrets
import stat
import tempfile
import threading
from collections.abc import Iterator

import msgspec

from ..errors import RequestError, cut
from ..paths import beneath
from ..policy._libc import syscall
from ..protocol import (
    FILE_CHUNK,
    Download,
    Downloaded,
    FileChunk,
    FilesListed,
    Request,
    ScratchFile,
    Upload,
    Uploaded,
)
from ..units import format_size
from ..wire.spec import MAX_GRANTS, JobSpec

__all__ = ["VARIABLE", "ScratchRoot", "answer"]

_log = logging.getLogger(__name__)

_PREFIX = "pynox-scratch-"
_SYS_OPENAT2 = 437  # the same number on every architecture
_RESOLVE_NO_XDEV = 0x01
_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_NO_SYMLINKS = 0x04
_RESOLVE_BENEATH = 0x08
_RESOLVE = _RESOLVE_BENEATH | _RESOLVE_NO_SYMLINKS | _RESOLVE_NO_MAGICLINKS | _RESOLVE_NO_XDEV
_MAX_PATH = 1024
_MAX_ENTRIES = 10_000  # entries a listing looks at: the job chooses how many there are
_MAX_DEPTH = 32
VARIABLE = "PYNOX_SCRATCH"


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


def _openat2(dirfd: int, path: str, flags: int, mode: int = 0) -> int:
    """``path`` beneath ``dirfd``, through no symlink, magic link or mount, never blocking on a FIFO."""
    how = _OpenHow(flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode, _RESOLVE)
    return syscall(_SYS_OPENAT2, ctypes.c_int(dirfd), ctypes.c_char_p(os.fsencode(path)), ctypes.byref(how),
                   ctypes.c_size_t(ctypes.sizeof(how)), what="openat2")


_REASONS = {
    errno.ELOOP: "is a symlink or goes through one; the pool follows none in a scratch directory",
    errno.EXDEV: "leads out of the scratch directory",
    errno.ENOENT: "does not exist in the scratch directory",
    errno.ENXIO: "is not a regular file (a FIFO or a socket)",
    errno.EISDIR: "is a directory",
    errno.ENOTDIR: "goes through a symlink or something else that is not a directory",
    errno.EAGAIN: "is busy (try again)",
}


def _refused(field: str, path: str, exc: OSError) -> RequestError:
    reason = _REASONS.get(exc.errno or 0, f"cannot be opened ({os.strerror(exc.errno or 0)})")
    return RequestError(f"{field}: {cut(path)} {reason}")


def _relative(field: str, path: object) -> str:
    """``path`` as a path inside a scratch directory: relative, without ``..``. The kernel holds it there
    (openat2); this only gives a bad one a clearer refusal."""
    if not isinstance(path, str) or not path or "\0" in path or len(path) > _MAX_PATH:
        raise RequestError(f"{field}: expected a path of 1 to {_MAX_PATH} characters without NUL")
    if path.startswith("/"):
        raise RequestError(f"{field}: {cut(path)} is absolute; give a path inside the scratch directory")
    parts = [part for part in path.split("/") if part not in ("", ".")]
    if ".." in parts:
        raise RequestError(f"{field}: {cut(path)} goes up (..); give a path inside the scratch directory")
    if not parts:
        raise RequestError(f"{field}: {cut(path)} names the scratch directory itself, not a file in it")
    return "/".join(parts)


def _mime(path: str) -> str:
    return mimetypes.guess_type(path, strict=False)[0] or "application/octet-stream"


def _described(path: str, st: os.stat_result, data: bytes | None = None, *, with_data: bool = False) -> ScratchFile:
    described = ScratchFile(path=path, size=st.st_size, mtime=st.st_mtime, mime=_mime(path))
    if with_data:
        described.data = base64.b64encode(data).decode() if data is not None else None
    return described


class _Directory:
    """One scratch directory, by its descriptor (held open from its making to its removal)."""

    def __init__(self, fd: int, *, max_file: int, max_total: int, owner: tuple[int, int] | None) -> None:
        self.fd = fd
        self.device = os.fstat(fd).st_dev
        self.max_file = max_file
        self.max_total = max_total
        self.owner = owner

    def _judge(self, field: str, path: str, fd: int) -> os.stat_result:
        """The open file's facts, if it is the session's own regular file; else RequestError."""
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise RequestError(f"{field}: {cut(path)} is not a regular file")
        if st.st_nlink != 1 or st.st_dev != self.device:
            # A second name for a file could be one outside, which the job never could read or write.
            raise RequestError(f"{field}: {cut(path)} has more than one link; the pool reads and writes only "
                               "files that are the scratch directory's alone")
        return st

    def walk(self) -> Iterator[tuple[str, os.stat_result]]:
        """Every regular file with one link, by its path inside, with its facts (at most _MAX_ENTRIES looked
        at, _MAX_DEPTH deep); a symlink, a FIFO or a directory swapped meanwhile is passed over."""
        seen = 0
        pending = [("", os.dup(self.fd), 0)]
        try:
            while pending:
                prefix, fd, depth = pending.pop()
                try:
                    names = sorted(os.listdir(fd))
                    for name in names:
                        seen += 1
                        if seen > _MAX_ENTRIES:
                            return
                        try:
                            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                            if stat.S_ISREG(st.st_mode) and st.st_nlink == 1 and st.st_dev == self.device:
                                yield prefix + name, st
                            elif stat.S_ISDIR(st.st_mode) and depth < _MAX_DEPTH:
                                pending.append((f"{prefix}{name}/", _openat2(fd, name, os.O_RDONLY | os.O_DIRECTORY),
                                                depth + 1))
                        except OSError:
                            continue  # gone, or swapped for something else meanwhile
                finally:
                    os.close(fd)
        finally:
            for _, fd, _ in pending:
                os.close(fd)

    def listing(self) -> list[ScratchFile]:
        return [_described(path, st) for path, st in self.walk() if _nameable(path)]

    def read(self, request: Download | str) -> FileChunk:
        wanted = request if isinstance(request, Download) else Download(path=request)
        path = _relative("download", wanted.path)
        try:
            fd = _openat2(self.fd, path, os.O_RDONLY)
        except OSError as exc:
            raise _refused("download", path, exc) from None
        try:
            st = self._judge("download", path, fd)
            if st.st_size > self.max_file:
                raise RequestError(f"download: {cut(path)} is {format_size(st.st_size)}, over the pool's "
                                   f"{format_size(self.max_file)} a file may be ([pool] scratch_max_file)")
            if not 0 <= wanted.offset <= st.st_size:
                raise RequestError(f"download: offset {wanted.offset} is outside {cut(path)} "
                                   f"({st.st_size} bytes)")
            data = os.pread(fd, FILE_CHUNK, wanted.offset)
        finally:
            os.close(fd)
        return FileChunk(path=path, size=st.st_size, mtime=st.st_mtime, mime=_mime(path), offset=wanted.offset,
                         data=base64.b64encode(data).decode(), eof=wanted.offset + len(data) >= st.st_size)

    def _parent(self, path: str) -> tuple[int, str]:
        """The directory ``path`` is to be in (made if missing), opened beneath this one, and its last name."""
        *parents, name = path.split("/")
        fd = os.dup(self.fd)
        try:
            for part in parents:
                try:
                    os.mkdir(part, 0o700, dir_fd=fd)
                    if self.owner is not None:
                        os.chown(part, *self.owner, dir_fd=fd, follow_symlinks=False)
                except FileExistsError:
                    pass  # a directory, or something the open below refuses
                child = _openat2(fd, part, os.O_RDONLY | os.O_DIRECTORY)
                os.close(fd)
                fd = child
        except OSError as exc:
            os.close(fd)
            raise _refused("upload", path, exc) from None
        return fd, name

    def write(self, request: Upload) -> ScratchFile:
        path = _relative("upload", request.path)
        try:
            data = base64.b64decode(request.data, validate=True)
        except (binascii.Error, ValueError):
            raise RequestError("upload: data is not valid base64") from None
        if request.offset < 0:
            raise RequestError(f"upload: offset must be 0 or more, got {request.offset}")
        size = request.offset + len(data)
        if size > self.max_file:
            raise RequestError(f"upload: {cut(path)} would be {format_size(size)}, over the pool's "
                               f"{format_size(self.max_file)} a file may be ([pool] scratch_max_file)")
        parent, name = self._parent(path)
        created = False
        try:
            # No O_TRUNC: the file is judged before anything of it changes (a hard link to a file outside).
            try:
                fd = _openat2(parent, name, os.O_WRONLY)
            except FileNotFoundError:
                fd = _openat2(parent, name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                created = True
        except OSError as exc:
            os.close(parent)
            raise _refused("upload", path, exc) from None
        try:
            st = self._judge("upload", path, fd)
            if request.offset not in (0, st.st_size):
                raise RequestError(f"upload: {cut(path)} holds {st.st_size} bytes; a piece goes at offset 0 (the "
                                   f"file anew) or at its end ({st.st_size}), not at {request.offset}")
            total = sum(other.st_size for _, other in self.walk()) - st.st_size + size
            if total > self.max_total:
                raise RequestError(f"upload: the scratch directory would hold {format_size(total)}, over the "
                                   f"pool's {format_size(self.max_total)} ([pool] scratch_max_total)")
            if request.offset == 0:
                os.ftruncate(fd, 0)
            view = memoryview(data)
            while view:
                written = os.pwrite(fd, view, size - len(view))
                view = view[written:]
            if self.owner is not None:
                os.fchown(fd, *self.owner)
            return _described(path, os.fstat(fd))
        except RequestError:
            if created:  # a refused upload leaves nothing behind
                os.unlink(name, dir_fd=parent)
            raise
        finally:
            os.close(fd)
            os.close(parent)

    def collect(self, budget: int) -> list[ScratchFile]:
        """Every file with its content, while ``budget`` bytes last (a job's result): one over it has data null."""
        found: list[ScratchFile] = []
        for path, st in self.walk():
            if not _nameable(path):
                continue
            data: bytes | None = None
            if st.st_size <= min(budget, self.max_file):
                try:
                    fd = _openat2(self.fd, path, os.O_RDONLY)
                except OSError:
                    continue  # swapped meanwhile
                try:
                    st = self._judge("files", path, fd)
                    data = os.pread(fd, st.st_size, 0) if st.st_size <= budget else None
                except RequestError:
                    continue
                finally:
                    os.close(fd)
                budget -= len(data or b"")
            found.append(_described(path, st, data, with_data=True))
        return found


def _nameable(path: str) -> bool:
    """Whether a protocol line can name ``path``. A name that is not UTF-8 (the job's to choose: os.listdir gives its
    bytes as lone surrogates) cannot travel in JSON: its file is passed over, as a symlink is; walk() still counts
    its size against the directory's cap."""
    try:
        path.encode()
    except UnicodeEncodeError:
        return False
    return True


class ScratchRoot:
    """The pool's private root of scratch directories, and each directory in it by its path."""

    def __init__(self, parent: str | None, *, run_as: tuple[int, int] | None, max_file: int, max_total: int,
                 others: bool = False) -> None:
        parent = os.path.realpath(parent or tempfile.gettempdir())
        _sweep(parent)
        self.path = tempfile.mkdtemp(prefix=f"{_PREFIX}{os.getpid()}-", dir=parent)
        if run_as is not None or others:  # others: a profile's or a tenant's run_as
            os.chmod(self.path, 0o711)  # the jobs' user passes through to its directory; it lists nothing
        self._fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        self._run_as = run_as
        self._max_file, self._max_total = max_file, max_total
        self._lock = threading.Lock()
        self._dirs: dict[str, _Directory] = {}

    def refuse_overlap(self, spec: JobSpec) -> None:
        """RequestError if a grant of ``spec`` lies in the root, or is a write grant that holds it: every scratch
        directory is its owner's. A read grant that holds it (``/``, the temporary directory) is the client's
        choice to let the job read everything beneath, as it reads everything else there."""
        confinement = spec.confinement
        for field, paths in (("allow_read", confinement.allow_read), ("allow_write", confinement.allow_write),
                             ("package_dirs", confinement.package_dirs)):
            for path in paths:
                if beneath(path, self.path) or (field == "allow_write" and beneath(self.path, path)):
                    raise RequestError(f"{field}: {path} overlaps the pool's scratch directories ({self.path}); "
                                       "each is its own session's: ask for one with \"scratch\": true (an "
                                       "operator can move them with [pool] scratch_dir)")

    def grant(self, spec: JobSpec) -> JobSpec:
        """``spec`` with a new scratch directory: its cwd, a write grant of its own, and ``$PYNOX_SCRATCH``."""
        if len(spec.confinement.allow_read) + len(spec.confinement.allow_write) >= MAX_GRANTS:
            raise RequestError(f"at most {MAX_GRANTS} granted paths per job, the scratch directory among them")
        name = secrets.token_hex(12)
        os.mkdir(name, 0o700, dir_fd=self._fd)
        # The user the job runs as owns it: its tenant's or profile's (in the spec), else the pool's run_as.
        confined = spec.confinement
        owner = (confined.uid, confined.gid if confined.gid is not None else confined.uid) \
            if confined.uid is not None else self._run_as
        if owner is not None:
            os.chown(name, *owner, dir_fd=self._fd, follow_symlinks=False)
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self._fd)
        path = os.path.join(self.path, name)
        with self._lock:
            self._dirs[path] = _Directory(fd, max_file=self._max_file, max_total=self._max_total, owner=owner)
        confinement = msgspec.structs.replace(spec.confinement, cwd=path,
                                              allow_write=[*spec.confinement.allow_write, path])
        payload = msgspec.structs.replace(spec.payload, env={**spec.payload.env, VARIABLE: path})
        return msgspec.structs.replace(spec, confinement=confinement, payload=payload, scratch=path)

    def directory(self, path: str | None) -> _Directory | None:
        with self._lock:
            return self._dirs.get(path) if path is not None else None

    def files_of(self, path: str, budget: int) -> list[ScratchFile]:
        """A finished job's files, with their content while ``budget`` bytes last (its max_output)."""
        directory = self.directory(path)
        try:
            return directory.collect(budget) if directory is not None else []
        except OSError:
            return []

    def remove(self, path: str | None) -> None:
        """Remove a scratch directory and everything in it (nothing it holds is followed: rmtree by descriptors).
        None: none (a job that asked for none, as most do: no lock taken)."""
        if path is None:
            return
        with self._lock:
            directory = self._dirs.pop(path, None)
        if directory is None:
            return
        os.close(directory.fd)
        _remove_tree(self._fd, os.path.basename(path))

    def close(self) -> None:
        with self._lock:
            paths = list(self._dirs)
        for path in paths:
            self.remove(path)
        os.close(self._fd)
        _remove_path(self.path)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _sweep(parent: str) -> None:
    """Remove the roots that pools of this user which have died (SIGKILL, a crash) left in ``parent``."""
    try:
        names = os.listdir(parent)
    except OSError:
        return
    for name in names:
        pid = name.removeprefix(_PREFIX).partition("-")[0]
        if not name.startswith(_PREFIX) or not pid.isdigit() or int(pid) == os.getpid() or _alive(int(pid)):
            continue
        path = os.path.join(parent, name)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid():
            _remove_path(path)


_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


def _remove_path(path: str) -> None:
    try:
        parent = os.open(os.path.dirname(path), _DIRECTORY)
    except OSError:
        return
    try:
        _remove_tree(parent, os.path.basename(path))
    finally:
        os.close(parent)


def _remove_tree(parent: int, name: str) -> bool:
    """Remove ``name`` beneath the directory ``parent`` and all it holds; True if it is gone.

    A job chooses how deep its directories go, so this is a loop, never a recursion (shutil.rmtree recurses once a
    level until 3.12: 1,000 levels raised RecursionError in the pool's thread), and it holds two descriptors at
    most, whatever the depth: it goes down through each directory by its descriptor (a symlink is unlinked, never
    followed) and back up through ``..``, checked to be the very directory it came from (device and inode). The
    job's process is gone when its directory is removed, so nothing changes beneath; if something does, or cannot
    be removed, it stops there and leaves the rest (logged), as ``ignore_errors`` did.
    """
    try:
        top = os.stat(name, dir_fd=parent, follow_symlinks=False)
        if not stat.S_ISDIR(top.st_mode):
            os.unlink(name, dir_fd=parent)
            return True
        fd = os.open(name, _DIRECTORY, dir_fd=parent)
    except FileNotFoundError:
        return True
    except OSError as error:
        _log.warning("could not remove a scratch directory %s: %s", name, error.strerror)
        return False
    # For each level from the top down to fd's: the directory's (device, inode), and the subdirectories it still
    # holds (listed once, as the level was entered: wide directories cost no listing per child).
    levels: list[tuple[tuple[int, int], list[str]]] = []
    names: list[str] = []  # the name of each level below the top, in its parent
    try:
        here = os.fstat(fd)
        if (here.st_dev, here.st_ino) != (top.st_dev, top.st_ino):
            return False
        while True:
            if len(levels) == len(names):  # fd's level is new: list it, unlink all but its directories
                with os.scandir(fd) as listing:
                    entries = list(listing)
                subdirectories = []
                for entry in entries:
                    if entry.is_dir(follow_symlinks=False):
                        subdirectories.append(entry.name)
                    else:
                        os.unlink(entry.name, dir_fd=fd)
                levels.append(((here.st_dev, here.st_ino), subdirectories))
            pending = levels[-1][1]
            if pending:
                name_below = pending.pop()
                below = os.open(name_below, _DIRECTORY, dir_fd=fd)
                here = os.fstat(below)
                os.close(fd)
                fd = below
                if here.st_dev != top.st_dev:  # nothing here may be another filesystem: leave it alone
                    return False
                names.append(name_below)
                continue
            if not names:
                break  # the top holds nothing now
            up = os.open("..", _DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = up
            here = os.fstat(fd)
            levels.pop()
            if (here.st_dev, here.st_ino) != levels[-1][0]:
                return False
            os.rmdir(names.pop(), dir_fd=fd)
    except OSError as error:
        _log.warning("could not remove all of the scratch directory %s: %s", name, error.strerror)
        return False
    finally:
        os.close(fd)
    try:
        os.rmdir(name, dir_fd=parent)
    except OSError as error:
        _log.warning("could not remove the scratch directory %s: %s", name, error.strerror)
        return False
    return True


def answer(directory: _Directory | None, session: str, request: Request) -> FilesListed | Uploaded | Downloaded:
    """The answer to a session's file request (see :meth:`Request.file_request`); RequestError if refused."""
    if directory is None:
        raise RequestError(f"session {session!r} has no scratch directory: its first request asks for one with "
                           '"scratch": true')
    if request.upload is not None:
        return Uploaded(id=request.id, session=session, uploaded=directory.write(request.upload))
    if request.download is not None:
        return Downloaded(id=request.id, session=session, downloaded=directory.read(request.download))
    return FilesListed(id=request.id, session=session, files=directory.listing())
