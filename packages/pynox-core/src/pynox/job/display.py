"""Rich display, the job's half: ``display()`` and the notebook's display classes, by IPython's rules.

Every job has ``display`` as a builtin, as IPython gives it, and ``pynox_display`` to import it and
``HTML``, ``Markdown``, ``Image``, ``JSON``, ``SVG``, ``Latex`` from. Where IPython is installed, its own
``IPython.display`` works too: its ``display`` is this one (see :func:`hook_ipython`).

An object becomes a MIME bundle by IPython's rules: with IPython's own ``DisplayFormatter`` when IPython's
formatters are already imported in the job (preloaded by the operator, or imported by the code); otherwise
by :func:`_fallback`, the same rules written small (``_repr_mimebundle_``, then ``_repr_html_``,
``_repr_markdown_``, ``_repr_svg_``, ``_repr_png_``, ``_repr_jpeg_``, ``_repr_latex_``, ``_repr_json_``,
``_repr_javascript_``, ``_repr_pdf_``), always with ``text/plain``. So displaying never imports IPython: that
would cost the job a tenth of a second.

Each bundle is one frame on the display descriptor (``wire.descriptors.DISPLAY``): a 4-byte big-endian
length, then JSON ``{"output_type", "data", "metadata"}``, as nbformat shapes an output. This runs
after confinement, next to the code: the pool reads the frames as hostile input (server/display.py).
"""

from __future__ import annotations

import _thread
import base64
import io
import json
import os
import struct
import sys
from collections.abc import Callable
from typing import Any

from ..wire.descriptors import DISPLAY
from . import interrupts

__all__ = ["HTML", "JSON", "SVG", "DisplayHandle", "DisplayObject", "Image", "Latex", "Markdown", "display",
           "hook_ipython", "publish", "result"]

_HEADER = struct.Struct("!I")
_MAX_PLAIN = 256 << 10  # characters of a text/plain repr, as execute.py cuts a trailing value's
# The methods IPython's DisplayFormatter calls, each for its MIME type (in its order).
_REPR_METHODS = (
    ("_repr_html_", "text/html"), ("_repr_markdown_", "text/markdown"), ("_repr_svg_", "image/svg+xml"),
    ("_repr_png_", "image/png"), ("_repr_jpeg_", "image/jpeg"), ("_repr_latex_", "text/latex"),
    ("_repr_json_", "application/json"), ("_repr_javascript_", "application/javascript"),
    ("_repr_pdf_", "application/pdf"),
)
_BINARY = frozenset({"image/png", "image/jpeg", "application/pdf"})

# The bytes of bundle data this job may send in all (its max_output; the pool bounds it again), and what
# it sent so far. Set by execute.py for each job or session step.
limit = 1 << 20
_sent = 0
_formatter: Any = None
# Where the frames go: the display channel (a job, a session's first step), or the session's report pipe, which
# carries each later step's frames and then its report (see :func:`begin`, :func:`after_frames`); None in a session
# fork's copy until its first step.
_channel: int | None = DISPLAY
# One writer at a time, each frame written whole (a step's interrupt held meanwhile, see interrupts.hold): on a
# report pipe what follows a frame is read at a frame's start, and the report only after the last whole frame.
_lock = _thread.allocate_lock()


def begin(bytes_limit: int, to: int | None = None) -> None:
    """A job or a session step starts: its display outputs are bounded anew; with ``to``, they go there (a later
    session step's report pipe, which carries its frames and then its report), else where they went."""
    global limit, _sent, _channel
    limit, _sent = bytes_limit or (1 << 20), 0
    if to is not None and to != _channel:
        if _channel is None:  # a fork's copy: no thread is inside a frame (each saw None under the lock, or sees it)
            _channel = to
        else:  # a session's first step's display channel: a thread's frame on it is whole first
            with _lock:
                _channel = to


def publish(data: dict[str, Any], metadata: dict[str, Any] | None = None, *,
            output_type: str = "display_data") -> None:
    """Send one bundle to the pool (what ``IPython.display.publish_display_data`` does in a kernel)."""
    global _sent
    try:
        frame = json.dumps({"output_type": output_type, "data": data, "metadata": metadata or {}},
                           default=str, ensure_ascii=False).encode("utf-8", "replace")
    except (TypeError, ValueError, RecursionError) as exc:  # data that is not JSON: say so in its place
        frame = json.dumps({"output_type": output_type, "data": {
            "text/plain": f"[display data that is not JSON: {type(exc).__name__}]"}, "metadata": {}}).encode()
    if _sent + len(frame) > limit:
        # Over the job's output limit: a note in its place, so the model knows something was shown.
        kinds = ", ".join(sorted(data)) if isinstance(data, dict) else "?"
        frame = json.dumps({"output_type": output_type, "data": {
            "text/plain": f"[display output of {len(frame)} bytes ({kinds}) left out: over the output limit]"},
            "metadata": {}}).encode()
    _sent += len(frame)
    _flush()  # what was printed before it reaches the pool before it
    if len(_counters) == 2:  # where it falls in the text, for a streaming job (see counted_streams)
        frame = frame[:-1] + b', "at": [%d, %d]}' % (_counters[0].written, _counters[1].written)
    _send(_HEADER.pack(len(frame)) + frame)


