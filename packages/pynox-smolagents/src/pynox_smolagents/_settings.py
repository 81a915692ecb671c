"""Grants as JSON, for what smolagents saves: a ``PynoxTool``'s code, a ``PynoxExecutor`` in ``agent.json``.

Saved files are meant to be shared (``push_to_hub``), so what cannot be
written faithfully, or should not be written at all, raises instead of being
dropped: host functions are code, and ``env`` values may be credentials.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

__all__ = ["saved_grants"]


def saved_grants(grants: Mapping[str, Any], owner: str) -> dict[str, Any]:
    """``grants`` (``profile`` among them) as JSON values; ``ValueError`` naming ``owner`` for one that cannot be."""
    if grants.get("env"):
        raise ValueError(f"{owner}'s env is not saved (its values may be credentials): pass env again when "
                         "loading")
    return {key: _saved(owner, key, value) for key, value in grants.items() if key != "env"}


def _saved(owner: str, key: str, value: Any) -> Any:
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, (list, tuple)):
        return [_saved(owner, key, item) for item in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    raise ValueError(f"{owner}'s {key}={value!r} cannot be saved as JSON")
