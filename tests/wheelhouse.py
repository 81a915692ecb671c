"""Tiny packages the tests build themselves, and the pool configs that install them, with no network beyond
this machine: wheels written by hand with zipfile (METADATA, WHEEL, RECORD, one module), a source
distribution, in a wheelhouse directory (``find_links``) or served as a simple index on loopback.

The uv the pool runs is logged: :func:`uv_logger` writes a wrapper that appends each invocation to a file
and then runs the real uv, so a test counts installs from outside the pool.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import http.server
import io
import os
import stat
import tarfile
import threading
import zipfile
from collections.abc import Iterator, Sequence
from pathlib import Path

__all__ = ["Wheelhouse", "make_wheelhouse", "pool_config", "serve_index", "uv_logger"]


def _digest(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def write_wheel(directory: Path, name: str, version: str, source: str, requires: Sequence[str] = ()) -> Path:
    """A pure-Python wheel of one module ``name`` (dashes as underscores) whose ``__init__`` is ``source``."""
    module = name.replace("-", "_")
    info = f"{module}-{version}.dist-info"
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    metadata += "".join(f"Requires-Dist: {requirement}\n" for requirement in requires)
    files = {
        f"{module}/__init__.py": source.encode(),
        f"{info}/METADATA": metadata.encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: pynox-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(f"{path},{_digest(data)},{len(data)}\n" for path, data in files.items()) + f"{info}/RECORD,,\n"
    files[f"{info}/RECORD"] = record.encode()
    path = directory / f"{module}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for name_in, data in files.items():
            archive.writestr(name_in, data)
    return path


def write_sdist(directory: Path, name: str, version: str, marker: Path) -> Path:
    """A source distribution whose build would write ``marker``: if it exists, code of the sdist ran."""
    base = f"{name}-{version}"
    files = {f"{base}/PKG-INFO": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
             f"{base}/setup.py": f"open({str(marker)!r}, 'w').write('built')\nfrom setuptools import setup\n"
                                 f"setup(name={name!r}, version={version!r})\n"}
    path = directory / f"{base}.tar.gz"
    with tarfile.open(path, "w:gz") as archive:
        for name_in, text in files.items():
            data = text.encode()
            entry = tarfile.TarInfo(name_in)
            entry.size = len(data)
            archive.addfile(entry, io.BytesIO(data))
    return path


class Wheelhouse:
    """A directory of the test packages: ``tinypkg`` 1.0 and 2.0 (2.0 needs ``tinydep``), ``tinydep``,
    ``bigpkg`` (a megabyte of data), and ``onlysrc``, a source distribution only."""

    def __init__(self, root: Path) -> None:
        self.dir = root / "wheelhouse"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.sdist_marker = root / "sdist-was-built"
        write_wheel(self.dir, "tinypkg", "1.0", "VALUE = 41\n")
        write_wheel(self.dir, "tinypkg", "2.0", "from tinydep import BASE\nVALUE = BASE + 2\n", requires=["tinydep"])
        write_wheel(self.dir, "tinydep", "0.1", "BASE = 40\n")
        write_wheel(self.dir, "bigpkg", "1.0", "DATA = " + repr("x" * (1 << 20)) + "\n")
        write_sdist(self.dir, "onlysrc", "1.0", self.sdist_marker)


def make_wheelhouse(root: Path) -> Wheelhouse:
    return Wheelhouse(root)


def pool_config(path: Path, *, packages_dir: Path, find_links: Sequence[str] = (), index: str | None = None,
                allowed: Sequence[str] | None = ("tinypkg", "tinydep", "onlysrc", "bigpkg"),
                extra_pool: str = "", extra_limits: str = "") -> Path:
    """A pynox.toml whose pool installs from ``find_links`` (or ``index``) into ``packages_dir``; ``allowed``
    is the ceiling's packages (None: no [pool.limits] table)."""
    lines = ["[pool]", f"packages_dir = {str(packages_dir)!r}"]
    if find_links:
        lines.append(f"find_links = [{', '.join(repr(link) for link in find_links)}]")
    if index is not None:
        lines.append(f"package_index = {index!r}")
    lines.append(extra_pool)
    if allowed is not None:
        lines += ["[pool.limits]", f"packages = [{', '.join(repr(name) for name in allowed)}]", extra_limits]
    path.write_text("\n".join(lines) + "\n")
    return path


def uv_logger(directory: Path, log: Path, *, delay: float = 0.0) -> Path:
    """An executable that appends its arguments to ``log``, then runs the real uv: a config's ``[pool] uv``,
    to count the pool's invocations from outside. ``delay``: seconds it sleeps first (a slow index)."""
    import uv

    real = uv.find_uv_bin()
    directory.mkdir(parents=True, exist_ok=True)
    wrapper = directory / "uv"
    wrapper.write_text(f'#!/bin/sh\necho "$*" >> {str(log)!r}\nsleep {delay}\nexec {str(real)!r} "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return wrapper


@contextlib.contextmanager
def serve_index(wheelhouse: Path) -> Iterator[str]:
    """A PEP 503 simple index of ``wheelhouse`` on 127.0.0.1, for as long as the block runs; yields its URL."""
    site = wheelhouse.parent / "index"
    simple = site / "simple"
    by_project: dict[str, list[str]] = {}
    for file in sorted(os.listdir(wheelhouse)):
        project = file.split("-")[0].replace("_", "-").lower()
        by_project.setdefault(project, []).append(file)
    for project, files in by_project.items():
        (simple / project).mkdir(parents=True, exist_ok=True)
        links = "".join(f'<a href="/files/{file}">{file}</a>\n' for file in files)
        (simple / project / "index.html").write_text(f"<html><body>\n{links}</body></html>\n")
    files_dir = site / "files"
    files_dir.mkdir(parents=True, exist_ok=True)
    for file in os.listdir(wheelhouse):
        target = files_dir / file
        if not target.exists():
            os.link(wheelhouse / file, target)

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
            super().__init__(*args, directory=str(site), **kwargs)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/simple"
    finally:
        server.shutdown()
        server.server_close()