def _send(data: bytes) -> None:
    with _lock:
        if _channel is None:
            return  # a fork's copy before its first step: no step to show it in
        interrupts.hold()
        try:
            rest = memoryview(data)
            while rest:
                rest = rest[os.write(_channel, rest):]
        except OSError:
            pass  # the pool is not reading (the step is over): nothing to show it to
        finally:
            pending = interrupts.release()
    if pending:
        raise KeyboardInterrupt  # the step's interrupt, which came while the frame was written


def forked() -> None:
    """In a session fork's copy: no thread of the original's runs here, so none holds the lock or a frame."""
    global _channel, _lock
    _lock, _channel = _thread.allocate_lock(), None
    interrupts.release()


def after_frames(to: int, write: Callable[..., None], *args: Any) -> None:
    """A session step's code is over: ``write(to, *args)`` (its report, after its mark, on the session's report
    pipe ``to``) runs once the frame being written is whole, and no frame comes between; from then on frames go
    to ``to``, where the pool reads what a thread the step left running shows with the next step (job/execute.py)."""
    global _channel
    with _lock:
        try:
            write(to, *args)
        finally:
            _channel = to


class DisplayHandle:
    """What ``display(..., display_id=...)`` returns, as IPython's does, so that notebook code that keeps one
    (``handle.update(progress)``) runs. A result keeps every output in order and replaces none in place, so an
    update is shown as one more output."""

    def __init__(self, display_id: Any) -> None:
        self.display_id = display_id

    def __repr__(self) -> str:
        return f"<DisplayHandle display_id={self.display_id}>"

    def display(self, obj: Any, **kwargs: Any) -> None:
        display(obj, display_id=self.display_id, update=True, **kwargs)

    def update(self, obj: Any, **kwargs: Any) -> None:
        display(obj, display_id=self.display_id, update=True, **kwargs)


def display(*objs: Any, include: Any = None, exclude: Any = None, metadata: dict[str, Any] | None = None,
            transient: Any = None, display_id: Any = None, raw: bool = False, clear: bool = False,
            **kwargs: Any) -> DisplayHandle | None:
    """Show each object as a notebook does, in order: its MIME bundle becomes a ``display_data`` output.
    ``raw=True``: each object is a bundle already (a dict of MIME type to data). Where the code runs an
    IPython shell of its own (a kernel inside the session), IPython's display publishes through it. With a
    ``display_id`` (``True`` for a new one), a :class:`DisplayHandle`, as IPython returns."""
    if _ipython_display is not None and _shell_running():
        return _ipython_display(*objs, include=include, exclude=exclude, metadata=metadata,  # type: ignore[no-any-return]
                                transient=transient, display_id=display_id, raw=raw, clear=clear, **kwargs)
    for obj in objs:
        if raw:
            if isinstance(obj, dict):
                publish(obj, metadata)
            continue
        data, meta = bundle(obj, include=include, exclude=exclude)
        if data:  # empty: the object displayed itself (_ipython_display_)
            publish(data, {**meta, **(metadata or {})})
    if display_id is None or kwargs.get("update"):
        return None
    return DisplayHandle(os.urandom(8).hex() if display_id is True else display_id)


def result(value: Any) -> None:
    """A cell's trailing value, as its ``execute_result`` (the pool adds the execution count)."""
    data, meta = bundle(value)
    if data:
        publish(data, meta, output_type="execute_result")


