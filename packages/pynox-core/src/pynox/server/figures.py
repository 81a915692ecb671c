"""Figures, the pool's half: matplotlib works in a job, and what it draws comes back as PNG images.

* :func:`matplotlib_setup` gives matplotlib what a confined job cannot make for
  itself: a config and cache directory with the font list already built (a job
  can write nowhere, so matplotlib could not import at all). The directory is
  the pool user's own (``~/.cache/pynox``); every job may read it and none may
  write it (it is a runtime path, see ``policy.runtime``). Building the font
  list takes a second or two, once per machine and matplotlib version.
* :func:`images_on_the_wire` is where the images a job reports are checked:
  they are the job's word, so each is re-encoded to the chunks of its pixels.

The job's half, matplotlib's backend, is :mod:`pynox.job.figures`.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import importlib.util
import os
import subprocess
import sys

__all__ = ["BACKEND", "MAX_PIXELS", "PIXEL_CHUNKS", "images_on_the_wire", "matplotlib_setup", "pixels_only"]

# Named, not imported: the server never loads a module of the job's side.
BACKEND = "module://pynox.job.figures"
_PNG = b"\x89PNG\r\n\x1a\n"
_BUILD_TIMEOUT = 300.0


def matplotlib_setup() -> tuple[dict[str, str], str] | None:
    """The environment every job gets for matplotlib (its backend and config directory) and the directory
    to grant read-only, or None when matplotlib is not installed or its font list cannot be built (a job
    that imports it then fails with matplotlib's own message)."""
    spec = importlib.util.find_spec("matplotlib")
    if spec is None or not spec.origin:
        return None
    home = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    directory = os.path.realpath(os.path.join(home, "pynox", _cache_name(os.path.dirname(spec.origin))))
    env = {"MPLBACKEND": BACKEND, "MPLCONFIGDIR": directory}
    if not any(name.startswith("fontlist-") for name in _listing(directory)):
        try:
            os.makedirs(directory, mode=0o755, exist_ok=True)
            subprocess.run([sys.executable, "-I", "-c", "import matplotlib.font_manager"],
                           env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "MPLCONFIGDIR": directory,
                                "MPLBACKEND": "agg"},
                           stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           timeout=_BUILD_TIMEOUT, check=True)
        except (OSError, subprocess.SubprocessError):
            return None
    return env, directory


def _cache_name(package_dir: str) -> str:
    """The font cache's directory for this matplotlib: one per installed version and place, so a cache built
    by another matplotlib (whose fonts or format differ, and which makes every job print a warning) is
    never read. The version is the distribution's own (its _version.py differs between releases)."""
    try:
        version = importlib.metadata.version("matplotlib")
    except importlib.metadata.PackageNotFoundError:
        version = "unversioned"
    place = hashlib.sha256(os.path.realpath(package_dir).encode()).hexdigest()[:12]
    return f"matplotlib-{version}-{place}"


def _listing(directory: str) -> list[str]:
    try:
        return os.listdir(directory)
    except OSError:
        return []


def images_on_the_wire(images: list[str], limit: int) -> tuple[list[str], int]:
    """What of a report's ``images`` a result carries: real PNGs (base64), each re-encoded to the chunks that
    define its pixels (:func:`pixels_only`), at most ``limit`` bytes in all, in order; and how many were dropped
    (over the limit, or not a well-formed PNG: the report is the job's word)."""
    kept: list[str] = []
    total = 0
    for image in images:
        try:
            raw = pixels_only(base64.b64decode(image, validate=True))
        except ValueError:
            continue
        if total + len(raw) > limit:
            continue
        kept.append(base64.b64encode(raw).decode("ascii"))
        total += len(raw)
    return kept, len(images) - len(kept)


# The chunks a PNG's pixels need; every other one is dropped at the boundary. Text (tEXt, zTXt, iTXt) and
# colour profiles (iCCP) are compressed data a reader inflates when it opens the file, whatever the pixels:
# PIL inflates up to 64 MiB of text per image, so 14 one-pixel PNGs of 64 KB each held 845 MiB of one host.
PIXEL_CHUNKS = frozenset({b"IHDR", b"PLTE", b"IDAT", b"IEND", b"tRNS", b"gAMA", b"cHRM", b"sRGB", b"sBIT", b"bKGD",
                          b"pHYs"})
# The pixels themselves are compressed too: a header may declare 16k x 16k pixels of zeros that deflate a
# thousandfold, a gigabyte for whoever decodes the image. A figure is at most this many pixels (4096 x 4096:
# 64 MiB decoded as RGBA at 8 bits, far beyond matplotlib's 640 x 480); a larger one is dropped.
MAX_PIXELS = 1 << 24


def pixels_only(png: bytes) -> bytes:
    """``png`` with only its :data:`PIXEL_CHUNKS`, so no reader inflates more than its pixels; ``ValueError``
    for bytes that are not a PNG whose chunks fit (its header first, its end last), or that has more than
    :data:`MAX_PIXELS` pixels."""
    if not png.startswith(_PNG):
        raise ValueError("not a PNG")
    kept = [_PNG]
    at, kinds = len(_PNG), []
    while at < len(png):
        if at + 12 > len(png):
            raise ValueError("a PNG chunk runs past the end")
        length = int.from_bytes(png[at:at + 4], "big")
        kind = png[at + 4:at + 8]
        end = at + 12 + length
        if end > len(png):
            raise ValueError("a PNG chunk runs past the end")
        kinds.append(kind)
        if kind in PIXEL_CHUNKS:
            kept.append(png[at:end])
        at = end
        if kind == b"IEND":
            break
    if not kinds or kinds[0] != b"IHDR" or kinds[-1] != b"IEND" or b"IDAT" not in kinds:
        raise ValueError("a PNG needs a header, pixels and an end")
    header = kept[1][8:-4]  # IHDR's data: width, height (4 bytes each), then depth, colour type, ...
    if len(header) != 13:
        raise ValueError("a PNG header is 13 bytes")
    width, height = int.from_bytes(header[0:4], "big"), int.from_bytes(header[4:8], "big")
    if width * height > MAX_PIXELS:
        raise ValueError(f"a PNG of {width} x {height} pixels is more than {MAX_PIXELS} pixels")
    return b"".join(kept)
