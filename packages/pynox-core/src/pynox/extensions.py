"""The core's optional native extensions (``policy/_confine.c``, ``template/_fork_loop.c``), loaded only when built
from the source beside them.

``setup.py`` compiles each source's SHA-256 into its extension (``SOURCE``). An editable install, or a checkout,
whose source changed since its last build would otherwise pass the new Python's arguments to the old C (a stale
``_confine`` made every session's child fail its setup with ``seccomp filter (own process): Invalid argument``).
Where an extension is not loaded, its Python path serves: the same rules (``pynox check`` says why for
``_confine``, and ``$PYNOX_NATIVE=1`` refuses to start without it; a template without ``_fork_loop`` serves its
cycle in Python: the same frames, ~150 copy-on-write faults a job more).
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

__all__ = ["load", "state"]


def load(package: str, name: str) -> tuple[ModuleType | None, str | None]:
    """``package``'s extension ``name``, or None and why it is not used (not built, or built from another
    source than the one beside it)."""
    try:
        module = importlib.import_module(f"{package}.{name}")
    except ImportError as exc:  # no compiler where the package was built, or a foreign build
        return None, str(exc)
    stale = _stale(module, name)
    return (None, stale) if stale is not None else (module, None)


def state(package: str, name: str) -> str:
    """What ``pynox check`` says of ``package``'s extension ``name``: ``loaded``; ``not built: <why>`` (no build
    here, or one this interpreter cannot import); ``refused: <why>`` (built from another source than the one
    beside it)."""
    module, why = load(package, name)
    if module is not None:
        return "loaded"
    return f"refused: {why}" if why is not None and why.endswith(_REBUILD) else f"not built: {why}"


_REBUILD = "(rebuild it: pip install -e packages/pynox-core)"


def _stale(module: ModuleType, name: str) -> str | None:
    """Why ``module`` was built from another ``<name>.c`` than the one beside it; None when it was built from this
    one, or when no source is beside it (a wheel).

    The source's times say nothing (``cp -p``, tar, a checkout of an older file keep a source older than its
    build): it is hashed, unless it is still the very file the build hashed, unchanged since. ``setup.py``
    compiles that file's identity in (``SOURCE_FILE``: device, inode, size and change time); any write to it, and
    any setting of its times, moves its change time, which no call but the clock's sets, and a file put in its
    place has another inode. Where nothing changed since the build (every process of a pool loads the
    extensions), that costs one stat; otherwise the read and the hash (hashlib, its import ~2 ms)."""
    built = getattr(module, "__file__", None)
    if built is None:
        return None
    source = os.path.join(os.path.dirname(built), f"{name}.c")
    try:
        held = os.stat(source)
        if getattr(module, "SOURCE_FILE", "") == f"{held.st_dev}:{held.st_ino}:{held.st_size}:{held.st_ctime_ns}":
            return None
        with open(source, "rb") as text:
            written = text.read()
    except OSError:
        return None
    import hashlib  # only here: the template, and every job with it, would hold it otherwise

    if hashlib.sha256(written).hexdigest() == getattr(module, "SOURCE", ""):
        return None
    return f"{os.path.basename(built)} was built from another {name}.c than the one beside it {_REBUILD}"