def bundle(obj: Any, *, include: Any = None, exclude: Any = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """``obj``'s MIME bundle and metadata, by IPython's rules, its values JSON (binary data as base64)."""
    formatter = _ipython_formatter(obj)
    if formatter is not None:
        try:
            data, meta = formatter.format(obj, include=include, exclude=exclude)
        except Exception:
            data, meta = _fallback(obj)
    else:
        data, meta = _fallback(obj)
    data = {mime: _jsonable(mime, value) for mime, value in data.items()}
    if _is_figure(obj) and "image/png" not in data:
        png = _figure_png(obj)  # as the inline backend registers for figures
        if png is not None:
            data["image/png"] = png
    if data and "text/plain" not in data:
        data["text/plain"] = _plain(obj)
    return data, dict(meta)


def prepare() -> None:
    """In the template, after the operator's preloads: where they include IPython's formatters, build the
    formatter now, so that every job shares it (copy-on-write) instead of building its own (traitlets make
    that some milliseconds). It holds no job's data: it is built before any job exists."""
    global _formatter
    if "IPython.core.formatters" in sys.modules and _formatter is None:
        try:
            from IPython.core.formatters import DisplayFormatter

            _formatter = DisplayFormatter()
        except Exception:  # the job builds its own, or uses the fallback
            _formatter = None


def _ipython_formatter(obj: Any) -> Any:
    """IPython's DisplayFormatter when IPython's formatters are here already (preloaded, or imported by the
    code); otherwise the fallback, which follows the same rules: importing IPython would cost the job that
    displays about 0.1 s (0.24 s on a loaded machine; see docs/python-api.md), a preloaded one nothing."""
    global _formatter
    if _formatter is not None:
        return _formatter or None
    if "IPython.core.formatters" not in sys.modules:
        return None
    try:
        from IPython.core.formatters import DisplayFormatter

        _formatter = DisplayFormatter()
    except Exception:  # not installed, or broken in this environment: the fallback follows the same rules
        _formatter = False  # looked for once per process
    return _formatter or None


def _fallback(obj: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """IPython's rules without IPython: ``_repr_mimebundle_`` first, then each ``_repr_*_`` it lacks; a
    method that returns None shows nothing, one that raises is skipped."""
    data: dict[str, Any] = {}
    meta: dict[str, Any] = {}
    method = _method(obj, "_repr_mimebundle_")
    if method is not None:
        try:
            found = method(include=None, exclude=None)
        except Exception:
            found = None
        if isinstance(found, tuple) and len(found) == 2:
            found, extra = found
            if isinstance(extra, dict):
                meta.update(extra)
        if isinstance(found, dict):
            data.update(found)
    for name, mime in _REPR_METHODS:
        if mime in data:
            continue
        method = _method(obj, name)
        if method is None:
            continue
        try:
            value = method()
        except Exception:
            continue
        if isinstance(value, tuple) and len(value) == 2:
            value, extra = value
            if isinstance(extra, dict):
                meta[mime] = extra
        if value is not None:
            data[mime] = value
    data.setdefault("text/plain", _plain(obj))
    return data, meta


def _method(obj: Any, name: str) -> Any:
    """``obj``'s method ``name`` (not a class's), or None: one whose lookup raises is none, as IPython's formatter
    takes it (the object's own ``__getattr__`` may raise anything)."""
    try:
        method = getattr(obj, name, None)
        return method if callable(method) and not isinstance(obj, type) else None
    except Exception:
        return None


def _jsonable(mime: str, value: Any) -> Any:
    if isinstance(value, bytes | bytearray | memoryview):
        raw = bytes(value)
        if mime in _BINARY or (mime.startswith("image/") and mime != "image/svg+xml"):
            return base64.b64encode(raw).decode("ascii")
        return raw.decode("utf-8", "replace")
    if isinstance(value, list) and mime.startswith("text/") and all(isinstance(v, str) for v in value):
        return "".join(value)  # nbformat's multiline strings
    return value


def _plain(obj: Any) -> str:
    try:
        text = repr(obj)
    except Exception as exc:
        text = f"<{type(obj).__name__} object: repr() raised {type(exc).__name__}>"
    return text if len(text) <= _MAX_PLAIN else text[:_MAX_PLAIN] + f"... ({len(text) - _MAX_PLAIN} more characters)"


def _is_figure(obj: Any) -> bool:
    kind = type(obj)
    try:
        return kind.__module__ == "matplotlib.figure" and kind.__name__ == "Figure"
    except Exception:  # a metaclass of the code's own may make either raise: no figure of matplotlib's
        return False


def _figure_png(figure: Any) -> str | None:
    try:
        buffer = io.BytesIO()
        figure.savefig(buffer, format="png")
    except Exception:
        return None
    return base64.b64encode(buffer.getvalue()).decode("ascii")


class _Counted(io.RawIOBase):
    """A descriptor that counts what is written to it."""

    def __init__(self, fd: int) -> None:
        super().__init__()
        self.fd, self.written = fd, 0

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self.fd

    def write(self, data: Any) -> int:
        written = os.write(self.fd, data)
        self.written += written
        return written


_counters: list[_Counted] = []


def counted_streams() -> None:
    """A streaming job's stdout and stderr count the bytes they write, so each display frame carries where it
    falls in them (``at``): the pool reads three pipes, and a fast job's text written after a display output
    may arrive in one read with the text before it. Only in a streaming job (a session's first streaming
    step on): the others pay nothing."""
    if _counters:
        return
    for fd, name in ((1, "stdout"), (2, "stderr")):
        old = getattr(sys, name)
        counter = _Counted(fd)
        try:
            old.flush()
            new = io.TextIOWrapper(io.BufferedWriter(counter), encoding=old.encoding, errors=old.errors,
                                   line_buffering=True)
        except BaseException:  # the job replaced or closed it (with a stream of its own, raising anything)
            return
        setattr(sys, name, new)
        setattr(sys, f"__{name}__", new)
        _counters.append(counter)


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except Exception:  # the job may have closed or replaced its streams
            pass


# -- the notebook's display classes (IPython.display's, where IPython is not installed) --------------------
class DisplayObject:
    """Data shown by its ``_repr_*_`` method: given inline, or read from ``filename`` (in the job)."""

    def __init__(self, data: Any = None, url: str | None = None, filename: str | None = None,
                 metadata: dict[str, Any] | None = None) -> None:
        if filename is not None and data is None:
            with open(filename, "rb") as file:
                data = file.read()
        self.data, self.url, self.filename, self.metadata = data, url, filename, metadata

    def _text(self) -> str:
        return self.data.decode("utf-8", "replace") if isinstance(self.data, bytes) else str(self.data or "")


class HTML(DisplayObject):
    def _repr_html_(self) -> str:
        return self._text()


class Markdown(DisplayObject):
    def _repr_markdown_(self) -> str:
        return self._text()


class Latex(DisplayObject):
    def _repr_latex_(self) -> str:
        return self._text()


class SVG(DisplayObject):
    def _repr_svg_(self) -> str:
        return self._text()


class JSON(DisplayObject):
    def _repr_json_(self) -> Any:
        if isinstance(self.data, str | bytes):
            return json.loads(self.data)
        return self.data


class Image(DisplayObject):
    """A PNG or JPEG image, from bytes or a file; ``format`` as IPython names it ("png", "jpeg")."""

    def __init__(self, data: Any = None, url: str | None = None, filename: str | None = None,
                 format: str | None = None, metadata: dict[str, Any] | None = None, **kwargs: Any) -> None:
        if isinstance(data, str) and data and os.path.exists(data):
            data, filename = None, data
        super().__init__(data, url, filename, metadata)
        if format is None:
            name = (filename or "").lower()
            format = "jpeg" if name.endswith((".jpg", ".jpeg")) or bytes(self.data or b"")[:2] == b"\xff\xd8" \
                else "png"
        self.format = "jpeg" if format == "jpg" else format

    def _repr_png_(self) -> bytes | None:
        return self.data if self.format == "png" else None

    def _repr_jpeg_(self) -> bytes | None:
        return self.data if self.format == "jpeg" else None


# -- IPython's own display, where IPython is installed ------------------------------------------------------
_DISPLAY_MODULE = "IPython.core.display_functions"


def hook_ipython() -> None:
    """Make ``IPython.display.display`` this ``display``: IPython's own prints the objects when no kernel
    runs. Done now if IPython's display is imported already (preloaded), else when the code imports it."""
    module = sys.modules.get(_DISPLAY_MODULE)
    if module is not None:
        _patch(module)
        return
    if not any(isinstance(finder, _IPythonDisplayFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _IPythonDisplayFinder())


# IPython's own display(), kept when it is replaced (see _patch).
_ipython_display: Any = None


def _shell_running() -> bool:
    shell = sys.modules.get("IPython.core.interactiveshell")
    try:
        return shell is not None and bool(shell.InteractiveShell.initialized())
    except Exception:
        return False


def _patch(module: Any) -> None:
    global _ipython_display
    if module.display is not display:
        _ipython_display = module.display
    module.display = display
    for name in ("IPython.display", "IPython.core.display"):
        other: Any = sys.modules.get(name)
        if other is not None and hasattr(other, "display"):
            other.display = display


class _IPythonDisplayFinder:
    """Finds nothing itself: once IPython's display module is loaded, its ``display`` is replaced, before
    any ``from IPython.display import display`` can take the original."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != _DISPLAY_MODULE:
            return None
        from importlib.machinery import PathFinder

        spec = PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        loader: Any = spec.loader
        original = loader.exec_module

        def exec_module(module: Any) -> None:
            original(module)
            _patch(module)

        loader.exec_module = exec_module
        return spec


# Named as the model imports them (their text/plain says pynox_display.HTML, as IPython's says its own).
for _kind in (DisplayObject, HTML, Markdown, Latex, SVG, JSON, Image):
    _kind.__module__ = "pynox_display"
