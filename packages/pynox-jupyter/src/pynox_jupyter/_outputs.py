"""What a cell sent back, decoded in one place: the cell's code wrote it, so it is untrusted input.

A cell's step returns a JSON string (``_cell.run``), and the pool hands the kernel ``repr()`` of it, cut
at the step's output limit. Anything that is not exactly a list of nbformat outputs (``display_data``
or ``execute_result``, a ``data`` bundle of MIME type to text or JSON, a ``metadata`` object) is
dropped, and so is a bundle over the size bound: the cell's stream output and its result still stand.
"""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass, field
from typing import Any

__all__ = ["MAX_BUNDLE", "CellOutput", "decode_failure", "decode_outputs"]

MAX_BUNDLE = 16 << 20  # characters of one bundle, as the JSON the cell wrote
_KINDS = ("display_data", "execute_result")


@dataclass(frozen=True)
class CellOutput:
    """One nbformat output of a cell, as the kernel publishes it on IOPub."""

    output_type: str
    data: dict[str, Any]
    metadata: dict[str, Any] = field(default_factory=dict)


def _text(value: str | None) -> str | None:
    """The string a step returned: the pool reports ``repr()`` of it."""
    if value is None:
        return None
    try:
        text = ast.literal_eval(value)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None  # cut at the output limit, or not a string the cell's code was meant to return
    return text if isinstance(text, str) else None


def _json(value: str | None) -> Any:
    text = _text(value)
    if text is None:
        return None
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def decode_outputs(value: str | None) -> list[CellOutput]:
    """A cell's outputs, from the value its step returned (``_cell.run``)."""
    return _outputs(_json(value))


def decode_failure(value: str | None) -> tuple[list[CellOutput], list[str]]:
    """What a cell that raised displayed first, and its traceback's lines (``_cell.failed``)."""
    failure = _json(value)
    if not isinstance(failure, dict):
        return [], []
    lines = failure.get("traceback")
    if not isinstance(lines, list) or not all(isinstance(line, str) for line in lines):
        lines = []
    return _outputs(failure.get("outputs")), lines


def _outputs(outputs: Any) -> list[CellOutput]:
    if not isinstance(outputs, list):
        return []
    kept: list[CellOutput] = []
    for item in outputs:
        if not isinstance(item, dict) or item.get("output_type") not in _KINDS:
            continue
        data, metadata = item.get("data"), item.get("metadata", {})
        if not isinstance(data, dict) or not isinstance(metadata, dict) or not data:
            continue
        if not all(isinstance(mime, str) and "/" in mime for mime in data):
            continue
        if len(json.dumps(data)) > MAX_BUNDLE:
            data = {"text/plain": f"<an output of over {MAX_BUNDLE >> 20} MiB, left out>"}
            metadata = {}
        kept.append(CellOutput(item["output_type"], data, metadata))
    return kept
