"""Values across the sandbox boundary, with smolagents' own serialization semantics.

smolagents' remote executors carry values as JSON with ``{"__type__": ...}``
markers (``smolagents.serialization.SafeSerializer``): tuples, sets, bytes,
dates, ``Decimal``, paths, numpy arrays, PIL images and dataclasses (which
arrive as dicts naming their class) come back as what was sent. This module
writes and reads the same markers, and adds pandas' ``DataFrame`` and
``Series``, which smolagents can carry only as pickles: a pickle from the
sandbox would run the sandbox's code on the host, so nothing here unpickles.

It runs on both sides: imported on the host, and its source executed in each
session's process (so it imports only the standard library at the top, and
numpy, pandas or PIL only when a value of theirs is met). Reading is the
host's guard against whatever the sandboxed code sends: it builds only the
types above, an image only from PNG bytes, arrays and columns only of plain
dtypes, and nothing whose size in memory would exceed a budget (a few bytes
of JSON can ask for gigabytes: a string dtype's width, a PNG's dimensions).
"""

from __future__ import annotations

import base64
import contextvars
import dataclasses
import datetime
import decimal
import io
import math
import pathlib
from typing import Any

# numpy dtype kinds an array may be rebuilt with: bool, integers, floats, complex, strings, dates, durations.
ARRAY_KINDS = frozenset("biufcUSMm")
# Bytes one value may take once rebuilt: its images' pixels and its arrays' items together.
MAX_REBUILT_BYTES = 64 << 20
# pandas dtypes a column may be rebuilt with, beyond numpy's plain kinds (bool, numbers, dates, durations):
# each holds its values as they came, so it takes no more memory than they do.
COLUMN_DTYPES = frozenset({"object", "str", "string", "category", "boolean", "Int8", "Int16", "Int32", "Int64",
                           "UInt8", "UInt16", "UInt32", "UInt64", "Float32", "Float64"})
_budget: contextvars.ContextVar[list[int]] = contextvars.ContextVar("pynox_values_budget")


class NotSerializable(TypeError):
    """A value that cannot cross: its type is none of those this module carries."""


