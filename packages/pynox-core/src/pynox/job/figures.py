"""Figures, the job's half: matplotlib's backend in a job (``MPLBACKEND``).

Agg, with a ``show()`` that keeps each open figure as a PNG and closes it, as a
notebook's inline backend does. What is still open when the code ends is kept
too (:func:`collect`). Only the job's own code is drawn: nothing here reads or
writes a file. What it reports is checked by the pool (:mod:`pynox.server.figures`).
"""

from __future__ import annotations

import base64
import io
import sys
from typing import Any

from . import display

# FigureCanvas and FigureManager too, built when matplotlib asks for them (see __getattr__).
__all__ = ["collect", "show"]

# The figures shown so far in this job, as PNG bytes (in the job's process only).
_shown: list[bytes] = []


def __getattr__(name: str) -> Any:
    # Loaded by matplotlib itself, once the job imports pyplot: only then is matplotlib there to build on.
    if name in ("FigureCanvas", "FigureManager"):
        from matplotlib.backend_bases import FigureManagerBase
        from matplotlib.backends.backend_agg import FigureCanvasAgg

        class FigureManager(FigureManagerBase):
            @classmethod
            def pyplot_show(cls, *, block: bool | None = None) -> None:
                show()

        globals().update(FigureCanvas=FigureCanvasAgg, FigureManager=FigureManager)
        return globals()[name]
    raise AttributeError(name)


def show(*args: Any, **kwargs: Any) -> None:
    """``plt.show()``: keep every open figure as a PNG, then close it (the next figure starts afresh). Each
    is a display output too, where it was shown, as the inline backend makes it."""
    _shown.extend(_open_figures(close=True))


def _open_figures(*, close: bool) -> list[bytes]:
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is None:
        return []
    images = []
    for number in pyplot.get_fignums():
        figure = pyplot.figure(number)
        buffer = io.BytesIO()
        figure.savefig(buffer, format="png")
        images.append(buffer.getvalue())
        display.publish({"image/png": base64.b64encode(images[-1]).decode("ascii"), "text/plain": repr(figure)})
    if close:
        pyplot.close("all")
    return images


def collect(limit: int) -> list[str]:
    """At the end of the code (or a session step): the figures shown, then those left open, as base64 PNGs,
    at most ``limit`` bytes in all (the rest dropped: the pool says how many). Open figures are closed, so a
    session's next step starts with none."""
    images = [*_shown, *_open_figures(close=True)]
    _shown.clear()
    kept, total = [], 0
    for image in images:
        if total + len(image) > limit:
            kept.append("")  # counted as dropped by the pool (not a PNG)
            continue
        total += len(image)
        kept.append(base64.b64encode(image).decode("ascii"))
    return kept
