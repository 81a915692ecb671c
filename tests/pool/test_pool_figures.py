"""Figures: matplotlib imports in a job, and what it draws comes back as real PNGs of matplotlib's own size.

Before this, ``import matplotlib.pyplot`` failed in every job (no writable config directory). The
config directory the pool prepares is readable by jobs and writable by none: a job that tries to
poison the font cache for the next one is refused, checked from the host.
"""

from __future__ import annotations

import base64
import os
import struct

import pytest

from pynox import Pool

from .pool_driver import PoolProcess

pytestmark = pytest.mark.timeout(120)

matplotlib = pytest.importorskip("matplotlib")  # a test dependency (requirements.txt)

_PNG = b"\x89PNG\r\n\x1a\n"


def _size(png: bytes) -> tuple[int, int]:
    assert png.startswith(_PNG), png[:16]
    width, height = struct.unpack(">II", png[16:24])  # the IHDR chunk comes first
    return width, height


def test_a_figure_left_open_comes_back_at_matplotlibs_size(pool: PoolProcess) -> None:
    code = ("import matplotlib.pyplot as plt\nfig, ax = plt.subplots(figsize=(4, 3), dpi=100)\n"
            "ax.plot([1, 2, 3], [2, 1, 3])\nprint('drawn')")
    result = pool.run(code, timeout="60s")
    assert result["exit"] == 0 and result["stdout"] == "drawn\n", result
    [image] = result["images"]
    assert _size(base64.b64decode(image)) == (400, 300)


def test_shown_figures_come_back_in_order_and_are_closed(pool: PoolProcess) -> None:
    code = ("import matplotlib.pyplot as plt\nplt.figure(figsize=(2, 2), dpi=50)\nplt.plot([1])\nplt.show()\n"
            "print(plt.get_fignums())\nplt.figure(figsize=(3, 2), dpi=50)\nplt.bar([1], [2])")
    result = pool.run(code, timeout="60s")
    assert result["stdout"] == "[]\n", "show() keeps the figure and closes it, as a notebook does"
    assert [_size(base64.b64decode(i)) for i in result["images"]] == [(100, 100), (150, 100)]


def test_figures_over_the_output_limit_are_counted_not_sent(pool: PoolProcess) -> None:
    code = ("import matplotlib.pyplot as plt\nfor _ in range(12):\n    plt.figure(figsize=(8, 8))\n"
            "    plt.plot(range(500))")
    result = pool.run(code, timeout="60s", max_output="100k")
    sent = [base64.b64decode(i) for i in result["images"]]
    assert sent and sum(map(len, sent)) <= 100 * 1024
    assert result["images_dropped"] == 12 - len(sent)


_UNDRAWABLE = ("import matplotlib.pyplot as plt\nfrom matplotlib.figure import Figure\nclass Undrawable(Figure):\n"
               "    def savefig(self, *args, **kwargs):\n        raise KeyboardInterrupt\n"
               "plt.figure(FigureClass=Undrawable)\n")


@pytest.mark.parametrize(("end", "exit", "kind"), [("print('drawn')", 0, None),
                                                   ("raise ValueError('v')", 1, "ValueError")])
def test_a_figure_that_cannot_be_drawn_is_left_out(pool: PoolProcess, end: str, exit: int, kind: str | None) -> None:
    # The figure is the code's; whatever drawing it raises, the code's own result stands (it ended with 125, no error,
    # and Pynox's own frames on stderr).
    result = pool.run(_UNDRAWABLE + end, timeout="60s")
    assert (result["exit"], (result["error"] or {}).get("type")) == (exit, kind), result
    assert "images" not in result or result["images"] == [], result
    assert "pynox" not in result["stderr"], result["stderr"]


def test_a_job_without_figures_has_no_images_field(pool: PoolProcess) -> None:
    result = pool.run("print(1)")
    assert "images" not in result and "images_dropped" not in result


def test_the_font_cache_is_readable_and_not_writable(pool: PoolProcess) -> None:
    code = ("import os\nd = os.environ['MPLCONFIGDIR']\nprint(d)\nnames = sorted(os.listdir(d))\nprint(names)\n"
            "open(os.path.join(d, names[0]), 'a').write('poison')")
    result = pool.run(code)
    directory, listing = result["stdout"].splitlines()
    assert result["error"]["type"] == "PermissionError", result
    fontlist = os.path.join(directory, eval(listing)[0])
    with open(fontlist, encoding="utf-8") as handle:
        assert "poison" not in handle.read()


def test_the_python_api_gives_bytes_and_the_text_a_note() -> None:
    with Pool(workers=1) as pool:
        result = pool.run("import matplotlib.pyplot as plt\nplt.plot([1, 2])\nplt.show()\nplt.plot([2, 1])",
                          timeout="60s")
    assert len(result.images) == 2 and all(image.startswith(_PNG) for image in result.images)
    assert result.text.startswith("Out: [<matplotlib.lines.Line2D") and "[2 images]" in result.text


def test_the_font_cache_is_kept_per_installed_matplotlib_never_under_an_unknown_version() -> None:
    import importlib.metadata

    from pynox.server.figures import matplotlib_setup

    setup = matplotlib_setup()
    assert setup is not None
    env, directory = setup
    name = os.path.basename(env["MPLCONFIGDIR"])
    assert env["MPLCONFIGDIR"] == directory
    assert name.startswith(f"matplotlib-{importlib.metadata.version('matplotlib')}-"), name
    assert any(entry.startswith("fontlist-") for entry in os.listdir(directory))