def to_json_safe(obj: Any) -> Any:
    """``obj`` as JSON values, with smolagents' type markers; raises :class:`NotSerializable`."""
    kind = type(obj)
    if obj is None or kind in (str, int, bool):
        return obj
    if kind is float:
        return obj if math.isfinite(obj) else {"__type__": "float", "data": repr(obj)}
    if kind is list:
        return [to_json_safe(item) for item in obj]
    if kind is dict:
        if all(type(key) is str for key in obj):
            return {key: to_json_safe(value) for key, value in obj.items()}
        return {"__type__": "dict_with_complex_keys",
                "data": [[to_json_safe(key), to_json_safe(value)] for key, value in obj.items()]}
    if kind in (tuple, set, frozenset):
        return {"__type__": kind.__name__, "data": [to_json_safe(item) for item in obj]}
    if kind is bytes:
        return {"__type__": "bytes", "data": base64.b64encode(obj).decode()}
    if kind is complex:
        return {"__type__": "complex", "real": obj.real, "imag": obj.imag}
    if isinstance(obj, datetime.datetime):  # pandas' Timestamp too
        return {"__type__": "datetime", "data": obj.isoformat()}
    if kind is datetime.date:
        return {"__type__": "date", "data": obj.isoformat()}
    if kind is datetime.time:
        return {"__type__": "time", "data": obj.isoformat()}
    if isinstance(obj, datetime.timedelta):
        return {"__type__": "timedelta", "total_seconds": obj.total_seconds()}
    if kind is decimal.Decimal:
        return {"__type__": "Decimal", "data": str(obj)}
    if isinstance(obj, pathlib.PurePath):
        return {"__type__": "Path", "data": str(obj)}
    module = getattr(kind, "__module__", "") or ""
    if module.startswith("numpy"):
        return _numpy_to_json(obj)
    if module.startswith("pandas"):
        return _pandas_to_json(obj)
    if module.startswith("PIL"):
        return _image_to_json(obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {"__type__": "dataclass", "class_name": kind.__name__, "module": module,
                "data": {field.name: to_json_safe(getattr(obj, field.name)) for field in dataclasses.fields(obj)}}
    raise NotSerializable(f"a {kind.__name__} cannot cross the sandbox boundary")


def from_json_safe(obj: Any, max_bytes: int = MAX_REBUILT_BYTES) -> Any:
    """The value :func:`to_json_safe` wrote (a dataclass comes back as a dict naming its class, as in smolagents);
    its arrays and images may take ``max_bytes`` at most, or :class:`NotSerializable` is raised before they exist."""
    token = _budget.set([max_bytes, max_bytes])
    try:
        return _read(obj)
    finally:
        _budget.reset(token)


def _spend(size: int, what: str) -> None:
    budget = _budget.get()  # [remaining, limit]
    if size > budget[0]:
        raise NotSerializable(f"{what} would take {size} bytes in memory, over the {budget[1]}-byte limit of a value")
    budget[0] -= size


def _read(obj: Any) -> Any:
    if isinstance(obj, list):
        return [_read(item) for item in obj]
    if not isinstance(obj, dict):
        return obj
    kind = obj.get("__type__")
    if not isinstance(kind, str):
        return {key: _read(value) for key, value in obj.items()}
    reader = _READERS.get(kind)
    if reader is None:  # as smolagents: a marker it does not know is an ordinary dict
        return {key: _read(value) for key, value in obj.items()}
    return reader(obj)


def _numpy_to_json(obj: Any) -> Any:
    import numpy

    if isinstance(obj, numpy.ndarray):
        if obj.dtype.kind not in ARRAY_KINDS:
            raise NotSerializable(f"a numpy array of dtype {obj.dtype} cannot cross the sandbox boundary")
        data = obj.astype(str).tolist() if obj.dtype.kind in "Mm" else to_json_safe(obj.tolist())
        return {"__type__": "ndarray", "data": data, "dtype": obj.dtype.str, "shape": list(obj.shape)}
    if isinstance(obj, numpy.generic):
        return to_json_safe(obj.item())
    raise NotSerializable(f"a {type(obj).__name__} cannot cross the sandbox boundary")


def _pandas_to_json(obj: Any) -> Any:
    import pandas

    if isinstance(obj, pandas.DataFrame):
        return {"__type__": "DataFrame", "columns": _index_to_json(obj.columns), "index": _index_to_json(obj.index),
                "data": [_column_to_json(obj.iloc[:, position]) for position in range(obj.shape[1])],
                "dtypes": [str(dtype) for dtype in obj.dtypes]}
    if isinstance(obj, pandas.Series):
        return {"__type__": "Series", "name": to_json_safe(obj.name), "index": _index_to_json(obj.index),
                "data": _column_to_json(obj), "dtype": str(obj.dtype)}
    if isinstance(obj, pandas.Timestamp):
        return {"__type__": "datetime", "data": obj.isoformat()}
    raise NotSerializable(f"a {type(obj).__name__} cannot cross the sandbox boundary")


def _column_to_json(series: Any) -> list[Any]:
    # Missing values become None: the column's dtype, carried beside, brings NaN or NaT back.
    return [None if _is_missing(value) else to_json_safe(value) for value in series.tolist()]


def _is_missing(value: Any) -> bool:
    import pandas

    try:
        return bool(pandas.isna(value))
    except (TypeError, ValueError):  # a list or array in a cell
        return False


def _index_to_json(index: Any) -> dict[str, Any]:
    return {"values": [to_json_safe(value) for value in index.tolist()], "names": [to_json_safe(name)
                                                                                    for name in index.names],
            "dtype": str(index.dtype)}


def _image_to_json(obj: Any) -> Any:
    from PIL import Image

    if not isinstance(obj, Image.Image):
        raise NotSerializable(f"a {type(obj).__name__} cannot cross the sandbox boundary")
    buffer = io.BytesIO()
    obj.save(buffer, format="PNG")
    return {"__type__": "PIL.Image", "data": base64.b64encode(buffer.getvalue()).decode()}


# -- reading -------------------------------------------------------------------------------------------------------

def _read_items(obj: dict[str, Any]) -> list[Any]:
    data = obj["data"]
    if not isinstance(data, list):
        raise NotSerializable(f"a {obj['__type__']} needs a list of items")
    return [_read(item) for item in data]


def _read_float(obj: dict[str, Any]) -> float:
    if obj["data"] not in ("nan", "inf", "-inf"):
        raise NotSerializable("a float marker carries only nan, inf or -inf")
    return float(obj["data"])


def _read_complex_keys(obj: dict[str, Any]) -> dict[Any, Any]:
    return {_read(key): _read(value) for key, value in obj["data"]}


def _read_array(obj: dict[str, Any]) -> Any:
    import numpy

    dtype = numpy.dtype(str(obj["dtype"]))
    if dtype.kind not in ARRAY_KINDS:
        raise NotSerializable(f"a numpy array of dtype {dtype} cannot cross the sandbox boundary")
    data = _read(obj["data"])
    # A string dtype's width is taken from the data, never from the marker ("<U999999999" asks gigabytes per
    # item), and numpy gives every item the longest one's: that size is checked before it is allocated.
    items, widest = _extent(data)
    per_item = dtype.itemsize if dtype.kind not in "US" else widest * (4 if dtype.kind == "U" else 1)
    _spend(items * max(per_item, 1), "this array")
    array = numpy.array(data, dtype=dtype.kind if dtype.kind in "US" else dtype)
    shape = obj.get("shape")
    return array.reshape(shape) if isinstance(shape, list) else array


def _extent(data: Any) -> tuple[int, int]:
    """How many leaves nested lists hold, and the length of the longest (a string's, or 1)."""
    items, widest, pending = 0, 0, [data]
    while pending:
        value = pending.pop()
        if isinstance(value, list):
            pending.extend(value)
            continue
        items += 1
        widest = max(widest, len(value) if isinstance(value, (str, bytes)) else 1)
    return items, widest


def _read_index(obj: Any) -> Any:
    import pandas

    values = [_read(value) for value in obj["values"]]
    names = [_read(name) for name in obj["names"]]
    if len(names) > 1:
        return pandas.MultiIndex.from_tuples([tuple(value) for value in values], names=names)
    return pandas.Index(_read_column(values, obj["dtype"]), name=names[0] if names else None)


def _read_column(values: Any, dtype: Any) -> Any:
    """A Series of ``values`` (already read) in the dtype named if it is one of the plain ones (see
    :data:`COLUMN_DTYPES`) and they fit it, else in the one pandas infers."""
    import pandas

    try:
        return pandas.Series(values, dtype=_column_dtype(str(dtype)))
    except Exception:  # any dtype name pandas or numpy would not build from these values
        return pandas.Series(values)


def _column_dtype(name: str) -> Any:
    import numpy
    import pandas

    if name in COLUMN_DTYPES:
        return name
    dtype = pandas.api.types.pandas_dtype(name)  # TypeError for a name it does not know
    if isinstance(dtype, numpy.dtype) and dtype.kind in "biufcMm":
        return dtype
    if isinstance(dtype, pandas.DatetimeTZDtype):  # dates with a time zone: 8 bytes each, as plain dates
        return dtype
    raise TypeError(f"dtype {name} is not rebuilt")


def _read_frame(obj: dict[str, Any]) -> Any:
    import pandas

    columns, index = _read_index(obj["columns"]), _read_index(obj["index"])
    data = {position: _read_column([_read(value) for value in values], dtype)
            for position, (values, dtype) in enumerate(zip(obj["data"], obj["dtypes"], strict=True))}
    frame = pandas.DataFrame(data, index=range(len(index)))
    frame.index, frame.columns = index, columns
    return frame


def _read_series(obj: dict[str, Any]) -> Any:
    series = _read_column([_read(value) for value in obj["data"]], obj["dtype"])
    series.index = _read_index(obj["index"])
    series.name = _read(obj["name"])
    return series


def _read_image(obj: dict[str, Any]) -> Any:
    return _read_png(base64.b64decode(obj["data"], validate=True))


def images_from_png(pngs: list[bytes], max_bytes: int = MAX_REBUILT_BYTES) -> list[Any]:
    """PIL images from PNG files (a step's figures), their pixels within ``max_bytes`` together."""
    token = _budget.set([max_bytes, max_bytes])
    try:
        return [_read_png(png) for png in pngs]
    finally:
        _budget.reset(token)


# The chunks that define a PNG's pixels: the pool keeps only these in a job's figures (pynox.server.figures);
# this codec, which also runs as source inside the job, keeps its own copy of the rule for images that cross
# as values. Text and colour-profile chunks are compressed data PIL inflates on open, whatever the pixels.
_PIXEL_CHUNKS = frozenset({b"IHDR", b"PLTE", b"IDAT", b"IEND", b"tRNS", b"gAMA", b"cHRM", b"sRGB", b"sBIT", b"bKGD",
                           b"pHYs"})


def _pixels_only(png: bytes) -> bytes:
    """``png`` with only the chunks of its pixels (a chunk that runs past the end raises ``ValueError``)."""
    kept, at = [png[:8]], 8
    while at + 12 <= len(png):
        end = at + 12 + int.from_bytes(png[at:at + 4], "big")
        if end > len(png):
            raise ValueError("a PNG chunk runs past the end")
        if png[at + 4:at + 8] in _PIXEL_CHUNKS:
            kept.append(png[at:end])
        at = end
    return b"".join(kept)


def _read_png(data: bytes) -> Any:
    """A PIL image from PNG bytes, its pixels within the value's budget (checked from the header, before they
    are decoded: a few kilobytes of PNG can hold a blank image of gigabytes), its text chunks never read."""
    from PIL import Image

    image = Image.open(io.BytesIO(_pixels_only(data)), formats=["PNG"])
    width, height = image.size
    _spend(width * height * max(len(image.getbands()), 1) * (4 if image.mode in ("I", "F") else 1), "this image")
    image.load()  # a broken PNG fails here, not later in the caller's hands
    return image


def _read_dataclass(obj: dict[str, Any]) -> dict[str, Any]:
    fields = obj["data"]
    if not isinstance(fields, dict):
        raise NotSerializable("a dataclass needs a dict of fields")
    return {"__dataclass__": str(obj["class_name"]), "__module__": str(obj["module"]),
            **{str(name): _read(value) for name, value in fields.items()}}


_READERS = {
    "float": _read_float,
    "tuple": lambda obj: tuple(_read_items(obj)),
    "set": lambda obj: set(_read_items(obj)),
    "frozenset": lambda obj: frozenset(_read_items(obj)),
    "dict_with_complex_keys": _read_complex_keys,
    "bytes": lambda obj: base64.b64decode(obj["data"], validate=True),
    "complex": lambda obj: complex(float(obj["real"]), float(obj["imag"])),
    "datetime": lambda obj: datetime.datetime.fromisoformat(obj["data"]),
    "date": lambda obj: datetime.date.fromisoformat(obj["data"]),
    "time": lambda obj: datetime.time.fromisoformat(obj["data"]),
    "timedelta": lambda obj: datetime.timedelta(seconds=float(obj["total_seconds"])),
    "Decimal": lambda obj: decimal.Decimal(str(obj["data"])),
    "Path": lambda obj: pathlib.Path(str(obj["data"])),
    "ndarray": _read_array,
    "DataFrame": _read_frame,
    "Series": _read_series,
    "PIL.Image": _read_image,
    "dataclass": _read_dataclass,
}
