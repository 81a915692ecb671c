"""``beneath``: whether one path is another or lies inside it, by whole components.

One rule, used by the request's resolution and ceiling (``resolve``), the
runtime list (``policy.runtime``) and the hints, on absolute, normalised paths.
"""

from __future__ import annotations

__all__ = ["beneath"]


def beneath(path: str, parent: str) -> bool:
    """Equal, or a proper descendant by whole components (``/a/bc`` is not beneath ``/a/b``)."""
    return path == parent or path.startswith(parent.rstrip("/") + "/")
